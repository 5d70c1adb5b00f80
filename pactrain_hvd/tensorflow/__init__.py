"""PacTrain for ``horovod.tensorflow``: ``hvd.DistributedGradientTape`` -> ``pt.DistributedGradientTape``.

Keras users: ``pactrain_hvd.tensorflow.keras.DistributedOptimizer``.
"""

from horovod.tensorflow.compression import Compression

from pactrain_hvd.core import (
    ChangedSettingsWarning,
    CheckpointError,
    ConstantSparsity,
    MaskMismatchError,
    NonFiniteWeightsError,
    PolynomialDecay,
    SettingsMismatchError,
    short_ramp,
)
from pactrain_hvd.tensorflow.compression import PacTrainCompressor
from pactrain_hvd.tensorflow.functions import broadcast_masks, broadcast_variables_at_next_reduction
from pactrain_hvd.tensorflow.pruning import Pruner, default_prunable
from pactrain_hvd.tensorflow.state import PacTrainState
from pactrain_hvd.tensorflow.tape import DistributedGradientTape, PartialDistributedGradientTape

__all__ = [
    "ChangedSettingsWarning",
    "CheckpointError",
    "ConstantSparsity",
    "Compression",
    "DistributedGradientTape",
    "MaskMismatchError",
    "NonFiniteWeightsError",
    "SettingsMismatchError",
    "PacTrainCompressor",
    "PacTrainState",
    "PolynomialDecay",
    "PartialDistributedGradientTape",
    "Pruner",
    "broadcast_masks",
    "broadcast_variables_at_next_reduction",
    "default_prunable",
    "short_ramp",
]
