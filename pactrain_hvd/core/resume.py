"""Resuming a checkpoint: under another world size PacTrain warns and carries on (masks do not depend
on it); under other PacTrain settings it refuses unless told to carry on."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from pactrain_hvd.core.checkpoint import SavedState
from pactrain_hvd.core.config import PacTrainConfig
from pactrain_hvd.core.errors import (
    ChangedSettingsWarning,
    CheckpointError,
    InexactResumeWarning,
    WorldSizeChangedWarning,
)


def check_saved_world_size(saved: object, current: int) -> None:
    """Warn (``WorldSizeChangedWarning``) when a checkpoint's world size differs from ``current``.

    Masks and schedule position are the same on every rank and independent of the number of
    ranks, so Horovod's usual resume-on-another-size (elastic training) stays legitimate; only the
    user's own choices may depend on it (learning rate or batch scaled by ``hvd.size()``).

    Args:
        saved: the world size recorded in the checkpoint; None for checkpoints written before it was recorded
            (nothing is checked).
        current: the world size the checkpoint is loaded under.

    Raises:
        CheckpointError: ``saved`` is neither None nor an int >= 1.
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
    """Ask Horovod ``query()``, tolerating the gap in which Horovod is down.

    An elastic restore runs between a failure and the re-init, when Horovod's queries raise.

    Args:
        query: a Horovod process set's ``rank`` or ``size`` (any zero-argument callable).

    Returns:
        ``query()``, or None when it raised ``ValueError`` or ``RuntimeError`` (Horovod is down).
    """
    try:
        return query()
    except (ValueError, RuntimeError):
        return None


def saved_by_this_rank(saved_rank: int, rank: Callable[[], int], holds_state: bool = True) -> bool:
    """Whether per-rank state (quantized values' error memory) saved by ``saved_rank`` is this
    process's: the same rank, or any while Horovod is down (an elastic rollback restores its own).

    Args:
        saved_rank: the rank that saved the state.
        rank: returns this process's rank (e.g. a process set's ``rank``); may raise while Horovod is down.
        holds_state: whether the run has stepped (not the start-up broadcast of a fresh run); where the state is
            another rank's, an ``InexactResumeWarning`` then says this rank resumes without its own.

    Returns:
        True where the state is this process's to restore, False where it is another rank's.
    """
    current = while_running(rank)
    if current is None or current == saved_rank:
        return True
    if not holds_state:
        return False
    warnings.warn(f"this checkpoint holds rank {saved_rank}'s quantization error memory, not "
                  f"rank {current}'s: rank {current} resumes without it, close to but not bit for bit the "
                  "uninterrupted run. For an exact resume save and load one checkpoint per rank (state_dict() on "
                  "every rank)", InexactResumeWarning, stacklevel=3)
    return False


# The settings a checkpoint's masks and schedule position were reached under.
RESUMED_SETTINGS = ("sparsity", "begin_step", "end_step", "frequency", "ranking", "packed_values", "sync_every")


def checkpoint_settings(config: PacTrainConfig, packed_values: str) -> dict[str, Any]:
    """What a checkpoint records of the settings (``check_saved_settings`` compares them on load)."""
    shared = config.shared_settings()
    return {name: packed_values if name == "packed_values" else shared[name] for name in RESUMED_SETTINGS}


def check_saved_settings(saved: Any, current: dict[str, Any], step: int, config: PacTrainConfig) -> None:
    """Refuse (``CheckpointError``) a checkpoint saved under other settings than ``current``
    (``checkpoint_settings``), before anything changes; with ``config.resume_changed_settings`` warn
    (``ChangedSettingsWarning``) and say what the run will do. ``saved``: the checkpoint's settings (a
    checkpoint from before they were recorded has its ``sparsity`` only, or nothing)."""
    if not isinstance(saved, dict):
        return
    changed = [f"{name} {saved[name]!r} -> {current[name]!r}" for name in RESUMED_SETTINGS
               if name in saved and saved[name] != current[name]]
    if not changed:
        return
    listed = ", ".join(changed)
    if not config.resume_changed_settings:
        raise CheckpointError(
            f"checkpoint was saved with other PacTrain settings ({listed}, checkpoint -> this optimizer): create "
            "the optimizer with the checkpoint's settings, or pass resume_changed_settings=True to continue from "
            "its masks and step under the new ones")
    following = config.schedule.next_update_after(step - 1)
    what = (f"masks only shrink, so the schedule prunes further from them at step {following}" if following is not None
            else f"no schedule update remains after step {step} (end_step {config.end_step}): masks stay as saved")
    warnings.warn(f"resuming a checkpoint saved with other PacTrain settings ({listed}): its masks and step {step} "
                  f"carry over and this optimizer's settings apply from here; {what}", ChangedSettingsWarning,
                  stacklevel=3)


def check_resumable(saved: SavedState, config: PacTrainConfig, packed_values: str, world_size: int | None) -> None:
    """A read checkpoint entry against this run, before anything changes: its settings (``check_saved_settings``)
    and, where this run's world size is known (``world_size``; None while Horovod is down), its world size."""
    check_saved_settings(saved.settings, checkpoint_settings(config, packed_values), saved.step, config)
    if world_size is not None:
        check_saved_world_size(saved.world_size, world_size)
