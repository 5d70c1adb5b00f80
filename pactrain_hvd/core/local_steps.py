"""Local steps with an outer sync: DiLoCo's schedule on the shared mask.

With ``sync_every=H`` ranks step on their own gradients, communicating nothing, and every H steps
average their progress since the last sync (the *outer gradient*: anchor weights minus local weights)
and take one outer step from the anchor every rank holds: SGD with Nesterov momentum
(``outer_update``). Every rank then continues from the new anchor, so weights are identical right
after each sync and nowhere in between.

Pruned coordinates are zero in the anchor and in every rank's local weights, so the outer gradient
is zero there on every rank: the outer all-reduce carries only the survivors, packed as the plan
says, with no indices. Masks are ranked only at the first step of an interval, where every rank
holds the anchor's weights, so every rank ranks the same weights; a schedule update that falls
inside an interval is made at the next interval's first step (``ranks_at``).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any, TypeVar

import numpy as np

from pactrain_hvd.core.errors import CheckpointError
from pactrain_hvd.core.schedule import Schedule

T = TypeVar("T")


def check_local_steps(sync_every: Any, outer_lr: Any, outer_momentum: Any) -> None:
    """Refuse a bad ``sync_every`` (an int >= 1), ``outer_lr`` (a finite number > 0) or ``outer_momentum``
    (in [0, 1)), naming the argument."""
    if isinstance(sync_every, bool) or not isinstance(sync_every, numbers.Integral) or sync_every < 1:
        raise ValueError(f"sync_every must be an int >= 1 (1: synchronise every step), got {sync_every!r}")
    for name, value in (("outer_lr", outer_lr), ("outer_momentum", outer_momentum)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number, got {value!r}")
    if outer_lr <= 0:
        raise ValueError(f"outer_lr must be > 0 (1.0 with outer_momentum=0: plain model averaging), got {outer_lr!r}")
    if not 0 <= outer_momentum < 1:
        raise ValueError(f"outer_momentum must be in [0, 1), got {outer_momentum!r}")


def ranks_at(schedule: Schedule, step: int, sync_every: int) -> bool:
    """Whether masks are ranked at ``step``: at a schedule update step when every step syncs; else at the first
    step of an interval, if a schedule update fell in the interval that ends there."""
    if sync_every == 1:
        return schedule.is_update_step(step)
    if step % sync_every:
        return False
    last = schedule.last_update_at_or_before(step)
    return last is not None and last > step - sync_every


def checks_at(verify_every: int, step: int, sync_every: int) -> bool:
    """Whether a periodic Mask Tracker check runs at ``step``: every ``verify_every`` steps (0: never); with local
    steps at the first step of an interval, if a check fell in the interval that ends there (a check between
    syncs would be a collective the interval otherwise does without: a round trip on a slow link)."""
    if not verify_every:
        return False
    if sync_every == 1:
        return step % verify_every == 0
    return step % sync_every == 0 and step // verify_every > (step - sync_every) // verify_every


def at_sync(step: int | None, sync_every: int) -> int | None:
    """Where something due at ``step`` is done: the first interval start at or after it (None stays None)."""
    return None if step is None else -(-step // sync_every) * sync_every


def outer_update(anchor: T, momentum: T, outer_gradient: T, lr: float, beta: float) -> tuple[T, T]:
    """The outer step (SGD with Nesterov momentum, as torch's ``SGD(nesterov=True)``) on any array type:
    the new anchor and momentum. ``beta`` 0 and ``lr`` 1 give plain model averaging."""
    momentum = momentum * beta + outer_gradient
    return anchor - (outer_gradient + momentum * beta) * lr, momentum


def check_outer_entry(saved: Any, shapes: Mapping[str, tuple[int, ...]], kind: type | tuple[type, ...]) -> None:
    """``CheckpointError`` unless a checkpoint's ``outer`` entry holds an anchor and a momentum, each a ``kind``
    of its tensor's shape, for exactly the tensors of ``shapes``."""
    if not isinstance(saved, Mapping) or not {"anchor", "momentum"} <= set(saved):
        raise CheckpointError("a checkpoint's 'outer' entry needs 'anchor' and 'momentum'")
    for part in ("anchor", "momentum"):
        tensors = saved[part]
        if not isinstance(tensors, Mapping) or set(tensors) != set(shapes):
            raise CheckpointError(f"checkpoint 'outer' {part} must hold the tensors {sorted(shapes)}, "
                                  f"got {sorted(tensors) if isinstance(tensors, Mapping) else tensors!r}")
        for name, shape in shapes.items():
            if not isinstance(tensors[name], kind) or tuple(np.shape(tensors[name])) != tuple(shape):
                raise CheckpointError(f"checkpoint 'outer' {part} of {name!r} must be a tensor of shape {tuple(shape)}")
