"""Horovod's and PacTrain's arguments of ``PacTrainState``, checked before anything is created or communicated."""

from __future__ import annotations

from typing import Any

import horovod.tensorflow as hvd
import tensorflow as tf

from pactrain_hvd.core.masks import prunable_patterns
from pactrain_hvd.core.settings import Settings, resolve
from pactrain_hvd.tensorflow.compression import PACKED_WIRES
from pactrain_hvd.tensorflow.own_masks import PendingMasks
from pactrain_hvd.tensorflow.pruning import backing_variable


def _check_groups(groups: int | list | None) -> None:
    """Each variable ``groups`` lists is a variable and listed once (checked here, not at the first reduction
    across ranks)."""
    seen = set()
    for group in groups if isinstance(groups, list) else ():
        for member in group:
            try:
                ref = backing_variable(member).ref()
            except TypeError:
                raise TypeError(f"groups must consist of tf.Variable (or Keras variables), got "
                                f"{type(member).__name__}") from None
            if ref in seen:
                raise ValueError(f"a variable can only appear once in groups: {backing_variable(member).name}")
            seen.add(ref)


def _check_device(name: str, device: Any) -> None:
    """Where ``tf.device`` puts the all-reduce: a device name, a ``tf.DeviceSpec`` or None ('': TF's placement)."""
    if device is not None and not isinstance(device, (str, tf.DeviceSpec)):
        raise TypeError(f"{name} must be a device name such as '/gpu:0' ('': where TensorFlow places it), "
                        f"got {device!r} ({type(device).__name__})")


def checked_arguments(*, compression: Any, op: Any, gradient_predivide_factor: float, groups: Any, process_set: Any,
                      stacklevel: int, device_dense: Any = "", device_sparse: Any = "", optimizer: Any = None,
                      **pactrain: Any) -> tuple[Settings, PendingMasks | None]:
    """``PacTrainState``'s arguments checked, before anything is created or communicated: the settings
    (``core.settings.resolve``) and the given masks. ``pactrain``: the rest of its keywords
    (``core.keywords.KEYWORDS``), and whatever else it takes; ``stacklevel``: frames from here up to the
    façade's caller."""
    if isinstance(groups, bool):  # as Horovod's TensorFlow frontend: not a count
        raise ValueError(f"groups should be a positive integer or a list of lists of tf.Variable, got {groups!r}")
    settings = resolve(hvd, pactrain, caller="pactrain_hvd.tensorflow.PacTrainState", tensors="tf.Variable",
                       wires=PACKED_WIRES, op=op, gradient_predivide_factor=gradient_predivide_factor, groups=groups,
                       process_set=process_set, stacklevel=stacklevel + 1)
    _check_groups(settings.groups)
    own_masks = PendingMasks(pactrain["masks"]) if pactrain["masks"] is not None else None
    if not (hasattr(compression, "compress") and hasattr(compression, "decompress")):
        raise TypeError(f"compression must be a Horovod Compressor such as hvd.Compression.fp16, "
                        f"got {compression!r}")
    _check_device("device_dense", device_dense)
    _check_device("device_sparse", device_sparse)
    if optimizer is not None and not hasattr(optimizer, "apply_gradients"):  # else its slots stay as they are
        raise TypeError(f"optimizer must be the Keras optimizer whose slots (momentum, Adam moments) are cleared at "
                        f"pruned coordinates, or None, got {optimizer!r} ({type(optimizer).__name__})")
    if settings.encoding.wire is not None and settings.groups is not None:
        raise ValueError(f"packed_values={settings.packed_values!r} cannot be combined with groups in the TensorFlow "
                         "frontend: a pruned tensor's plan, hence its wire dtype, is chosen when the step runs; "
                         "compression=hvd.Compression.fp16 sends every tensor as fp16 and works with groups")
    prunable = pactrain["prunable"]
    if prunable is not None and not callable(prunable):
        prunable_patterns(prunable)
    return settings, own_masks
