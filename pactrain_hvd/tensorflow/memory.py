"""Error feedback: what rounding left out of a tensor's packed values, added back at its next send.

The interface and its overflow rule are ``core.memory``'s, shared with the torch frontend."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from pactrain_hvd.core.memory import remapped


class ErrorFeedback:
    """Per tensor, the quantization error of the surviving values, added to the next step's values.

    Residuals have the packed length (one per surviving coordinate, none while the plan does not
    pack), in variables of unknown length (``shape=[None]``): a traced step reads whatever length
    the current mask gives, so a mask change needs no retrace. ``remap``, at every mask change,
    keeps the residual of the coordinates that survive (newly packed ones start at 0).
    """

    def __init__(self) -> None:
        self.residuals: dict[str, tf.Variable] = {}

    def track(self, name: str) -> None:
        with tf.init_scope():
            self.residuals[name] = tf.Variable(tf.zeros([0], tf.float32), shape=tf.TensorShape([None]),
                                               trainable=False, name="pactrain_residual")

    def add(self, name: str, values: tf.Tensor) -> tf.Tensor:
        return values + self.residuals[name].read_value()

    def store(self, name: str, values: tf.Tensor, dequantized: tf.Tensor) -> None:
        """This step's quantization error; none from a step that overflowed somewhere (a scale of inf), which
        mixed precision skips on every rank: the memory stays as it was, not inf or nan from then on."""
        error = values - dequantized
        residual = self.residuals[name]
        residual.assign(tf.where(tf.reduce_all(tf.math.is_finite(error)), error, residual.read_value()))

    def commit(self) -> None:
        """Nothing pending: a traced step cannot tell whether it is taken, so each step's error is the memory at
        once (a step mixed precision skips left it as it was: see ``store``)."""

    def discard(self) -> None:
        """Nothing pending to drop (see ``commit``)."""

    def remap(self, name: str, old_indices: np.ndarray, new_indices: np.ndarray, numel: int) -> None:
        """Move ``name``'s residual from the old surviving coordinates to the new ones (eagerly)."""
        self.residuals[name].assign(remapped(self.residuals[name].numpy(), old_indices, new_indices, numel))

    def state_dict(self) -> dict[str, np.ndarray]:
        """The residuals, as host copies by name."""
        return {name: residual.numpy() for name, residual in self.residuals.items()}

    def load_state_dict(self, residuals: dict[str, np.ndarray]) -> None:
        """Residuals of the current packed lengths (checked by the caller), by name."""
        for name, residual in residuals.items():
            self.residuals[name].assign(residual)
