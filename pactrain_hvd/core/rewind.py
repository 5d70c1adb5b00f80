"""Learning-rate rewinding fitted to a pruning schedule: the pruned network trains again at a high rate."""

from __future__ import annotations

import math
from collections.abc import Callable

from pactrain_hvd.core.schedule import Schedule


def rewound_cosine(schedule: Schedule, total_steps: int) -> Callable[[int], float]:
    """Learning-rate factor per step: cosine to 0 over ``total_steps``, rewound at the last mask change.

    Until ``schedule.end_step`` it is plain cosine; from there a second cosine runs from the factor the
    run had at ``schedule.begin_step`` down to 0 at ``total_steps``, so the pruned network trains again at
    a high rate (learning-rate rewinding, Renda et al. 2020, fitted into the same steps). With nothing to
    prune, or no step left after the last mask change, it is plain cosine.

    Args:
        schedule: the pruning schedule, any schedule object (its ``begin_step``, ``end_step`` and final sparsity are
            read).
        total_steps: the run's optimizer steps (a positive int).

    Returns:
        A plain function ``step -> factor`` in [0, 1] (framework-free): torch's ``LambdaLR`` takes it as it is.

    Raises:
        ValueError: ``total_steps`` is not a positive int.
    """
    if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps <= 0:
        raise ValueError(f"total_steps must be a positive int (the run's optimizer steps), got {total_steps!r}")
    curve = schedule.polynomial()
    first, last = curve.begin_step, curve.end_step
    rewinds = curve.final_sparsity > 0 and last < total_steps

    def cosine(fraction: float) -> float:
        return 0.5 * (1 + math.cos(math.pi * min(1.0, fraction)))

    def factor(step: int) -> float:
        if not rewinds or step < last:
            return cosine(step / total_steps)
        return cosine(first / total_steps) * cosine((step - last) / (total_steps - last))

    return factor
