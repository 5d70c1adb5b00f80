"""Rank 0's progress: a live bar on a terminal, whole plain lines in a captured log.

A redrawing bar (tqdm) is right on a terminal and wrong everywhere else: captured output (CI
logs, ``tee``, a scheduler's log file) keeps every carriage-return redraw, and ``horovodrun``,
which pipes each rank, prefixes every chunk it reads, so one epoch becomes hundreds of
``[0]<stderr>:epoch 1:  23%|██▎ ...`` fragments on one physical line. Off a terminal,
``Progress`` writes one whole line (in one write, flushed) at every ``every_percent`` of the
work and at least every ``every_seconds``. Under ``mpirun`` a rank's stdout is a pseudo-terminal
wherever mpirun's own output goes, so there it writes lines too. ``PACTRAIN_PROGRESS=bar`` or
``=lines`` overrides the choice.

Example::

    >>> bar = Progress(range(steps), desc="epoch 1", enabled=hvd.rank() == 0)
    >>> for step in bar:
    ...     bar.set_postfix(loss=f"{loss:.3f}")
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TextIO

PROGRESS_ENV = "PACTRAIN_PROGRESS"
# Set in every rank by OpenMPI's and MPICH's launchers, which give ranks a pty or a relay.
MPI_RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMI_RANK")


def wants_live_bar(stream: TextIO, environ: dict[str, str] | None = None) -> bool:
    """Whether ``stream`` reaches a person's terminal directly (see the module docstring)."""
    environ = os.environ if environ is None else environ
    choice = environ.get(PROGRESS_ENV, "").strip().lower()
    if choice in ("bar", "lines"):
        return choice == "bar"
    if choice:
        raise ValueError(f"{PROGRESS_ENV} must be 'bar' or 'lines', got {environ[PROGRESS_ENV]!r}")
    if any(name in environ for name in MPI_RANK_VARIABLES):
        return False
    return hasattr(stream, "isatty") and stream.isatty()


def progress_line(desc: str, done: int, total: int | None, elapsed_s: float, unit: str,
                  postfix: dict[str, Any]) -> str:
    """``epoch 1:  50% 46/93 steps, 6 s, 7.7 steps/s, loss=0.512`` (``41.5 s/job`` when slower than 1/s)."""
    if done == 0 or elapsed_s <= 0:
        rate = f"- {unit}s/s"
    elif done >= elapsed_s:
        rate = f"{done / elapsed_s:.1f} {unit}s/s"
    else:
        rate = f"{elapsed_s / done:.1f} s/{unit}"
    count = f"{100 * done / total:3.0f}% {done}/{total} {unit}s" if total else f"{done} {unit}s"
    extras = "".join(f", {key}={value}" for key, value in postfix.items())
    return f"{desc + ': ' if desc else ''}{count}, {elapsed_s:.0f} s, {rate}{extras}"


class Progress:
    """Progress of one loop, shown on rank 0 only (``enabled=False`` prints nothing).

    Iterate over it like tqdm, or call ``update``. ``live`` (default: ``wants_live_bar(stream)``)
    picks the bar; ``write`` prints a message line without breaking it.
    """

    def __init__(self, iterable: Iterable | None = None, desc: str = "", total: int | None = None, *,
                 enabled: bool = True, unit: str = "step", stream: TextIO | None = None, live: bool | None = None,
                 every_percent: float = 25.0, every_seconds: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not 0 < every_percent <= 100:
            raise ValueError(f"every_percent must be in (0, 100], got {every_percent}")
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)
        self.iterable, self.desc, self.total, self.unit = iterable, desc, total, unit
        self.enabled, self.every_percent, self.every_seconds, self.clock = enabled, every_percent, every_seconds, clock
        self.stream = stream if stream is not None else sys.stdout
        self.done, self.postfix = 0, {}
        self.started = self.last_line_at = clock()
        self.last_line_done, self.last_mark = 0, 0
        self.bar = self._live_bar() if enabled and (wants_live_bar(self.stream) if live is None else live) else None

    def _live_bar(self):
        try:
            from tqdm import tqdm
        except ImportError:  # tqdm is optional: lines then
            return None
        return tqdm(total=self.total, desc=self.desc, unit=self.unit, file=self.stream, leave=False,
                    dynamic_ncols=True, mininterval=0.5)

    def __iter__(self) -> Iterator:
        if self.iterable is None:
            raise TypeError("Progress was made without an iterable: call update() instead")
        try:
            for item in self.iterable:
                yield item
                self.update()
        finally:
            self.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def set_postfix(self, **values: Any) -> None:
        """Figures shown after the count (``loss=0.512``), as given; kept until replaced."""
        self.postfix = values
        if self.bar is not None:
            self.bar.set_postfix(values, refresh=False)

    def update(self, n: int = 1) -> None:
        self.done += n
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(n)
            return
        mark = math.floor(100 * self.done / self.total / self.every_percent + 1e-9) if self.total else 0
        if mark > self.last_mark or self.clock() - self.last_line_at >= self.every_seconds:
            self.last_mark = max(mark, self.last_mark)
            self._line()

    def write(self, message: str) -> None:
        """One line of text (rank 0 only), above the bar if there is one."""
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(message, file=self.stream)
        else:
            self.stream.write(message + "\n")
            self.stream.flush()

    def _line(self) -> None:
        now = self.clock()
        self.last_line_at, self.last_line_done = now, self.done
        self.write(progress_line(self.desc, self.done, self.total, now - self.started, self.unit, self.postfix))

    def close(self) -> None:
        """Remove the bar, or write the last line if the loop stopped between marks."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        elif self.enabled and self.done != self.last_line_done:
            self._line()
        self.enabled = False
