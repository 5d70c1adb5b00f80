"""PacTrain for ``horovod.tensorflow``: ``hvd.DistributedGradientTape`` -> ``pt.DistributedGradientTape``.

Keras users: ``pactrain_hvd.tensorflow.keras.DistributedOptimizer``.
"""

from horovod.tensorflow.compression import Compression

from pactrain_hvd.core.public import *  # noqa: F403 - the names every frontend shares
from pactrain_hvd.core.public import __all__ as _shared
from pactrain_hvd.tensorflow.compression import PacTrainCompressor
from pactrain_hvd.tensorflow.functions import broadcast_masks, broadcast_variables_at_next_reduction
from pactrain_hvd.tensorflow.pruning import Pruner, default_prunable
from pactrain_hvd.tensorflow.state import PacTrainState
from pactrain_hvd.tensorflow.tape import DistributedGradientTape, PartialDistributedGradientTape

__all__ = [
    *_shared,
    "Compression",
    "DistributedGradientTape",
    "PacTrainCompressor",
    "PacTrainState",
    "PartialDistributedGradientTape",
    "Pruner",
    "broadcast_masks",
    "broadcast_variables_at_next_reduction",
    "default_prunable",
]
