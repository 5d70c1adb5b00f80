"""Gradual magnitude-pruning schedule (Zhu & Gupta 2017), the cubic PolynomialDecay of tfmot."""

from __future__ import annotations

from dataclasses import dataclass


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
