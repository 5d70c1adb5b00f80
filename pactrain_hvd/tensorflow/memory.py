"""Error feedback: what rounding left out of a tensor's packed values, added back at its next send."""

from __future__ import annotations

import numpy as np
import tensorflow as tf


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

    def remap(self, name: str, old_indices: np.ndarray, new_indices: np.ndarray, numel: int) -> None:
        """Move ``name``'s residual from the old surviving coordinates to the new ones (eagerly)."""
        dense = np.zeros(numel, np.float32)
        dense[old_indices] = self.residuals[name].numpy()
        self.residuals[name].assign(dense[new_indices])
