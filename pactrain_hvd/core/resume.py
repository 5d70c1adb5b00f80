"""Resuming under another world size: masks do not depend on it, so PacTrain warns and carries on."""

from __future__ import annotations

import warnings
from collections.abc import Callable

from pactrain_hvd.core.errors import CheckpointError, WorldSizeChangedWarning


def check_saved_world_size(saved: object, current: int) -> None:
    """Warn (``WorldSizeChangedWarning``) when a checkpoint's world size differs from ``current``.

    Masks and schedule position are the same on every rank and independent of the number of
    ranks, so Horovod's usual resume-on-another-size (elastic training) stays legitimate; only the
    user's own choices may depend on it (learning rate or batch scaled by ``hvd.size()``).
    ``saved`` is None for checkpoints written before the world size was recorded.
    """
    if saved is None:
        return
    if isinstance(saved, bool) or not isinstance(saved, int) or saved < 1:
        raise CheckpointError(f"checkpoint world_size must be an int >= 1, got {saved!r}")
    if saved != current:
        warnings.warn(f"checkpoint was saved with world size {saved}, loading it with {current}: masks and schedule "
                      "position carry over unchanged; rescale a learning rate or batch size you derived from "
                      "hvd.size() yourself", WorldSizeChangedWarning, stacklevel=3)


def while_running(query: Callable[[], int]) -> int | None:
    """``query()`` (a Horovod process set's ``rank`` or ``size``), or None while Horovod is down:
    an elastic restore runs between a failure and the re-init."""
    try:
        return query()
    except (ValueError, RuntimeError):
        return None


def saved_by_this_rank(saved_rank: int, rank: Callable[[], int]) -> bool:
    """Whether per-rank state (ternary error memory, rounding noise) saved by ``saved_rank`` is this
    process's: the same rank, or any while Horovod is down (an elastic rollback restores its own)."""
    current = while_running(rank)
    return current is None or current == saved_rank
