"""``DistributedOptimizer`` for Keras 3 and tf-keras 2: ``hvd.keras.DistributedOptimizer``, pruned and packed.

Horovod's Keras optimizer all-reduces in ``_compute_gradients`` / ``get_gradients``, which Keras 3's
``train_step`` never calls (it goes from the tape straight to ``apply_gradients``): under Keras 3
it trains without averaging. Ours reduces where every path meets: ``apply`` under Keras 3
(``apply_gradients`` and loss-scale wrappers call it), ``apply_gradients`` under tf-keras 2.

The result is a subclass of the user's optimizer class (so ``isinstance``, ``get_config`` and
saving behave as before) and of a mixin written as an ordinary class with zero-argument ``super()``,
the two joined by ``type(name, bases, {})`` (see ``_distributed_class``): it can itself be
subclassed, unlike a class generated from a copied ``__dict__``.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf
from horovod.tensorflow.compression import Compression, Compressor

from pactrain_hvd.core.config import DEFAULT_RANKING, DEFAULT_VERIFY_EVERY
from pactrain_hvd.tensorflow.engine import scale_gradient
from pactrain_hvd.tensorflow.keras.gradient_aggregation import LocalAggregation
from pactrain_hvd.tensorflow.keras.saving import keras_file_entry_class
from pactrain_hvd.tensorflow.pruning import Prunable, build_optimizer
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


class _PacTrainOptimizer:
    """What the distributed optimizer adds to the user's: the state, its reports, sparsity enforcement."""

    pactrain_state: PacTrainState
    _agg_helper: LocalAggregation | None = None

    @property
    def _last_reduction(self) -> _LastReduction:
        if "_pactrain_last_reduction" not in vars(self):
            self._pactrain_last_reduction = _LastReduction()
        return self._pactrain_last_reduction

    @property
    def step_count(self) -> int:
        """Optimizer steps taken: the schedule position."""
        return self.pactrain_state.step_count

    def masks(self) -> dict[str, np.ndarray]:
        """``{variable name: bool mask}`` for every pruned variable (copies)."""
        return self.pactrain_state.masks()

    def stats(self) -> dict:
        """The last step's wire bytes (sent and dense-equivalent), per-tensor density and plan."""
        return self.pactrain_state.stats()

    def set_masks(self, masks: dict[str, Any]) -> None:
        """Replace the masks by variable name; local (see ``PacTrainState.set_masks`` for when ranks are compared)."""
        self.pactrain_state.set_masks(masks)

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
        self.pactrain_state.enforce(variables)  # whatever the optimizer does with zero gradients
        return result

    def _pass_counter(self) -> Any:
        """The variable behind ``iterations`` (Keras 3 divides it by ``gradient_accumulation_steps``)."""
        return getattr(self, "_iterations", None) if hasattr(self, "stateless_apply") else self.iterations


class _Keras3Apply(_PacTrainOptimizer):
    @tf.autograph.experimental.do_not_convert
    def apply(self, grads: Sequence[Any], trainable_variables: Sequence[Any] | None = None) -> Any:
        if len(grads) == 0 or (trainable_variables is None and not self.built):
            return super().apply(grads, trainable_variables)  # Keras' own no-op or error
        variables = list(self._trainable_variables if trainable_variables is None else trainable_variables)
        base_apply = super().apply
        return self._reduce_then_apply(grads, variables, lambda reduced: base_apply(reduced, trainable_variables))


class _TfKerasApply(_PacTrainOptimizer):
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
            self.pactrain_state.enforce(variables)
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
def _agree_on_skipped_steps() -> None:
    """Keras 3's ``LossScaleOptimizer`` (``compile(auto_scale_loss=True)`` under ``mixed_float16``) applies, so
    reduces, only where this rank's gradients are finite: a rank that overflows alone would leave the others
    waiting in the all-reduce. With a PacTrain optimizer inside, its test asks every rank, so all skip together."""
    from keras.optimizers import LossScaleOptimizer  # Keras 3

    local_check = LossScaleOptimizer.check_finite

    def check_finite(self: Any, grads: Sequence[Any]) -> Any:
        finite = local_check(self, grads)
        inner = getattr(self, "inner_optimizer", None)
        return inner.pactrain_state.on_every_rank(finite) if isinstance(inner, _PacTrainOptimizer) else finite

    LossScaleOptimizer.check_finite = check_finite


def _is_keras3_optimizer(optimizer_class: type) -> bool:
    return hasattr(optimizer_class, "stateless_apply")


@functools.cache
def _distributed_class(optimizer_class: type) -> type:
    """One subclass per optimizer class, named like it so saved models load without pactrain_hvd."""
    hooks = _Keras3Apply if _is_keras3_optimizer(optimizer_class) else _TfKerasApply
    return type(optimizer_class.__name__, (hooks, optimizer_class),
                {"__module__": optimizer_class.__module__, "__qualname__": optimizer_class.__qualname__})


