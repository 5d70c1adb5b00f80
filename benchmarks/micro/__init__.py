"""Micro-benchmarks on one machine: packing, mask verification, the optimizer update, the step profile."""
