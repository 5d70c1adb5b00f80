"""Pruning schedules: gradual magnitude pruning (Zhu & Gupta 2017; the cubic PolynomialDecay of tfmot), sparse from
the first step (``ConstantSparsity``, ``short_ramp``), and the schedule a façade's keywords describe."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from pactrain_hvd.core.numeric import plain_number


@dataclass(frozen=True)
class PolynomialSchedule:
    """Target sparsity s_t = s_f + (s_i - s_f) * (1 - (t - t0) / (t1 - t0)) ** power.

    Masks are recomputed at ``begin_step``, every ``frequency`` steps after it, and at
    ``end_step``; after ``end_step`` they are frozen. ``begin_step == end_step`` prunes once.

    Attributes:
        final_sparsity: s_f, the sparsity from ``end_step`` on, in [0, 1); 0 never prunes.
        begin_step: t0, the first mask update (>= 0).
        end_step: t1, the last mask update (>= ``begin_step``).
        frequency: steps between mask updates (> 0).
        initial_sparsity: s_i, the sparsity at ``begin_step``, in [0, 1).
        power: the ramp's exponent (>= 1; 3 is cubic).
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

    def polynomial(self) -> PolynomialSchedule:
        """This schedule (every schedule object answers ``polynomial()``)."""
        return self


class _Answered:
    """A schedule object's questions (``target``, ``is_update_step``, ...) answered by its ``polynomial()``,
    so that a config keeps the object it was given (as tfmot keeps its schedules) and still asks it."""

    @functools.cached_property  # the object is frozen: its curve is built once
    def _curve(self) -> PolynomialSchedule:
        return self.polynomial()

    def target(self, step: int) -> float:
        """Sparsity the masks should have after the update at ``step`` (``PolynomialSchedule.target``)."""
        return self._curve.target(step)

    def is_update_step(self, step: int) -> bool:
        """True where masks are recomputed (``PolynomialSchedule.is_update_step``)."""
        return self._curve.is_update_step(step)

    def last_update_at_or_before(self, step: int) -> int | None:
        """The most recent update step <= ``step`` (``PolynomialSchedule.last_update_at_or_before``)."""
        return self._curve.last_update_at_or_before(step)

    def next_update_after(self, step: int) -> int | None:
        """The first update step > ``step`` (``PolynomialSchedule.next_update_after``)."""
        return self._curve.next_update_after(step)


@dataclass(frozen=True)
class ConstantSparsity(_Answered):
    """Sparse from the first step: masks at ``sparsity`` from ``begin_step`` on (tfmot's ``ConstantSparsity``).

    With the default ``begin_step=0`` the masks are ranked before step 0's first all-reduce, from the
    weights every rank holds by then (after the usual broadcast from the root), so no step sends a
    prunable tensor dense. For a freshly initialised model, magnitude at initialisation with ``ranking="erk"``
    shares is random pruning at Erdős-Rényi-Kernel densities; for a pretrained one it keeps the largest
    weights.

    Attributes:
        sparsity: fraction of coordinates to prune, in [0, 1).
        begin_step: the step the masks are first ranked at.
        end_step: re-rank at the same sparsity every ``frequency`` steps up to this step; None (the default)
            is ``begin_step``: rank once and keep the masks.
        frequency: steps between re-rankings up to ``end_step``.

    Example::

        >>> opt = pt.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
        ...                               schedule=ConstantSparsity(0.95), packed_values="ternary")
    """

    sparsity: float
    begin_step: int = 0
    end_step: int | None = None
    frequency: int = 100

    def __post_init__(self) -> None:
        self.polynomial()  # validates

    def polynomial(self) -> PolynomialSchedule:
        """The same schedule as a ``PolynomialSchedule`` (initial and final sparsity equal)."""
        end = self.begin_step if self.end_step is None else self.end_step
        sparsity = _fraction("sparsity", self.sparsity)
        return PolynomialSchedule(final_sparsity=sparsity, begin_step=self.begin_step, end_step=end,
                                  frequency=self.frequency, initial_sparsity=sparsity)


