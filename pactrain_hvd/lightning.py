"""PyTorch Lightning: PacTrain's DDP comm hook as one callback (``pip install pactrain_hvd[lightning]``).

Lightning builds DistributedDataParallel and the optimizer itself, and registers a strategy's comm hook only on
CUDA; the callback waits until both exist (``on_fit_start``), then builds the hook state and registers the hook
on any device. Its checkpoint entry holds every rank's state (gathered when Lightning saves, which it does on
every rank), so quantized values resume bit for bit from the one file rank 0 writes.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import Callback
from torch.nn.parallel import DistributedDataParallel

from pactrain_hvd.core import PacTrainConfig
from pactrain_hvd.core.config import config_arguments
from pactrain_hvd.core.encodings import packed_values_argument
from pactrain_hvd.core.keywords import KEYWORDS, LOCAL_STEP_KEYWORDS
from pactrain_hvd.torch.ddp import PacTrainHookState, pactrain_hook

_NOT_ON_DDP = ("masks", "continue_pruning", "values") + LOCAL_STEP_KEYWORDS  # PacTrainHookState's leave these out


class PacTrain(Callback):
    """Prune and pack DDP's gradient all-reduce in a Lightning ``Trainer(strategy="ddp")``.

    Args:
        **pactrain: ``PacTrainHookState``'s keywords (``sparsity``, ``total_steps``, ``schedule``,
            ``packed_values``, ...), checked here, before training starts.

    Example::

        >>> trainer = Trainer(strategy="ddp", callbacks=[PacTrain(sparsity=0.9, total_steps=1000)])
    """

    def __init__(self, **pactrain: Any) -> None:
        accepted = sorted(set(KEYWORDS) - set(_NOT_ON_DDP))
        unknown = sorted(set(pactrain) - set(accepted))
        if unknown:
            raise TypeError(f"PacTrain got unexpected keyword arguments {unknown}; it takes {accepted}")
        PacTrainConfig.from_arguments(**config_arguments({**KEYWORDS, **pactrain}))  # bad values: an error now
        packed_values_argument(pactrain.get("packed_values", "inherit"))
        self.pactrain = pactrain
        self.state: PacTrainHookState | None = None
        self._pending: dict | None = None  # a checkpoint's entry, read before DDP and the optimizer exist

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        model = trainer.strategy.model
        if not isinstance(model, DistributedDataParallel):
            raise RuntimeError(f"the PacTrain callback needs a DDP strategy (Trainer(strategy=\"ddp\")), got "
                               f"{type(trainer.strategy).__name__} with a {type(model).__name__}")
        if len(trainer.optimizers) != 1:
            raise ValueError(f"the PacTrain callback needs exactly one optimizer; configure_optimizers returned "
                             f"{len(trainer.optimizers)}")
        if self.state is None:
            self.state = PacTrainHookState(model, trainer.optimizers[0], **self.pactrain)
            model.register_comm_hook(self.state, pactrain_hook)
        if self._pending is not None:
            self.state.load_state_dict(self._pending)
            self._pending = None

    def state_dict(self) -> dict[str, Any]:
        """Every rank's hook state, in rank order (collective: Lightning saves on every rank)."""
        if self.state is None:
            return {}
        own = self.state.state_dict()
        if not dist.is_initialized() or dist.get_world_size() == 1:
            return {"ranks": [own]}
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, own)
        return {"ranks": gathered}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """This rank's own entry (rank 0's where the checkpoint has none for it: a world that changed size)."""
        if not state_dict:
            return
        ranks = state_dict["ranks"]
        rank = dist.get_rank() if dist.is_initialized() else 0
        own = ranks[rank] if rank < len(ranks) else ranks[0]
        if self.state is None:
            self._pending = own
        else:
            self.state.load_state_dict(own)
