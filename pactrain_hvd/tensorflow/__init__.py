"""PacTrain for ``horovod.tensorflow``: ``hvd.DistributedGradientTape`` -> ``pt.DistributedGradientTape``.

Keras users: ``pactrain_hvd.tensorflow.keras.DistributedOptimizer``.
"""

from horovod.tensorflow.compression import Compression

from pactrain_hvd.core import CheckpointError, MaskMismatchError
from pactrain_hvd.tensorflow.compression import PacTrainCompressor
from pactrain_hvd.tensorflow.optimizer import (
    DistributedGradientTape,
    PacTrainState,
    PartialDistributedGradientTape,
    broadcast_masks,
)
from pactrain_hvd.tensorflow.pruning import Pruner, default_prunable

__all__ = [
    "CheckpointError",
    "Compression",
    "DistributedGradientTape",
    "MaskMismatchError",
    "PacTrainCompressor",
    "PacTrainState",
    "PartialDistributedGradientTape",
    "Pruner",
    "broadcast_masks",
    "default_prunable",
]
