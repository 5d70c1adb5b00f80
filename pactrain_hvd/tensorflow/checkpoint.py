"""Checkpoints: ``PacTrainState``'s ``.npz`` blob, the value ``tf.train.Checkpoint`` stores for it.

The blob holds the schedule position, the world size it was written under and the masks; with
``packed_values="ternary"`` also the held scales (the same on every rank) and this rank's error memory
and rounding-noise state (restored only on the same rank, as in torch). Masks are keyed by the
variable's position in binding order (the model's variable order), so they restore into a rebuilt
model whose generated names differ (Keras numbers layers per process); the saved names serve the
error messages.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from pactrain_hvd.core import CheckpointError, check_saved_world_size, saved_by_this_rank
from pactrain_hvd.core.resume import check_saved_settings, checkpoint_settings

if TYPE_CHECKING:
    from pactrain_hvd.tensorflow.state import PacTrainState


@dataclass
class SavedTernary:
    """The saving rank, and that rank's noise state and residuals by position; the held scales by position."""

    rank: int
    noise: np.ndarray
    residuals: dict[int, np.ndarray]
    scales: dict[int, float]


@dataclass
class SavedState:
    step: int
    world_size: int | None  # None: written before it was recorded
    masks: list[tuple[int, str, np.ndarray]]  # (position, saved name, mask)
    ternary: SavedTernary | None
    settings: dict | None = None  # None: written before they were recorded


def serialize(state: PacTrainState) -> bytes:
    if state._pending_restore is not None:
        return state._pending_restore
    names = sorted(state._pruner.masks)
    ternary = {}
    if state._ternary is not None:
        scaled = sorted(state._ternary.scales)
        ternary = {"ternary_rank": np.int64(state.process_set.rank()),
                   "ternary_noise": state._ternary.noise.generator.state.numpy(),
                   "scale_positions": np.array([state._names.index(name) for name in scaled], dtype=np.int64),
                   "ternary_scales": np.array([state._ternary.scales[name].numpy() for name in scaled], np.float32),
                   **{f"residual_{i}": state._ternary.memory.residuals[name].numpy() for i, name in enumerate(names)}}
    buffer = io.BytesIO()
    np.savez(buffer, step=np.int64(state.step_count), world_size=np.int64(state._group_size()),
             settings=np.array(json.dumps(checkpoint_settings(state.config, state.packed_values))),
             names=np.array(names, dtype=np.str_),
             positions=np.array([state._names.index(name) for name in names], dtype=np.int64),
             **{f"mask_{i}": state._pruner.masks[name] for i, name in enumerate(names)}, **ternary)
    return buffer.getvalue()


def parse(blob: bytes) -> SavedState:
    """A ``serialize`` blob, read once."""
    try:
        with np.load(io.BytesIO(blob), allow_pickle=False) as saved:
            names = [str(name) for name in saved["names"]]
            positions = [int(position) for position in saved["positions"]]
            masks = [(position, name, saved[f"mask_{i}"]) for i, (position, name) in enumerate(zip(positions, names))]
            ternary = None
            if "ternary_rank" in saved.files:
                scales = ({int(position): float(scale) for position, scale in
                           zip(saved["scale_positions"], saved["ternary_scales"])} if "ternary_scales" in saved.files
                          else {})
                ternary = SavedTernary(int(saved["ternary_rank"]), saved["ternary_noise"],
                                       {position: saved[f"residual_{i}"] for i, position in enumerate(positions)},
                                       scales)
            world_size = int(saved["world_size"]) if "world_size" in saved.files else None
            settings = json.loads(str(saved["settings"])) if "settings" in saved.files else None
            return SavedState(int(saved["step"]), world_size, masks, ternary, settings)
    except (OSError, KeyError, ValueError, EOFError) as error:
        raise CheckpointError(f"not a PacTrain state: {error}") from error


def deserialize(state: PacTrainState, blob: bytes) -> None:
    saved = parse(blob)
    check_saved_settings(saved.settings, checkpoint_settings(state.config, state.packed_values), saved.step,
                         state.config)
    check_saved_world_size(saved.world_size, state._group_size())
    if not state._names:
        state._pending_restore = bytes(blob)  # applied when the state binds to its variables
        state._set_step(saved.step)
        return
    restore(state, saved)


def restore(state: PacTrainState, saved: SavedState) -> None:
    """Validate ``saved`` against the bound variables, then install it."""
    names = state._names
    masks = {}
    for position, saved_name, mask in saved.masks:
        if position >= len(names):
            raise CheckpointError(f"checkpoint has a mask for variable #{position} ({saved_name!r}), but only "
                                  f"{len(names)} variables are bound here")
        masks[names[position]] = mask
    try:
        masks = state._pruner.validate(masks)
    except (TypeError, ValueError) as error:
        raise CheckpointError(f"checkpoint does not fit these variables: {error}") from error
    residuals = _saved_residuals(state, saved.ternary, masks)
    scales = saved.ternary.scales if saved.ternary else {}
    bad = {names[p] if p < len(names) else p: v for p, v in scales.items() if not (np.isnan(v) or 0 <= v < np.inf)}
    if bad:
        raise CheckpointError(f"checkpoint ternary scales must be >= 0 and finite, or NaN (none held), got {bad}")
    state._set_step(saved.step)
    state._install(masks)
    ternary = state._ternary
    if ternary is not None:  # none held where the checkpoint has none: that step agrees one
        ternary.hold_scales({names[p]: v for p, v in scales.items() if p < len(names)})
    if residuals is not None:
        ternary.noise.generator.state.assign(saved.ternary.noise)
        for name, residual in residuals.items():
            ternary.memory.residuals[name].assign(residual)


def _saved_residuals(state: PacTrainState, saved: SavedTernary | None, masks: dict[str, np.ndarray]) -> dict | None:
    """The checkpoint's residuals by name, checked against the masks, if this rank saved them."""
    if saved is None or state._ternary is None or not saved_by_this_rank(saved.rank, state.process_set.rank):
        return None
    residuals = {}
    for position, residual in saved.residuals.items():
        name = state._names[position]
        expected = int(masks[name].sum()) if state._packs(masks.get(name)) else 0
        if residual.ndim != 1 or residual.size != expected:
            raise CheckpointError(f"ternary residual of {name!r} has shape {residual.shape}, its packed values "
                                  f"number {expected}")
        residuals[name] = residual.astype(np.float32)
    return residuals
