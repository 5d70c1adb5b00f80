"""Bring your own mask (TensorFlow): masks from tfmot's ``prune_low_magnitude`` or a dict, keyed by variable name.

A ``PacTrainState`` learns its variables' names only when it binds to them (its first step), so
masks given at construction wait here until then. tfmot's wrappers (``PruneLowMagnitude``,
tf-keras 2 only) keep ``pruning_vars``: ``(weight, mask, threshold)`` per pruned weight; the
weight is what the optimizer updates and what PacTrain masks and packs. tfmot is found by that
attribute, not imported: importing it sets ``TF_USE_LEGACY_KERAS=1`` for the whole process.
The rule for given masks is in ``pactrain_hvd.core.own_masks``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np
import tensorflow as tf

from pactrain_hvd.core import validate_mask
from pactrain_hvd.core.own_masks import binary_mask, check_mask_names
from pactrain_hvd.tensorflow.pruning import backing_variable

logger = logging.getLogger("pactrain_hvd")


def tfmot_masks(model: Any) -> dict[Any, tuple[tf.Variable, tf.Variable]]:
    """``{weight.ref(): (weight, mask variable)}`` for every weight pruned by tfmot in ``model``."""
    layers = model._flatten_layers(include_self=True, recursive=True) if hasattr(model, "_flatten_layers") else []
    found = {}
    for layer in layers:
        for weight, mask, _threshold in getattr(layer, "pruning_vars", None) or ():
            found[backing_variable(weight).ref()] = (backing_variable(weight), backing_variable(mask))
    return found


class PendingMasks:
    """``masks=`` of a ``PacTrainState``: checked now as far as possible, resolved to names at binding."""

    def __init__(self, masks: Mapping[str, Any] | Any) -> None:
        self.by_name: dict[str, np.ndarray] = {}
        self.from_tfmot: dict[Any, tuple[tf.Variable, tf.Variable]] = {}
        if isinstance(masks, Mapping):
            check_mask_names(masks, masks, "variables")  # non-empty; names are checked at binding
            for name, mask in masks.items():
                mask = np.asarray(mask)
                self.by_name[name] = validate_mask(name, mask, mask.shape)
        elif hasattr(masks, "layers"):
            self.from_tfmot = tfmot_masks(masks)
            if not self.from_tfmot:
                raise ValueError(f"masks={type(masks).__name__}(...) has no layer wrapped by tfmot's "
                                 "prune_low_magnitude: wrap it first, or give masks as {variable name: bool mask}")
        else:
            raise TypeError(f"masks must be a dict {{variable name: bool mask}} or a Keras model wrapped by tfmot's "
                            f"prune_low_magnitude, got {type(masks).__name__}")

    def resolve(self, named: Mapping[str, tf.Variable]) -> tuple[dict[str, np.ndarray], dict[str, tf.Variable]]:
        """Host masks by bound name, and tfmot's mask variables to keep in step with them."""
        if not self.from_tfmot:
            check_mask_names(self.by_name, named, "variables")
            return {name: validate_mask(name, mask, tuple(named[name].shape)) for name, mask in self.by_name.items()}, {}
        name_of = {variable.ref(): name for name, variable in named.items()}
        stray = sorted(weight.name for ref, (weight, _) in self.from_tfmot.items() if ref not in name_of)
        if stray:
            raise ValueError(f"masks=model: weights pruned by tfmot are not among the variables being trained: "
                             f"{', '.join(stray)}")
        mask_variables = {name_of[ref]: mask for ref, (_, mask) in self.from_tfmot.items()}
        host = {name: binary_mask(name, mask.numpy()) for name, mask in mask_variables.items()}
        logger.info("pactrain_hvd: masks of %d variables taken from tfmot: %s", len(host), ", ".join(host))
        return host, mask_variables


def sync_tfmot_masks(mask_variables: Mapping[str, tf.Variable], masks: Mapping[str, np.ndarray]) -> None:
    """Write PacTrain's masks into tfmot's mask variables, so tfmot's forward and ``strip_pruning`` agree."""
    for name, variable in mask_variables.items():
        if name in masks:
            variable.assign(masks[name].astype(variable.dtype.as_numpy_dtype))
