"""``MetricAverageCallback``: the epoch's metrics averaged over ranks."""

from __future__ import annotations

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf


class MetricAverageCallback(tf.keras.callbacks.Callback):
    """Average the epoch's metrics over ranks, in place in ``logs``, so later callbacks
    (``ReduceLROnPlateau``, ``TensorBoard``, ...) see the average: put it before them.

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
                value = np.asarray(logs[metric], dtype=np.float64)
                averaged = hvd.allreduce(tf.constant(value), op=hvd.Average, name=f"pactrain.metric.{metric}").numpy()
                logs[metric] = float(averaged) if averaged.ndim == 0 else averaged