@dataclass(frozen=True)
class PolynomialDecay(_Answered):
    """Gradual pruning, tfmot's ``PolynomialDecay``: from ``initial_sparsity`` at ``begin_step`` to
    ``final_sparsity`` at ``end_step``, masks re-ranked every ``frequency`` steps (and at ``end_step``).

    ``initial_sparsity > 0`` with ``begin_step=0`` packs from the first step: step 0's masks are ranked
    before its first all-reduce. With ``frequency=1`` every step of the ramp sends survivors at that
    step's density (``short_ramp`` builds one). ``initial_sparsity >= 1 - pack_max_density`` (0.25 with
    the default plan) packs every large prunable tensor from step 0.

    Attributes:
        initial_sparsity: sparsity of the masks ranked at ``begin_step``, in [0, 1).
        final_sparsity: sparsity from ``end_step`` on, in [0, 1).
        begin_step: the first mask update.
        end_step: the last mask update (>= ``begin_step``); the masks are frozen after it.
        power: the ramp's exponent (3: cubic, as in Zhu & Gupta 2017).
        frequency: steps between mask updates.

    Example::

        >>> schedule = PolynomialDecay(initial_sparsity=0.5, final_sparsity=0.95, begin_step=0, end_step=200,
        ...                            frequency=10)
    """

    initial_sparsity: float
    final_sparsity: float
    begin_step: int
    end_step: int
    power: int = 3
    frequency: int = 100

    def __post_init__(self) -> None:
        self.polynomial()  # validates

    def polynomial(self) -> PolynomialSchedule:
        """The same schedule as a ``PolynomialSchedule``."""
        return PolynomialSchedule(final_sparsity=_fraction("final_sparsity", self.final_sparsity),
                                  begin_step=self.begin_step, end_step=self.end_step, frequency=self.frequency,
                                  initial_sparsity=_fraction("initial_sparsity", self.initial_sparsity),
                                  power=self.power)


def short_ramp(final_sparsity: float, steps: int, initial_sparsity: float = 0.5, power: int = 3) -> PolynomialDecay:
    """A ramp packed from step 0, masks re-ranked at every step: every step sends survivors at its own density.

    Args:
        final_sparsity: sparsity at the end of the ramp and after it, in [0, 1).
        steps: the ramp's length in optimizer steps (an int >= 0).
        initial_sparsity: sparsity of step 0's masks, in [0, 1).
        power: the ramp's exponent (3: cubic).

    Returns:
        ``PolynomialDecay`` from ``initial_sparsity`` at step 0 to ``final_sparsity`` at ``steps``, ``frequency=1``.

    Raises:
        ValueError: ``steps`` is not an int >= 0, or a sparsity is outside [0, 1).
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(f"steps must be an int >= 0 (the ramp's length in optimizer steps), got {steps!r}")
    return PolynomialDecay(initial_sparsity=initial_sparsity, final_sparsity=final_sparsity, begin_step=0,
                           end_step=steps, power=power, frequency=1)


SCHEDULES = (ConstantSparsity, PolynomialDecay, PolynomialSchedule)
Schedule = ConstantSparsity | PolynomialDecay | PolynomialSchedule
DEFAULT_SPARSITY = 0.9  # the frontends' ``sparsity`` default


def _fraction(name: str, value: object) -> float:
    value = plain_number(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number in [0, 1), got {value!r}")
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {value!r}")
    return float(value)


def checked_schedule(schedule: Schedule, sparsity: float | None = None, **clock: int | None) -> Schedule:
    """A ``schedule=`` argument checked against the frontend's other schedule arguments, and returned as it is.
    ``clock``: the frontend's ``total_steps``, ``begin_step``, ``end_step`` and ``frequency`` arguments, which must
    be left unset beside a schedule object; ``sparsity`` must be left unset (None) or equal the schedule's final
    sparsity."""
    if not isinstance(schedule, SCHEDULES):
        raise TypeError("schedule must be pactrain_hvd.core.ConstantSparsity, PolynomialDecay or PolynomialSchedule, "
                        f"got {type(schedule).__name__}")
    given = sorted(name for name, value in clock.items() if value is not None)
    if given:
        raise ValueError(f"give schedule= or {'=, '.join(given)}=, not both: the schedule object holds its steps")
    final = schedule.polynomial().final_sparsity
    if sparsity is not None and sparsity != final:
        raise ValueError(f"sparsity={sparsity!r} contradicts schedule=, whose final sparsity is {final!r}: leave "
                         "sparsity out (with masks=, schedule= needs continue_pruning=True)")
    return schedule


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
