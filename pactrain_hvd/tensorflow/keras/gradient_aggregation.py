"""Horovod's local gradient aggregation (``backward_passes_per_step``), for the Keras optimizer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from pactrain_hvd.tensorflow.pruning import backing_variable


class LocalAggregation:
    """``backward_passes_per_step``, as Horovod: gradients are summed locally, and every ``passes``-th call
    the sums are reduced (one PacTrain step) and applied (divided by ``passes`` if ``average``); other calls
    only count an optimizer iteration. ``counter`` (and the optimizer attribute ``_agg_helper``) are
    Horovod's names: its tests read them."""

    def __init__(self, passes: int, average: bool, sparse_as_dense: bool) -> None:
        self.passes = passes
        self.average = average
        self.sparse_as_dense = sparse_as_dense
        self._sums: dict[Any, tf.Variable] = {}
        with tf.init_scope():
            self.counter = tf.Variable(0, dtype=tf.int32, trainable=False, name="pactrain_aggregation_counter")

    def add(self, grads: Sequence[Any], variables: Sequence[Any]) -> list[Any]:
        """This pass's gradients added to the sums; the sums so far (``None`` where there is no gradient)."""
        sums = []
        for grad, variable in zip(grads, variables):
            if isinstance(grad, tf.IndexedSlices):
                if not self.sparse_as_dense:
                    raise ValueError("backward_passes_per_step > 1 sums gradients locally, which needs dense ones: a "
                                     "gradient is tf.IndexedSlices, pass sparse_as_dense=True")
                grad = tf.convert_to_tensor(grad)
            sums.append(None if grad is None else tf.convert_to_tensor(self._sum_of(variable, grad).assign_add(grad)))
        return sums

    def _sum_of(self, variable: Any, grad: tf.Tensor) -> tf.Variable:
        key = backing_variable(variable).ref()
        if key not in self._sums:
            with tf.init_scope():
                self._sums[key] = tf.Variable(tf.zeros(grad.shape, grad.dtype), trainable=False,
                                              name="pactrain_aggregated_gradient")
        return self._sums[key]

    def clear(self) -> None:
        """Zero (not subtract: an inf stays out of the next sums) and restart the count."""
        for total in self._sums.values():
            total.assign(tf.zeros_like(total))
        self.counter.assign(0)
