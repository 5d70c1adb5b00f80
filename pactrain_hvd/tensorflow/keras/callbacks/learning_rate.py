"""``LearningRateScheduleCallback`` and ``LearningRateWarmupCallback``: Horovod's learning-rate callbacks, with
momentum correction where the optimizer holds its momentum in a variable."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf


def _learning_rate(optimizer: Any) -> float:
    return float(np.asarray(_settable_learning_rate(optimizer)))


def _settable_learning_rate(optimizer: Any) -> Any:
    held = getattr(getattr(optimizer, "inner_optimizer", optimizer), "_learning_rate", None)
    learning_rate = optimizer.learning_rate
    if isinstance(held, tf.keras.optimizers.schedules.LearningRateSchedule):
        learning_rate = held
    if hasattr(learning_rate, "assign") or isinstance(learning_rate, (int, float)):
        return learning_rate
    raise ValueError(f"the optimizer's learning rate is a schedule ({type(learning_rate).__name__}): a "
                     "learning-rate callback needs a number or a variable to set")


def _set_learning_rate(optimizer: Any, value: float) -> None:
    learning_rate = _settable_learning_rate(optimizer)
    if hasattr(learning_rate, "assign"):
        learning_rate.assign(value)
    else:
        optimizer.learning_rate = value


class LearningRateScheduleCallback(tf.keras.callbacks.Callback):
    """Horovod's: between ``start_epoch`` and ``end_epoch`` (exclusive) the learning rate is
    ``initial_lr * multiplier``, with ``multiplier`` a number (``multiplier ** (epoch - start_epoch)``)
    or a function of the epoch; ``staircase=True``: set at each epoch's first batch with an integer
    epoch, else at every batch with ``epoch + batch / steps_per_epoch`` (autodetected from ``fit``).

    Args:
        initial_lr: the learning rate at the start of training.
        multiplier: a number, or a function ``epoch -> factor``.
        start_epoch: the first epoch adjusted.
        end_epoch: the first epoch no longer adjusted (None: none).
        staircase: adjust per epoch (True) or per batch (False).
        momentum_correction: scale the momentum by new/old learning rate for the batch that changes it
            (only where the optimizer holds its momentum in a variable; see the module's docstring).
        steps_per_epoch: batches per epoch, if ``fit`` cannot tell (a dataset of unknown length).
    """

    def __init__(self, initial_lr: float, multiplier: float | Callable[[float], float], start_epoch: int = 0,
                 end_epoch: int | None = None, staircase: bool = True, momentum_correction: bool = True,
                 steps_per_epoch: int | None = None) -> None:
        super().__init__()
        if initial_lr is None or isinstance(initial_lr, bool) or not isinstance(initial_lr, (int, float)) \
                or not np.isfinite(initial_lr) or initial_lr < 0:
            raise ValueError(f"initial_lr must be a learning rate (a finite number >= 0), got {initial_lr!r}")
        if isinstance(start_epoch, bool) or not isinstance(start_epoch, int) or start_epoch < 0:
            raise ValueError(f"start_epoch must be an int >= 0, got {start_epoch!r}")
        if end_epoch is not None and (isinstance(end_epoch, bool) or not isinstance(end_epoch, int)
                                      or end_epoch <= start_epoch):
            raise ValueError(f"end_epoch must be None or an int > start_epoch ({start_epoch}), got {end_epoch!r}")
        if steps_per_epoch is not None and (isinstance(steps_per_epoch, bool) or not isinstance(steps_per_epoch, int)
                                            or steps_per_epoch <= 0):
            raise ValueError(f"steps_per_epoch must be None or an int > 0, got {steps_per_epoch!r}")
        if not callable(multiplier):
            if isinstance(multiplier, bool) or not isinstance(multiplier, (int, float)):
                raise ValueError(f"multiplier must be a number or a function of the epoch, got {multiplier!r}")
            factor = float(multiplier)
            multiplier = lambda epoch: factor ** (epoch - start_epoch)  # noqa: E731 - Horovod's exponential decay
        self.initial_lr = float(initial_lr)
        self.multiplier = multiplier
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = bool(staircase)
        self.momentum_correction = bool(momentum_correction)
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch: int | None = None
        self.restore_momentum: Any = None
        self._warned_momentum = False

    def _autodetect_steps_per_epoch(self) -> int:
        steps = self.params.get("steps")
        if steps:
            return int(steps)
        if self.params.get("samples") and self.params.get("batch_size"):
            return self.params["samples"] // self.params["batch_size"]
        raise ValueError(f"{type(self).__name__}: fit does not know the number of batches per epoch (a dataset of "
                         "unknown length): pass steps_per_epoch")

    def _momentum_variable(self) -> Any:
        """The optimizer's momentum if a variable holds it (so a traced step reads the new value), else None."""
        optimizer = getattr(self.model.optimizer, "inner_optimizer", self.model.optimizer)
        momentum = getattr(optimizer, "momentum", None)
        if momentum is None or hasattr(momentum, "assign"):
            return momentum
        if not momentum:
            return None  # no momentum to correct
        if not self._warned_momentum:
            warnings.warn(f"{type(self).__name__}: momentum_correction skipped: {type(optimizer).__name__} holds its "
                          "momentum as a Python number, a constant of the traced training step", stacklevel=3)
            self._warned_momentum = True
        return None

    def _adjust_learning_rate(self, epoch: float) -> None:
        optimizer = self.model.optimizer
        old_lr = _learning_rate(optimizer)
        new_lr = self.initial_lr * self.multiplier(epoch)
        _set_learning_rate(optimizer, new_lr)
        if self.momentum_correction and old_lr > 0:
            momentum = self._momentum_variable()
            if momentum is not None:
                self.restore_momentum = float(np.asarray(momentum))
                momentum.assign(self.restore_momentum * new_lr / old_lr)

    def _restore_momentum_if_needed(self) -> None:
        if self.restore_momentum is not None:
            self._momentum_variable().assign(self.restore_momentum)
            self.restore_momentum = None

    def on_train_begin(self, logs: dict | None = None) -> None:
        _settable_learning_rate(self.model.optimizer)  # a schedule is refused before the first step
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = self._autodetect_steps_per_epoch()

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self.current_epoch = epoch

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        if self.current_epoch < self.start_epoch or (self.end_epoch is not None and self.current_epoch >= self.end_epoch):
            return
        if self.staircase and batch == 0:
            self._adjust_learning_rate(self.current_epoch)
        elif not self.staircase:
            self._adjust_learning_rate(self.current_epoch + float(batch) / self.steps_per_epoch)

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self._restore_momentum_if_needed()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if logs is not None:
            logs["lr"] = _learning_rate(self.model.optimizer)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Horovod's gradual warm-up ("Accurate, Large Minibatch SGD"): the learning rate goes from
    ``initial_lr / size`` to ``initial_lr`` over ``warmup_epochs``, per batch.

    Args:
        initial_lr: the learning rate reached at the end of the warm-up (usually already scaled by size).
        warmup_epochs: epochs of warm-up.
        momentum_correction: as ``LearningRateScheduleCallback``'s.
        steps_per_epoch: batches per epoch, if ``fit`` cannot tell.
        verbose: 1: rank 0 prints the learning rate reached at the end of the warm-up.

    Example::

        >>> callbacks = [ptk.callbacks.BroadcastGlobalVariablesCallback(0), ptk.callbacks.MetricAverageCallback(),
        ...              ptk.callbacks.LearningRateWarmupCallback(initial_lr=0.01 * hvd.size(), warmup_epochs=3)]
    """

    def __init__(self, initial_lr: float, warmup_epochs: int = 5, momentum_correction: bool = True,
                 steps_per_epoch: int | None = None, verbose: int = 0) -> None:
        if isinstance(warmup_epochs, bool) or not isinstance(warmup_epochs, int) or warmup_epochs <= 0:
            raise ValueError(f"warmup_epochs must be an int > 0, got {warmup_epochs!r}")

        def multiplier(epoch: float) -> float:
            epoch += 1.0 / self.steps_per_epoch  # round numbers at each epoch's end, as Horovod's
            return 1.0 / hvd.size() * (epoch * (hvd.size() - 1) / warmup_epochs + 1)

        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs, staircase=False,
                         momentum_correction=momentum_correction, steps_per_epoch=steps_per_epoch)
        self.warmup_epochs = warmup_epochs
        self.verbose = verbose

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        super().on_epoch_end(epoch, logs)
        if epoch == self.end_epoch - 1 and self.verbose > 0 and hvd.rank() == 0:
            print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to {_learning_rate(self.model.optimizer):g}.")
