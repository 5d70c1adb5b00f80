"""Emulated links: network namespaces, ``tc`` shaping and link-rate probes."""
