"""Where Keras' apply paths meet the reduction: the mixin that ``DistributedOptimizer`` puts before the user's
optimizer class (``apply`` under Keras 3; ``apply_gradients`` and the loss scaler's aggregation under tf-keras 2),
with local aggregation, enforcement of zeros, and agreement on skipped mixed-precision steps."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from pactrain_hvd.core.facade import StateReadings
from pactrain_hvd.tensorflow.engine import scale_gradient
from pactrain_hvd.tensorflow.keras.gradient_aggregation import LocalAggregation
from pactrain_hvd.tensorflow.pruning import build_optimizer
from pactrain_hvd.tensorflow.state import PacTrainState


class _LastReduction:
    """The gradients the last reduction gave (a plain object: Keras tracks the lists of its optimizers)."""

    def __init__(self) -> None:
        self.grads: tuple[Any, ...] = ()

    def remember(self, grads: Sequence[Any]) -> None:
        self.grads = tuple(grad for grad in grads if grad is not None)

    def gave(self, grads: Sequence[Any]) -> bool:
        present = [grad for grad in grads if grad is not None]
        return bool(present) and len(present) == len(self.grads) and all(a is b for a, b in zip(present, self.grads))


class PacTrainOptimizer(StateReadings):
    """What the distributed optimizer adds to the user's: the state, its reports, sparsity enforcement."""

    pactrain_state: PacTrainState
    _agg_helper: LocalAggregation | None = None

    @property
    def _last_reduction(self) -> _LastReduction:
        if "_pactrain_last_reduction" not in vars(self):
            self._pactrain_last_reduction = _LastReduction()
        return self._pactrain_last_reduction

    def register_local_var(self, var: Any) -> None:
        """Gradients of ``var`` are not reduced (scaled by 1/size if ``scale_local_gradients``)."""
        self.pactrain_state.register_local(var)

    def _reduce_then_apply(self, grads: Sequence[Any], variables: list[Any], apply: Callable[[list[Any]], Any]) -> Any:
        aggregation = self._agg_helper
        if aggregation is None:
            return self._reduce_apply_enforce(grads, variables, apply)
        with tf.init_scope():  # slots exist before the branch that applies
            build_optimizer(self, variables)
        sums = aggregation.add(grads, variables)
        count = aggregation.counter.assign_add(1)

        def reduce_and_apply() -> tf.Tensor:
            self._reduce_apply_enforce(sums, variables, apply, 1.0 / aggregation.passes if aggregation.average else 1.0)
            aggregation.clear()
            return tf.constant(True)

        def count_the_pass() -> tf.Tensor:
            self._pass_counter().assign_add(1)
            return tf.constant(False)

        tf.cond(tf.equal(count, aggregation.passes), reduce_and_apply, count_the_pass)
        return None

    def _reduce_apply_enforce(self, grads: Sequence[Any], variables: list[Any], apply: Callable[[list[Any]], Any],
                              scale: float = 1.0) -> Any:
        reduced = self.pactrain_state.reduce(list(grads), variables)
        if scale != 1.0:  # after the reduction, as Horovod divides aggregated gradients
            reduced = [None if grad is None else grad * scale for grad in reduced]
        self._last_reduction.remember(reduced)
        result = apply(reduced)
        self._after_update(variables)
        return result

    def _after_update(self, variables: list[Any]) -> None:
        self.pactrain_state.enforce(variables)  # whatever the optimizer does with zero gradients
        self.pactrain_state.sync_if_due()  # local steps: the outer sync where an interval ended

    def _pass_counter(self) -> Any:
        """The variable behind ``iterations`` (Keras 3 divides it by ``gradient_accumulation_steps``)."""
        return getattr(self, "_iterations", None) if hasattr(self, "stateless_apply") else self.iterations


