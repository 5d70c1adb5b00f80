"""Checkpoints: ``PacTrainState``'s blob, the value ``tf.train.Checkpoint`` stores for it.

The blob is core's checkpoint entry (``pactrain_hvd.core.checkpoint``) as a NumPy ``.npz`` archive. Its
tensors are keyed by their position in binding order (the model's variable order), so they restore into a
rebuilt model whose generated names differ (Keras numbers layers per process); the saved names serve the
error messages. This module takes an entry from the bound variables (``snapshot``) and maps a read one
onto them (``restore``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from pactrain_hvd.core import CheckpointError, saved_by_this_rank
from pactrain_hvd.core.checkpoint import SavedState, checked_scales
from pactrain_hvd.tensorflow.bound import BoundTensors
from pactrain_hvd.tensorflow.maintenance import Maintenance


def snapshot(bound: BoundTensors, step: int, settings: dict, world_size: int, rank: Callable[[], int]) -> SavedState:
    """What a checkpoint saves: schedule position, world size, settings and masks (with each variable's
    position); with quantized values the held scales and this rank's error memory; with local steps the
    anchor and outer momentum."""
    masks = {name: bound.pruner.masks[name] for name in sorted(bound.pruner.masks)}
    scales = quantized = None
    if bound.quantized is not None:
        residuals = bound.quantized.memory.state_dict()
        quantized = {"rank": rank(), "residuals": {name: residuals[name] for name in masks}}
        scales = {name: float(value) for name, scale in bound.quantized.scales.items()
                  if not np.isnan(value := scale.numpy())}
    outer = bound.outer.state_dict() if bound.outer is not None and bound.outer.variables else None
    held = {*masks, *(scales or {}), *(outer["anchor"] if outer else ())}
    positions = {name: bound.names.index(name) for name in held}
    return SavedState(step, masks, settings, world_size, positions, scales, quantized, outer)


def restore(bound: BoundTensors, maintenance: Maintenance, saved: SavedState, rank: Callable[[], int]) -> None:
    """Install a checkpoint's state into the bound variables; validated before anything changes. Local."""
    try:
        masks = bound.pruner.validate(masks_by_name(saved, bound.names))
    except (TypeError, ValueError) as error:
        raise CheckpointError(f"checkpoint does not fit these variables: {error}") from error
    residuals = None
    if (saved.quantized is not None and bound.quantized is not None
            and saved_by_this_rank(saved.quantized["rank"], rank, holds_state=saved.step > 0)):
        residuals = residuals_by_name(saved, bound.names, {
            name: int(mask.sum()) if maintenance.packs(mask) else 0 for name, mask in masks.items()})
    scales = scales_by_name(saved, bound.names)
    outer = outer_by_name(saved, bound.names) if bound.outer is not None and saved.outer else None
    if outer is not None:
        bound.outer.validate(outer)
    maintenance.set_step(saved.step)
    maintenance.install(masks)
    if bound.quantized is not None:  # none held where the checkpoint has none: that step agrees one
        bound.quantized.hold_scales(scales)
    if residuals is not None:
        bound.quantized.memory.load_state_dict(residuals)
    if outer is not None:
        bound.outer.load_state_dict(outer)
    elif bound.outer is not None:  # the weights now are the anchor
        bound.outer.restart()


def _bound_name(saved: SavedState, saved_name: str, names: list[str]) -> str:
    """The name of the variable bound here at ``saved_name``'s saved position (``names``: in binding order)."""
    position = saved.positions[saved_name]
    if position >= len(names):
        raise CheckpointError(f"checkpoint has state for variable #{position} ({saved_name!r}), but only "
                              f"{len(names)} variables are bound here")
    return names[position]


def masks_by_name(saved: SavedState, names: list[str]) -> dict[str, np.ndarray]:
    """The saved masks under the names of the variables bound at their positions."""
    return {_bound_name(saved, name, names): mask for name, mask in saved.masks.items()}


def scales_by_name(saved: SavedState, names: list[str]) -> dict[str, float]:
    """The held quantization scales by bound variable name (none where the checkpoint holds none), checked."""
    scales = checked_scales(saved.scales or {})
    return {names[saved.positions[name]]: value for name, value in scales.items() if saved.positions[name] < len(names)}


def residuals_by_name(saved: SavedState, names: list[str], packed_sizes: dict[str, int]) -> dict[str, np.ndarray]:
    """The saved residuals by bound variable name, each checked against its variable's packed length."""
    residuals = {}
    for saved_name, residual in saved.quantized["residuals"].items():
        name = _bound_name(saved, saved_name, names)
        expected = packed_sizes[name]
        if residual.ndim != 1 or residual.size != expected:
            raise CheckpointError(f"quantization residual of {name!r} has shape {residual.shape}, its packed values "
                                  f"number {expected}")
        residuals[name] = residual.astype(np.float32)
    return residuals


def outer_by_name(saved: SavedState, names: list[str]) -> dict[str, dict[str, np.ndarray]]:
    """Local steps' saved anchor and outer momentum by bound variable name."""
    return {part: {_bound_name(saved, name, names): value for name, value in saved.outer[part].items()}
            for part in ("anchor", "momentum")}
