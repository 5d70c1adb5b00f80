"""Cleanup on signals: SIGTERM and SIGHUP end the run as Ctrl-C does, through every ``finally`` (teardown)."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def cleanup_on_signals() -> Iterator[None]:
    """SIGTERM/SIGHUP become exceptions, so ``finally`` blocks (teardown) run; Ctrl-C already does."""
    def to_exit(signum, _frame):
        raise SystemExit(128 + signum)

    previous = {sig: signal.signal(sig, to_exit) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
