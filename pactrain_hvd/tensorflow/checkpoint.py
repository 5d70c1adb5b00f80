"""Checkpoints: ``PacTrainState``'s blob, the value ``tf.train.Checkpoint`` stores for it.

The blob is core's checkpoint entry (``pactrain_hvd.core.checkpoint``) as a NumPy ``.npz`` archive. Its
tensors are keyed by their position in binding order (the model's variable order), so they restore into a
rebuilt model whose generated names differ (Keras numbers layers per process); the saved names serve the
error messages. This module maps a read entry onto the variables bound here.
"""

from __future__ import annotations

import numpy as np

from pactrain_hvd.core import CheckpointError
from pactrain_hvd.core.checkpoint import SavedState, checked_scales


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
