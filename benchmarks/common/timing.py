"""Where a step's time goes: compression code runs inside backward hooks and inside ``synchronize``,
so it is timed where it runs (``PhaseClock``) and subtracted from the phase that contains it."""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass


class PhaseClock:
    """Seconds spent in compression code since the last ``take()``.

    Example::

        >>> clock = PhaseClock()
        >>> with clock.measure():
        ...     values = grad.flatten().index_select(0, surviving_indices)
        >>> compress_s = clock.take()
    """

    def __init__(self) -> None:
        self.seconds = 0.0

    @contextmanager
    def measure(self) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds += time.perf_counter() - start

    def wrap(self, function: Callable) -> Callable:
        @functools.wraps(function)
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        return timed

    def take(self) -> float:
        seconds, self.seconds = self.seconds, 0.0
        return seconds


def instrument(cls: type, method_names: tuple[str, ...], clock: PhaseClock) -> Callable[[], None]:
    """Time ``cls``'s methods with ``clock`` (in this process); returns the function that undoes it.

    Used on classes we do not own (Horovod's fp16 compressor, PacTrain's packing compressor)
    so that the product code stays untouched; static methods stay static.
    """
    originals = {name: inspect.getattr_static(cls, name) for name in method_names}
    for name, original in originals.items():
        if isinstance(original, staticmethod):
            setattr(cls, name, staticmethod(clock.wrap(original.__func__)))
        else:
            setattr(cls, name, clock.wrap(original))

    def restore() -> None:
        for name, original in originals.items():
            setattr(cls, name, original)

    return restore


@dataclass
class StepTimes:
    """One step, in seconds: the phases add up to ``total``."""

    total: float
    compute: float
    compress: float
    comm_wait: float
    update: float

    @classmethod
    def from_marks(cls, start: float, backward_done: float, synchronized: float, updated: float,
                   compress_in_backward: float, compress_in_synchronize: float) -> StepTimes:
        """``compute`` = forward + backward less the compression run by gradient hooks;
        ``comm_wait`` = ``synchronize`` less the (de)compression it runs."""
        return cls(total=updated - start,
                   compute=backward_done - start - compress_in_backward,
                   compress=compress_in_backward + compress_in_synchronize,
                   comm_wait=synchronized - backward_done - compress_in_synchronize,
                   update=updated - synchronized)
