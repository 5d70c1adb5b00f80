"""Horovod's and PacTrain's arguments of ``PacTrainState``, checked before anything is created or communicated."""

from __future__ import annotations

from typing import Any

import horovod.tensorflow as hvd
import tensorflow as tf

from pactrain_hvd.core import PacTrainConfig
from pactrain_hvd.core.config import (
    check_process_set,
    checked_groups,
    config_arguments,
    reduce_op_name,
    require_initialized,
)
from pactrain_hvd.core.encodings import ENCODINGS
from pactrain_hvd.core.masks import prunable_patterns
from pactrain_hvd.core.own_masks import schedule_sparsity
from pactrain_hvd.tensorflow.compression import PACKED_WIRES
from pactrain_hvd.tensorflow.own_masks import PendingMasks
from pactrain_hvd.tensorflow.pruning import Prunable, backing_variable


def _checked_groups(groups: Any) -> int | list | None:
    """``groups`` as Horovod takes them, each listed variable a variable and listed once (checked here, not at the
    first reduction across ranks)."""
    if isinstance(groups, bool):
        raise ValueError(f"groups should be a positive integer or a list of lists of tf.Variable, got {groups!r}")
    groups = checked_groups(groups, "tf.Variable")
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
    return groups


def _check_device(name: str, device: Any) -> None:
    """Where ``tf.device`` puts the all-reduce: a device name, a ``tf.DeviceSpec`` or None ('': TF's placement)."""
    if device is not None and not isinstance(device, (str, tf.DeviceSpec)):
        raise TypeError(f"{name} must be a device name such as '/gpu:0' ('': where TensorFlow places it), "
                        f"got {device!r} ({type(device).__name__})")


def checked_arguments(*, compression: Any, op: Any, gradient_predivide_factor: float, groups: Any, packed_values: str,
                      process_set: Any, prunable: Prunable, masks: Any, continue_pruning: bool, device_dense: Any = "",
                      device_sparse: Any = "", optimizer: Any = None,
                      **pactrain: Any) -> tuple[PacTrainConfig, PendingMasks | None, int | list | None]:
    """``PacTrainState``'s arguments checked, before anything is created or communicated: its config, given masks
    and ``groups`` (a number as an ``int``). ``pactrain``: the rest of its keywords (``core.keywords.KEYWORDS``), and
    whatever else it takes."""
    config = PacTrainConfig.from_arguments(**dict(config_arguments(pactrain),
                                                  sparsity=schedule_sparsity(pactrain["sparsity"], masks is not None,
                                                                             continue_pruning)))
    own_masks = PendingMasks(masks) if masks is not None else None
    if not (hasattr(compression, "compress") and hasattr(compression, "decompress")):
        raise TypeError(f"compression must be a Horovod Compressor such as hvd.Compression.fp16, "
                        f"got {compression!r}")
    op_name = reduce_op_name(hvd, op, gradient_predivide_factor)
    groups = _checked_groups(groups)
    _check_device("device_dense", device_dense)
    _check_device("device_sparse", device_sparse)
    if optimizer is not None and not hasattr(optimizer, "apply_gradients"):  # else its slots stay as they are
        raise TypeError(f"optimizer must be the Keras optimizer whose slots (momentum, Adam moments) are cleared at "
                        f"pruned coordinates, or None, got {optimizer!r} ({type(optimizer).__name__})")
    encoding = ENCODINGS[packed_values]  # already read by packed_values_argument
    encoding.check(op_name, groups is not None)
    encoding.wire_of(PACKED_WIRES, "horovod.tensorflow")
    if encoding.wire is not None and groups is not None:
        raise ValueError(f"packed_values={packed_values!r} cannot be combined with groups in the TensorFlow frontend: "
                         "a pruned tensor's plan, hence its wire dtype, is chosen when the step runs; "
                         "compression=hvd.Compression.fp16 sends every tensor as fp16 and works with groups")
    check_process_set(hvd, process_set)
    if prunable is not None and not callable(prunable):
        prunable_patterns(prunable)
    require_initialized(hvd, "pactrain_hvd.tensorflow.PacTrainState")
    return config, own_masks, groups