def DistributedOptimizer(  # noqa: N802 - the name Horovod users know
    optimizer: Any,
    name: str | None = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: type[Compressor] = Compression.none,
    sparse_as_dense: bool = False,
    gradient_predivide_factor: float = 1.0,
    op: Any = hvd.Average,
    backward_passes_per_step: int = 1,
    average_aggregated_gradients: bool = False,
    num_groups: int = 0,
    groups: int | list | None = None,
    process_set: hvd.ProcessSet = hvd.global_process_set,
    scale_local_gradients: bool = True,
    sparsity: float = 0.9,
    begin_step: int | None = None,
    end_step: int | None = None,
    frequency: int | None = None,
    total_steps: int | None = None,
    prunable: Prunable = None,
    ranking: str = DEFAULT_RANKING,
    pack_min_numel: int | None = None,
    pack_max_density: float | None = None,
    verify_every: int = DEFAULT_VERIFY_EVERY,
    masks: dict[str, Any] | Any = None,
    continue_pruning: bool = False,
    packed_values: str = "inherit",
    values: str | None = None,
) -> Any:
    """Drop-in replacement for ``horovod.tensorflow.keras.DistributedOptimizer`` that prunes and packs.

    Takes every argument of Horovod's with the same defaults, plus PacTrain's (see
    ``PacTrainState``): ``sparsity`` (``0`` behaves like Horovod's optimizer), ``begin_step``,
    ``end_step``, ``frequency``, ``total_steps``, ``prunable``, ``ranking``, ``pack_min_numel``,
    ``pack_max_density``, ``verify_every``, ``masks``, ``continue_pruning`` (bring your own mask:
    a dict, or the model wrapped by tfmot's ``prune_low_magnitude``) and ``packed_values``
    (``"inherit"``, ``"fp16"`` or ``"ternary"``: how packed values travel; ``values`` is its deprecated
    name). Works with Keras 3 and tf-keras 2 optimizers, in ``model.fit`` and in custom loops (``optimizer.apply_gradients`` reduces: do not also wrap the
    tape). Like Horovod's, it is rebuilt from ``optimizer.get_config()``: wrap before training.
    ``backward_passes_per_step`` > 1: gradients are summed locally and reduced every that many calls
    (Horovod's local aggregation, see ``LocalAggregation``); one reduction is one schedule step.

    Use ``pactrain_hvd.tensorflow.keras.callbacks.BroadcastGlobalVariablesCallback``: it makes
    every rank start from the same weights (masks are computed from them) and masks. Horovod's
    ops have no XLA kernels: on GPUs compile with ``jit_compile=False`` (Keras 3 defaults to XLA).

    Example::

        >>> opt = ptk.DistributedOptimizer(keras.optimizers.SGD(0.01, momentum=0.9), sparsity=0.9)
        >>> model.compile(optimizer=opt, loss="sparse_categorical_crossentropy")
        >>> model.fit(x, y, callbacks=[ptk.callbacks.BroadcastGlobalVariablesCallback(0)])
    """
    optimizer_class = type(optimizer)
    if isinstance(optimizer, _PacTrainOptimizer):
        raise TypeError("optimizer is already a pactrain_hvd DistributedOptimizer")
    if not (hasattr(optimizer, "apply_gradients") and hasattr(optimizer, "get_config")
            and hasattr(optimizer_class, "from_config")) or isinstance(optimizer, tf.compat.v1.train.Optimizer):
        raise TypeError(f"optimizer must be a Keras 3 or tf-keras optimizer, got {optimizer_class.__name__}; "
                        "for other training loops use pactrain_hvd.tensorflow.DistributedGradientTape")
    if op not in (hvd.Average, hvd.Sum):
        raise ValueError("op currently only supports Average and Sum")
    if isinstance(backward_passes_per_step, bool) or not isinstance(backward_passes_per_step, int) \
            or backward_passes_per_step <= 0:
        raise ValueError(f"backward_passes_per_step must be an int > 0, got {backward_passes_per_step!r}")
    if not isinstance(average_aggregated_gradients, bool):
        raise TypeError(f"average_aggregated_gradients must be a bool, got {average_aggregated_gradients!r}")
    if num_groups != 0:
        warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be removed in v0.23.0.",
                      DeprecationWarning, stacklevel=2)
        groups = groups if groups is not None else num_groups
    state = PacTrainState(
        compression=compression, sparse_as_dense=sparse_as_dense, op=op,
        gradient_predivide_factor=gradient_predivide_factor, groups=groups, process_set=process_set,
        device_dense=device_dense, device_sparse=device_sparse, scale_local_gradients=scale_local_gradients,
        sparsity=sparsity, begin_step=begin_step, end_step=end_step, frequency=frequency, total_steps=total_steps, prunable=prunable,
        ranking=ranking, pack_min_numel=pack_min_numel, pack_max_density=pack_max_density, verify_every=verify_every,
        masks=masks, continue_pruning=continue_pruning,
        packed_values=packed_values, values=values,
    )
    config = optimizer.get_config()
    if name is not None:
        config["name"] = name
    distributed = _distributed_class(optimizer_class).from_config(config)
    distributed.pactrain_state = state  # tracked: tf.train.Checkpoint(optimizer=...) saves masks and step
    if backward_passes_per_step > 1:
        distributed._agg_helper = LocalAggregation(backward_passes_per_step, average_aggregated_gradients,
                                                   sparse_as_dense)
    if _is_keras3_optimizer(optimizer_class):
        distributed.pactrain = keras_file_entry_class()(state)  # and so do model.save / save_weights
        _agree_on_skipped_steps()
    state.optimizer = distributed
    return distributed
