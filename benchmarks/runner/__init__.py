"""Process supervision: starting and stopping jobs in namespaces, rendezvous, summaries, cleanup on signals."""
