"""Gradual magnitude-pruning schedule (Zhu & Gupta 2017), the cubic PolynomialDecay of tfmot, and the learning-rate rewind that suits it."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from pactrain_hvd.core.numeric import plain_number


@dataclass(frozen=True)
class PolynomialSchedule:
    """Target sparsity s_t = s_f + (s_i - s_f) * (1 - (t - t0) / (t1 - t0)) ** power.

    Masks are recomputed at ``begin_step``, every ``frequency`` steps after it, and at
    ``end_step``; after ``end_step`` they are frozen. ``begin_step == end_step`` prunes once.
    """

    final_sparsity: float
    begin_step: int = 0
    end_step: int = 1000
    frequency: int = 100
    initial_sparsity: float = 0.0
    power: int = 3

    def __post_init__(self) -> None:
        for name in ("initial_sparsity", "final_sparsity"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {value!r}")
        for name in ("begin_step", "end_step", "frequency", "power"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if self.begin_step < 0:
            raise ValueError(f"begin_step must be >= 0, got {self.begin_step}")
        if self.end_step < self.begin_step:
            raise ValueError(f"end_step ({self.end_step}) must be >= begin_step ({self.begin_step})")
        if self.frequency <= 0:
            raise ValueError(f"frequency must be > 0, got {self.frequency}")
        if self.power < 1:
            raise ValueError(f"power must be >= 1, got {self.power}")

    def target(self, step: int) -> float:
        """Sparsity the masks should have after the update at ``step``."""
        if step >= self.end_step:
            return self.final_sparsity
        if step <= self.begin_step:
            return self.initial_sparsity
        progress = (step - self.begin_step) / (self.end_step - self.begin_step)
        return self.final_sparsity + (self.initial_sparsity - self.final_sparsity) * (1.0 - progress) ** self.power

    def is_update_step(self, step: int) -> bool:
        """True where masks are recomputed; never after ``end_step`` or for zero sparsity."""
        if self.final_sparsity == 0.0 or not self.begin_step <= step <= self.end_step:
            return False
        return step == self.end_step or (step - self.begin_step) % self.frequency == 0

    def last_update_at_or_before(self, step: int) -> int | None:
        """The most recent update step <= ``step`` (None before ``begin_step``)."""
        if self.final_sparsity == 0.0 or step < self.begin_step:
            return None
        if step >= self.end_step:
            return self.end_step
        return self.begin_step + (step - self.begin_step) // self.frequency * self.frequency

    def next_update_after(self, step: int) -> int | None:
        """The first update step > ``step`` (None: masks are final)."""
        candidates = [self.begin_step, self.end_step]
        last = self.last_update_at_or_before(step)
        if last is not None:
            candidates.append(last + self.frequency)
        return min((c for c in candidates if c > step and self.is_update_step(c)), default=None)


# Without ``total_steps`` the clock is fixed, whatever the run's length (tfmot's PolynomialDecay asks the same).
FIXED_CLOCK = (0, 1000, 100)
# With ``total_steps``: prune from 10 % to 60 % of the run in ten mask updates, leaving 40 % to recover
# (reports/accuracy: the sparse network needs the steps after the last mask change).
RUN_WINDOW = (0.1, 0.6)
RUN_MASK_UPDATES = 10


def schedule_steps(total_steps: int | None = None, begin_step: int | None = None, end_step: int | None = None,
                   frequency: int | None = None) -> tuple[int, int, int]:
    """``(begin_step, end_step, frequency)``: each one given, else taken from the run's length.

    ``total_steps=N`` is the one-line way to say "prune over my N steps": begin at 10 % of them,
    end at 60 %, ten mask updates in between. Without it the fixed clock (0, 1000, 100) applies.
    """
    given = {"begin_step": plain_number(begin_step), "end_step": plain_number(end_step),
             "frequency": plain_number(frequency)}
    total_steps = plain_number(total_steps)
    for name, value in given.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if total_steps is None:
        defaults = FIXED_CLOCK
    elif isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps <= 0:
        raise ValueError(f"total_steps must be a positive int (the run's optimizer steps), got {total_steps!r}")
    else:
        begin = int(total_steps * RUN_WINDOW[0]) if begin_step is None else begin_step
        end = max(begin, int(total_steps * RUN_WINDOW[1])) if end_step is None else end_step
        defaults = (begin, end, max(1, (end - begin) // RUN_MASK_UPDATES))
    return tuple(default if value is None else value for default, value in zip(defaults, given.values()))


def rewound_cosine(schedule: PolynomialSchedule, total_steps: int) -> Callable[[int], float]:
    """Learning-rate factor per step: cosine to 0 over ``total_steps``, rewound at the last mask change.

    Until ``schedule.end_step`` it is plain cosine; from there a second cosine runs from the factor the
    run had at ``schedule.begin_step`` down to 0 at ``total_steps``, so the pruned network trains again at
    a high rate (learning-rate rewinding, Renda et al. 2020, fitted into the same steps). With nothing to
    prune, or no step left after the last mask change, it is plain cosine. A plain function of the step
    (framework-free): torch's ``LambdaLR`` takes it as it is.
    """
    if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps <= 0:
        raise ValueError(f"total_steps must be a positive int (the run's optimizer steps), got {total_steps!r}")
    first, last = schedule.begin_step, schedule.end_step
    rewinds = schedule.final_sparsity > 0 and last < total_steps

    def cosine(fraction: float) -> float:
        return 0.5 * (1 + math.cos(math.pi * min(1.0, fraction)))

    def factor(step: int) -> float:
        if not rewinds or step < last:
            return cosine(step / total_steps)
        return cosine(first / total_steps) * cosine((step - last) / (total_steps - last))

    return factor
