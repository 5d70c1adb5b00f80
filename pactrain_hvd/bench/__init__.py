"""Benchmarks and baselines, kept apart from the product."""
