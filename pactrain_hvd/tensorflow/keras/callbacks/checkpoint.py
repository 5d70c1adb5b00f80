"""``BestModelCheckpoint``: Horovod's, saving the best model on rank 0 only."""

from __future__ import annotations

from typing import Any

import horovod.tensorflow as hvd
import tensorflow as tf


class BestModelCheckpoint(tf.keras.callbacks.ModelCheckpoint):
    """Save the model (or its weights) whenever ``monitor`` improves, on rank 0 only.

    Horovod's ``BestModelCheckpoint``, with its arguments and defaults: Keras' ``ModelCheckpoint`` with
    ``save_best_only=True``. Horovod's takes no path (its Spark estimator sets ``filepath`` before
    training) and, under Keras 3, fails as it is made (Keras 3 checks the path's suffix there); this one
    takes ``filepath`` as a keyword, or as an attribute set before training. The other ranks neither write
    nor print: with ``ptk.DistributedOptimizer`` every rank holds the same weights and masks, so rank 0's
    file is every rank's. PacTrain's masks and schedule position travel in the file with the optimizer
    (``.keras`` and ``.weights.h5`` under Keras 3).

    Args:
        monitor: the quantity to monitor, e.g. ``"val_loss"`` (average it over ranks with
            ``MetricAverageCallback`` first in the callback list, or ranks would disagree about the best).
        verbose: 1 prints a line when rank 0 saves.
        save_weights_only: save the weights (``.weights.h5``) rather than the whole model (``.keras``).
        mode: ``"auto"``, ``"min"`` or ``"max"``: whether higher or lower ``monitor`` is better.
        save_freq: ``"epoch"``, or a number of batches.
        filepath: where to save; may hold Keras' ``{epoch}`` and metric fields.

    Example::

        >>> callbacks = [ptk.callbacks.BroadcastGlobalVariablesCallback(0), ptk.callbacks.MetricAverageCallback(),
        ...              ptk.callbacks.BestModelCheckpoint(monitor="val_loss", filepath="best.keras")]
    """

    def __init__(self, monitor: str = "val_loss", verbose: int = 0, save_weights_only: bool = False,
                 mode: str = "auto", save_freq: Any = "epoch", filepath: str | None = None) -> None:
        placeholder = "best.weights.h5" if save_weights_only else "best.keras"  # Keras 3 checks the suffix here
        super().__init__(filepath=filepath or placeholder, monitor=monitor, verbose=verbose, save_best_only=True,
                         save_weights_only=save_weights_only, mode=mode, save_freq=save_freq)
        self.filepath = filepath

    def _save_model(self, epoch: int, batch: int | None, logs: dict | None) -> None:
        if hvd.is_initialized() and hvd.rank() != 0:
            return
        if self.filepath is None:
            raise ValueError("BestModelCheckpoint has no filepath: pass filepath= or set .filepath before training")
        super()._save_model(epoch, batch, logs)
