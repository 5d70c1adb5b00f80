"""Keras callbacks for PacTrain, for Keras 3 (where Horovod's fail on ``Variable.ref``) and tf-keras 2."""

from __future__ import annotations

from typing import Any

import horovod.tensorflow as hvd
import tensorflow as tf

from pactrain_hvd.tensorflow.functions import broadcast_masks, state_of
from pactrain_hvd.tensorflow.pruning import backing_variable, build_optimizer, optimizer_variables


class BroadcastGlobalVariablesCallback(tf.keras.callbacks.Callback):
    """Broadcast model variables, optimizer variables and PacTrain masks from ``root_rank``.

    Unlike Horovod's callback, which broadcasts after the first batch, this one broadcasts
    before the first step: masks are computed from the weights, so ranks must start equal. It
    builds the optimizer first, so its slots exist and travel too.

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
        self._local = {backing_variable(v).ref() for v in local_variables}

    def _broadcast(self, variables: list[Any]) -> None:
        shared = [backing_variable(v) for v in variables]
        shared = [v for v in shared if v.ref() not in self._local]
        if shared:
            with tf.device(self.device):
                hvd.broadcast_variables(shared, root_rank=self.root_rank)

    def on_train_begin(self, logs: dict | None = None) -> None:
        self._broadcast(list(self.model.variables))
        optimizer = self.model.optimizer
        with tf.init_scope():
            build_optimizer(optimizer, self.model.trainable_variables)
        self._broadcast(optimizer_variables(optimizer))
        state = state_of(optimizer)
        if state is not None:
            state.bind(self.model.trainable_variables)
            broadcast_masks(state, self.root_rank)


class MetricAverageCallback(tf.keras.callbacks.Callback):
    """Average the epoch's metrics over ranks (as Horovod's, which Keras 3 cannot run).

    Example::

        >>> model.fit(x, y, callbacks=[ptk.callbacks.BroadcastGlobalVariablesCallback(0),
        ...                            ptk.callbacks.MetricAverageCallback()])
    """

    def __init__(self, device: str = "") -> None:
        super().__init__()
        self.device = device

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if not logs:
            return
        with tf.device(self.device):
            for metric in sorted(logs):  # the same order on every rank
                value = tf.constant(float(logs[metric]), tf.float64)
                logs[metric] = float(hvd.allreduce(value, op=hvd.Average, name=f"pactrain.metric.{metric}"))