class Keras3Apply(PacTrainOptimizer):
    @tf.autograph.experimental.do_not_convert
    def apply(self, grads: Sequence[Any], trainable_variables: Sequence[Any] | None = None) -> Any:
        if len(grads) == 0 or (trainable_variables is None and not self.built):
            return super().apply(grads, trainable_variables)  # Keras' own no-op or error
        variables = list(self._trainable_variables if trainable_variables is None else trainable_variables)
        base_apply = super().apply
        return self._reduce_then_apply(grads, variables, lambda reduced: base_apply(reduced, trainable_variables))


class TfKerasApply(PacTrainOptimizer):
    """tf-keras 2 reduces in ``apply_gradients``, or before: its ``LossScaleOptimizer`` asks the inner optimizer
    to aggregate before testing the gradients for inf/nan (so that every rank skips a step together), and what
    was reduced there is not reduced again."""

    @tf.autograph.experimental.do_not_convert
    def apply_gradients(self, grads_and_vars: Any, *args: Any, **kwargs: Any) -> Any:
        grads_and_vars = list(grads_and_vars)
        base_apply_gradients = super().apply_gradients
        if not grads_and_vars:
            return base_apply_gradients(grads_and_vars, *args, **kwargs)
        grads, variables = (list(side) for side in zip(*grads_and_vars))
        if self._last_reduction.gave(grads):
            result = base_apply_gradients(grads_and_vars, *args, **kwargs)
            self._after_update(variables)
            return result
        return self._reduce_then_apply(
            grads, variables, lambda reduced: base_apply_gradients(list(zip(reduced, variables)), *args, **kwargs))

    def aggregate_gradients(self, grads_and_vars: Any) -> list:
        return self._reduce_for_loss_scaling(grads_and_vars, super().aggregate_gradients)

    def _aggregate_gradients(self, grads_and_vars: Any) -> list:  # tf-keras 2 legacy optimizers
        return self._reduce_for_loss_scaling(grads_and_vars, super()._aggregate_gradients)

    @tf.autograph.experimental.do_not_convert
    def _reduce_for_loss_scaling(self, grads_and_vars: Any, aggregate: Callable[[list], Any]) -> list:
        grads_and_vars = list(grads_and_vars)
        if not grads_and_vars or self._last_reduction.gave([grad for grad, _ in grads_and_vars]):
            return grads_and_vars  # apply_gradients' own call, after reducing
        grads, variables = (list(side) for side in zip(*aggregate(grads_and_vars)))  # tf.distribute's (a copy)
        if self._agg_helper is not None:  # summed here, reduced later: share only the verdict (nan for all)
            finite = self.pactrain_state.on_every_rank(tf.reduce_all([_all_finite(g) for g in grads if g is not None]))
            factor = tf.where(finite, 1.0, float("nan"))
            grads = [None if g is None else scale_gradient(g, tf.cast(factor, g.dtype)) for g in grads]
        else:
            grads = self.pactrain_state.reduce(grads, variables)
            self._last_reduction.remember(grads)
        return list(zip(grads, variables))


def _all_finite(grad: Any) -> tf.Tensor:
    return tf.reduce_all(tf.math.is_finite(grad.values if isinstance(grad, tf.IndexedSlices) else grad))


@functools.cache
def agree_on_skipped_steps() -> None:
    """Keras 3's ``LossScaleOptimizer`` (``compile(auto_scale_loss=True)`` under ``mixed_float16``) applies, so
    reduces, only where this rank's gradients are finite: a rank that overflows alone would leave the others
    waiting in the all-reduce. With a PacTrain optimizer inside, its test asks every rank, so all skip together."""
    from keras.optimizers import LossScaleOptimizer  # Keras 3

    local_check = LossScaleOptimizer.check_finite

    def check_finite(self: Any, grads: Sequence[Any]) -> Any:
        finite = local_check(self, grads)
        inner = getattr(self, "inner_optimizer", None)
        return inner.pactrain_state.on_every_rank(finite) if isinstance(inner, PacTrainOptimizer) else finite

    LossScaleOptimizer.check_finite = check_finite
