"""PacTrain for ``horovod.torch``: change one line, ``hvd.DistributedOptimizer`` -> ``pt.DistributedOptimizer``."""

from horovod.torch.compression import Compression

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
from pactrain_hvd.torch import ddp
from pactrain_hvd.torch.checkpoint import load_checkpoint, save_checkpoint
from pactrain_hvd.torch.compression import PacTrainCompressor
from pactrain_hvd.torch.elastic import PacTrainStateHandler  # registers itself with hvd.elastic.TorchState
from pactrain_hvd.torch.functions import broadcast_masks, broadcast_optimizer_state
from pactrain_hvd.torch.optimizer import DistributedOptimizer
from pactrain_hvd.torch.pruning import Pruner, default_prunable
from pactrain_hvd.torch.state import PacTrainState

__all__ = [
    "ChangedSettingsWarning",
    "CheckpointError",
    "ConstantSparsity",
    "Compression",
    "DistributedOptimizer",
    "MaskMismatchError",
    "NonFiniteWeightsError",
    "SettingsMismatchError",
    "PacTrainCompressor",
    "PacTrainState",
    "PolynomialDecay",
    "PacTrainStateHandler",
    "Pruner",
    "broadcast_masks",
    "broadcast_optimizer_state",
    "ddp",
    "default_prunable",
    "short_ramp",
    "load_checkpoint",
    "save_checkpoint",
]
