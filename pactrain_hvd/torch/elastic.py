"""Horovod elastic: ``hvd.elastic.TorchState(model=model, optimizer=opt)`` keeps masks and schedule.

Horovod's ``TorchState`` commits and restores an optimizer through ``state_dict()``, which carries
our masks and schedule position, so a rollback to the last commit rolls them back too. Its sync
after a reset calls ``hvd.broadcast_optimizer_state(opt)``, which is not enough for
``pt.DistributedOptimizer``: it does not send masks, and on a rank without optimizer state (a
worker that just joined) it initialises that state by calling ``opt.step()``, an all-reduce that
ranks with state never join, and which advances the schedule.

Importing ``pactrain_hvd.torch`` registers :class:`PacTrainStateHandler` for our optimizer in
Horovod's handler registry (``horovod.torch.elastic.state.set_handler_registry``, Horovod's own
extension point), so the user's elastic code is Horovod's, unchanged. After every sync all ranks
hold rank 0's optimizer state, masks and schedule position, and the Mask Tracker has proven it.
"""

from __future__ import annotations

from horovod.torch.elastic.state import OptimizerStateHandler, get_handler_registry, set_handler_registry

from pactrain_hvd.torch.functions import broadcast_optimizer_state
from pactrain_hvd.torch.optimizer import DistributedOptimizer


class PacTrainStateHandler(OptimizerStateHandler):
    """``TorchState``'s handler for ``pt.DistributedOptimizer``: save/restore as Horovod's, sync with masks.

    ``sync`` is ``pt.broadcast_optimizer_state(optimizer, root_rank=0)``: Horovod's broadcast, then the Mask
    Tracker's check.

    Args:
        optimizer: the ``pt.DistributedOptimizer`` to save, restore and sync (``TorchState`` passes it).

    Example::

        >>> opt = pt.DistributedOptimizer(opt, named_parameters=model.named_parameters(), sparsity=0.9)
        >>> state = hvd.elastic.TorchState(model=model, optimizer=opt, epoch=0)  # picks this handler
    """

    def sync(self) -> None:
        broadcast_optimizer_state(self.value, root_rank=0)


def register() -> None:
    """Put :class:`PacTrainStateHandler` first in Horovod's registry (idempotent; done on import)."""
    registry = get_handler_registry()
    if not any(handler is PacTrainStateHandler for _, handler in registry):
        set_handler_registry([(DistributedOptimizer, PacTrainStateHandler), *registry])


register()
