"""Bring your own mask: the rule for masks given at construction, and checks shared by both frontends.

Masks come as a dict ``{name: bool mask}`` or from a model pruned by another tool
(``torch.nn.utils.prune``, tfmot's ``prune_low_magnitude``). The rule: given masks are
**fixed** (the schedule is off, ``sparsity`` and its steps are ignored) unless
``continue_pruning=True``: then the schedule prunes further toward ``sparsity``, starting
from the given masks (pruned coordinates never come back). Only tensors with a given mask are
prunable unless ``prunable`` says otherwise.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np


def schedule_sparsity(sparsity: float | None, masks_given: bool, continue_pruning: bool) -> float | None:
    """The final sparsity the schedule runs to: ``sparsity`` (None: not given, the default), or 0 (off) for fixed
    given masks."""
    if not isinstance(continue_pruning, bool):
        raise TypeError(f"continue_pruning must be a bool, got {continue_pruning!r}")
    if continue_pruning and not masks_given:
        raise ValueError("continue_pruning=True needs masks=...: without them the schedule runs anyway")
    if continue_pruning and sparsity is not None and not sparsity:
        raise ValueError("continue_pruning=True needs sparsity > 0: the target to prune further toward")
    return sparsity if continue_pruning or not masks_given else 0.0


def check_mask_names(masks: Mapping[str, Any], known: Iterable[str], what: str) -> None:
    """``masks=`` must name at least one tensor, and only ones this optimizer updates."""
    if not masks:
        raise ValueError("masks= is empty: give {name: bool mask} for at least one tensor, or leave it None")
    unknown = sorted(set(masks) - set(known))
    if unknown:
        raise ValueError(f"masks= names {what} this optimizer does not update: {', '.join(unknown)}")


def binary_mask(name: str, values: np.ndarray) -> np.ndarray:
    """A pruning tool's 0/1 float mask as bool; any other value would rescale weights, not prune them."""
    values = np.asarray(values)
    if not np.isin(values, (0, 1)).all():
        raise ValueError(f"pruning mask of {name!r} holds values other than 0 and 1: it is not a pruning mask")
    return values != 0
