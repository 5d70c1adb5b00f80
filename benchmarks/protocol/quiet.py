"""Runs that shared the cores with other work, set aside so their clocks do not decide a verdict.

A run's workers keep about one core each busy, so a quiet run ends with load averages near the protocol's
worker count. A run whose 1- or 5-minute load average at its end exceeds the workers plus ``SPARE_LOAD``
ran beside something else: its accuracy stands (the arithmetic is deterministic) but its clocks do not.
``set_aside`` moves such final runs on a link from the record's ``runs`` into its ``set_aside`` list, each
with the reason; the verdicts read ``runs`` only, and the next ``run`` repeats what is missing. Nothing is
deleted. Loopback runs stay: only their final metric is read (the targets). Selection runs stay too: a
selection is made once, before the final runs.
"""

from __future__ import annotations

from benchmarks.protocol.spec import Protocol

SPARE_LOAD = 2.0  # runnable processes beyond the workers' own that a run may share the machine with


def crowded(protocol: Protocol, run: dict) -> str | None:
    """Why ``run`` did not have the cores to itself, or None where it did."""
    limit = protocol.workers + SPARE_LOAD
    one, five = run["load"][:2]
    if max(one, five) <= limit:
        return None
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min) at its end, above {limit:g}: it shared the cores"


def set_aside(protocol: Protocol, record: dict) -> list[dict]:
    """Move every crowded run of ``record`` into ``record["set_aside"]`` (in place); returns those moved."""
    def reason(run: dict) -> str | None:
        return crowded(protocol, run) if run["stage"] == "final" and run["cell"] in protocol.cells else None

    moved = [{"reason": why, "run": run} for run in record["runs"] if (why := reason(run))]
    record["runs"] = [run for run in record["runs"] if reason(run) is None]
    record.setdefault("set_aside", []).extend(moved)
    return moved
