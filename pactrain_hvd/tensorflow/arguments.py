"""Horovod's and PacTrain's arguments of ``PacTrainState``, checked before anything is created or communicated."""

from __future__ import annotations

from typing import Any

import horovod.tensorflow as hvd

from pactrain_hvd.core import PacTrainConfig
from pactrain_hvd.core.config import config_arguments, reduce_op_name, require_initialized
from pactrain_hvd.core.encodings import ENCODINGS
from pactrain_hvd.core.masks import prunable_patterns
from pactrain_hvd.core.own_masks import schedule_sparsity
from pactrain_hvd.tensorflow.compression import PACKED_WIRES
from pactrain_hvd.tensorflow.own_masks import PendingMasks
from pactrain_hvd.tensorflow.pruning import Prunable


def _validate_groups(groups: Any) -> None:
    if groups is None:
        return
    if isinstance(groups, bool) or not (isinstance(groups, list) or (isinstance(groups, int) and groups > 0)):
        raise ValueError(f"groups should be a positive integer or a list of lists of tf.Variable, got {groups!r}")
    if isinstance(groups, list) and not all(isinstance(group, (list, tuple)) for group in groups):
        raise ValueError("groups given as a list must be a list of lists of tf.Variable")


def checked_arguments(*, compression: Any, op: Any, gradient_predivide_factor: float, groups: Any, packed_values: str,
                      process_set: Any, prunable: Prunable, masks: Any, continue_pruning: bool,
                      **pactrain: Any) -> tuple[PacTrainConfig, PendingMasks | None]:
    """``PacTrainState``'s arguments checked, before anything is created or communicated: its config and
    given masks. ``pactrain``: the rest of its keywords (``core.config.KEYWORDS``), and whatever else it takes."""
    config = PacTrainConfig.from_arguments(**dict(config_arguments(pactrain),
                                                  sparsity=schedule_sparsity(pactrain["sparsity"], masks is not None,
                                                                             continue_pruning)))
    own_masks = PendingMasks(masks) if masks is not None else None
    if not (hasattr(compression, "compress") and hasattr(compression, "decompress")):
        raise TypeError(f"compression must be a Horovod Compressor such as hvd.Compression.fp16, "
                        f"got {compression!r}")
    op_name = reduce_op_name(hvd, op, gradient_predivide_factor)
    _validate_groups(groups)
    encoding = ENCODINGS[packed_values]  # already read by packed_values_argument
    encoding.check(op_name, groups is not None)
    encoding.wire_of(PACKED_WIRES, "horovod.tensorflow")
    if encoding.wire is not None and groups is not None:
        raise ValueError(f"packed_values={packed_values!r} cannot be combined with groups in the TensorFlow frontend: "
                         "a pruned tensor's plan, hence its wire dtype, is chosen when the step runs; "
                         "compression=hvd.Compression.fp16 sends every tensor as fp16 and works with groups")
    if not isinstance(process_set, hvd.ProcessSet):
        raise TypeError(f"process_set must be a horovod ProcessSet, got {type(process_set).__name__}")
    if prunable is not None and not callable(prunable):
        prunable_patterns(prunable)
    require_initialized(hvd, "pactrain_hvd.tensorflow.PacTrainState")
    return config, own_masks
