"""Time to accuracy on emulated links: the runner, the worker and the report."""
