"""``BroadcastGlobalVariablesCallback``: every rank starts from rank ``root_rank``'s variables and masks."""

from __future__ import annotations

from typing import Any

import horovod.tensorflow as hvd
import tensorflow as tf

from pactrain_hvd.tensorflow.functions import broadcast_masks, broadcast_variables_at_next_reduction, state_of
from pactrain_hvd.tensorflow.pruning import backing_variable, build_optimizer, optimizer_variables


def _is_built(model: Any) -> bool:
    """Whether the model's weights exist (a ``Sequential`` without ``Input`` gets them at its first call)."""
    return bool(getattr(model, "built", True))


class BroadcastGlobalVariablesCallback(tf.keras.callbacks.Callback):
    """Broadcast model variables, optimizer variables and PacTrain masks from ``root_rank``.

    A built model is broadcast before the first step (masks are ranked on the weights, so ranks
    start equal); the optimizer is built first, so its slots travel too. A model Keras builds at
    its first batch is broadcast inside that batch's reduction, before masks are ranked
    (``broadcast_variables_at_next_reduction``); with an optimizer that is not ours, after the
    first batch, as Horovod's callback does.

    Args:
        root_rank: the rank whose variables every rank takes.
        device: where the broadcasts run, as Horovod's.
        local_variables: a variable or a collection of variables that stay this rank's.

    Example::

        >>> model.fit(x, y, callbacks=[ptk.callbacks.BroadcastGlobalVariablesCallback(0)])
    """

    def __init__(self, root_rank: int = 0, device: str = "", local_variables: Any = None) -> None:
        super().__init__()
        if isinstance(root_rank, bool) or not isinstance(root_rank, int) or root_rank < 0:
            raise ValueError(f"root_rank must be a rank (an int >= 0), got {root_rank!r}")
        if local_variables is None:
            local_variables = []
        elif not isinstance(local_variables, (list, tuple, set)):
            local_variables = [local_variables]
        self.root_rank = root_rank
        self.device = device
        self.broadcast_done = False
        self._local: set[Any] = set()
        for variable in local_variables:
            self.register_local_var(variable)
        self._after_first_batch = False

    def register_local_var(self, var: Any) -> None:
        """``var`` stays this rank's: not broadcast."""
        if not hasattr(var, "assign"):
            raise ValueError(f"local_variables must be variables, got {type(var).__name__}")
        self._local.add(backing_variable(var).ref())

    def _broadcast(self, variables: list[Any]) -> None:
        shared = [backing_variable(v) for v in variables]
        shared = [v for v in shared if v.ref() not in self._local]
        if shared:
            with tf.device(self.device):
                hvd.broadcast_variables(shared, root_rank=self.root_rank)

    def _everything(self) -> list[Any]:
        return [*self.model.variables, *optimizer_variables(self.model.optimizer)]

    def on_train_begin(self, logs: dict | None = None) -> None:
        if self.broadcast_done:
            return
        optimizer = self.model.optimizer
        state = state_of(optimizer)
        if not _is_built(self.model):
            if state is None:
                self._after_first_batch = True
                return
            broadcast_masks(state, self.root_rank)  # a restored state waits for its variables: root's for all
            broadcast_variables_at_next_reduction(state, self.root_rank, self._everything, self.device,
                                                  [v.deref() for v in self._local])
            self.broadcast_done = True
            return
        self._broadcast(list(self.model.variables))
        with tf.init_scope():
            build_optimizer(optimizer, self.model.trainable_variables)
        self._broadcast(optimizer_variables(optimizer))
        if state is not None:
            state.bind(self.model.trainable_variables)
            broadcast_masks(state, self.root_rank)
        self.broadcast_done = True

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if self._after_first_batch:
            self._broadcast(self._everything())
            self._after_first_batch, self.broadcast_done = False, True
