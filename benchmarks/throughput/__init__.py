"""The throughput benchmark: one worker per rank, step times and bytes per cell, the report."""
