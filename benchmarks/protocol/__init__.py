"""Preregistered time-to-accuracy protocols: their files, runs, verdicts and report (``python -m benchmarks protocol``)."""
