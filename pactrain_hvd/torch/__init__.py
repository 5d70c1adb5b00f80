"""PacTrain for ``horovod.torch``: change one line, ``hvd.DistributedOptimizer`` -> ``pt.DistributedOptimizer``."""

from horovod.torch.compression import Compression

from pactrain_hvd.core.public import *  # noqa: F403 - the names every frontend shares
from pactrain_hvd.core.public import __all__ as _shared
from pactrain_hvd.torch import ddp
from pactrain_hvd.torch.checkpoint import load_checkpoint, save_checkpoint
from pactrain_hvd.torch.compression import PacTrainCompressor
from pactrain_hvd.torch.elastic import PacTrainStateHandler  # registers itself with hvd.elastic.TorchState
from pactrain_hvd.torch.functions import broadcast_masks, broadcast_optimizer_state
from pactrain_hvd.torch.optimizer import DistributedOptimizer
from pactrain_hvd.torch.pruning import Pruner, default_prunable
from pactrain_hvd.torch.state import PacTrainState

__all__ = [
    *_shared,
    "Compression",
    "DistributedOptimizer",
    "PacTrainCompressor",
    "PacTrainState",
    "PacTrainStateHandler",
    "Pruner",
    "broadcast_masks",
    "broadcast_optimizer_state",
    "ddp",
    "default_prunable",
    "load_checkpoint",
    "save_checkpoint",
]
