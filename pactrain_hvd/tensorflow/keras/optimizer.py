"""``DistributedOptimizer`` for Keras 3 and tf-keras 2: ``hvd.keras.DistributedOptimizer``, pruned and packed.

Horovod's Keras optimizer all-reduces in ``_compute_gradients`` / ``get_gradients``, which Keras 3's
``train_step`` never calls (it goes from the tape straight to ``apply_gradients``): under Keras 3
it trains without averaging. Ours reduces where every path meets: ``apply`` under Keras 3
(``apply_gradients`` and loss-scale wrappers call it), ``apply_gradients`` under tf-keras 2.

The result is a subclass of the user's optimizer class (so ``isinstance``, ``get_config`` and
saving behave as before) built with an ordinary class statement and zero-argument ``super()``:
it can itself be subclassed, unlike a class generated from a copied ``__dict__``.
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

from pactrain_hvd.core.config import DEFAULT_VERIFY_EVERY
from pactrain_hvd.tensorflow.optimizer import PacTrainState
from pactrain_hvd.tensorflow.pruning import Prunable


class _PacTrainOptimizer:
    """What the distributed optimizer adds to the user's: the state, its reports, sparsity enforcement."""

    pactrain_state: PacTrainState

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
        """Replace the masks by variable name; local, verified across ranks before the next step."""
        self.pactrain_state.set_masks(masks)

    def register_local_var(self, var: Any) -> None:
        """Gradients of ``var`` are not reduced (scaled by 1/size if ``scale_local_gradients``)."""
        self.pactrain_state.register_local(var)

    def _reduce_then_apply(self, grads: Sequence[Any], variables: list[Any], apply: Callable[[list[Any]], Any]) -> Any:
        result = apply(self.pactrain_state.reduce(list(grads), variables))
        self.pactrain_state.enforce(variables)  # whatever the optimizer does with zero gradients
        return result


class _Keras3Apply(_PacTrainOptimizer):
    @tf.autograph.experimental.do_not_convert
    def apply(self, grads: Sequence[Any], trainable_variables: Sequence[Any] | None = None) -> Any:
        if len(grads) == 0 or (trainable_variables is None and not self.built):
            return super().apply(grads, trainable_variables)  # Keras' own no-op or error
        variables = list(self._trainable_variables if trainable_variables is None else trainable_variables)
        base_apply = super().apply
        return self._reduce_then_apply(grads, variables, lambda reduced: base_apply(reduced, trainable_variables))


class _TfKerasApply(_PacTrainOptimizer):
    @tf.autograph.experimental.do_not_convert
    def apply_gradients(self, grads_and_vars: Any, *args: Any, **kwargs: Any) -> Any:
        grads_and_vars = list(grads_and_vars)
        base_apply_gradients = super().apply_gradients
        if not grads_and_vars:
            return base_apply_gradients(grads_and_vars, *args, **kwargs)
        grads, variables = (list(side) for side in zip(*grads_and_vars))
        return self._reduce_then_apply(
            grads, variables, lambda reduced: base_apply_gradients(list(zip(reduced, variables)), *args, **kwargs))


def _is_keras3_optimizer(optimizer_class: type) -> bool:
    return hasattr(optimizer_class, "stateless_apply")


@functools.cache
def _keras_file_entry_class() -> type:
    """Keras 3 writes every ``KerasSaveable`` attribute of the optimizer into ``.keras`` and
    ``.weights.h5`` files: this one carries masks and schedule position there, under
    ``optimizer/pactrain``. A plain Keras optimizer loading such a file never visits it."""
    from keras.src.saving.keras_saveable import KerasSaveable  # Keras 3's (private) saving protocol

    class PacTrainFileEntry(KerasSaveable):
        def __init__(self, state: PacTrainState) -> None:
            self._state = state

        def _obj_type(self) -> str:
            return "Optimizer"  # one of the kinds Keras accepts; it only selects attributes not to walk

        def save_own_variables(self, store: Any) -> None:
            store["state"] = np.frombuffer(self._state.serialize(), dtype=np.uint8)

        def load_own_variables(self, store: Any) -> None:
            if "state" in store.keys():
                self._state.deserialize(np.asarray(store["state"]).tobytes())

    return PacTrainFileEntry


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
    begin_step: int = 0,
    end_step: int = 1000,
    frequency: int = 100,
    prunable: Prunable = None,
    ranking: str = "layer",
    pack_min_numel: int | None = None,
    pack_max_density: float | None = None,
    verify_every: int = DEFAULT_VERIFY_EVERY,
    masks: dict[str, Any] | Any = None,
    continue_pruning: bool = False,
    values: str = "fp32",
) -> Any:
    """Drop-in replacement for ``horovod.tensorflow.keras.DistributedOptimizer`` that prunes and packs.

    Takes every argument of Horovod's with the same defaults, plus PacTrain's (see
    ``PacTrainState``): ``sparsity`` (``0`` behaves like Horovod's optimizer), ``begin_step``,
    ``end_step``, ``frequency``, ``prunable``, ``ranking``, ``pack_min_numel``,
    ``pack_max_density``, ``verify_every``, ``masks``, ``continue_pruning`` (bring your own mask:
    a dict, or the model wrapped by tfmot's ``prune_low_magnitude``) and ``values`` (``"fp32"``,
    ``"fp16"`` or ``"ternary"``: how packed values travel). Works with Keras 3 and tf-keras 2 optimizers, in
    ``model.fit`` and in custom loops (``optimizer.apply_gradients`` reduces: do not also wrap the
    tape). Like Horovod's, it is rebuilt from ``optimizer.get_config()``: wrap before training.

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
    if backward_passes_per_step != 1:
        raise ValueError(f"backward_passes_per_step={backward_passes_per_step!r}: local gradient accumulation is not "
                         "supported by the TensorFlow frontend yet (use 1)")
    if num_groups != 0:
        warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be removed in v0.23.0.",
                      DeprecationWarning, stacklevel=2)
        groups = groups if groups is not None else num_groups
    state = PacTrainState(
        compression=compression, sparse_as_dense=sparse_as_dense, op=op,
        gradient_predivide_factor=gradient_predivide_factor, groups=groups, process_set=process_set,
        device_dense=device_dense, device_sparse=device_sparse, scale_local_gradients=scale_local_gradients,
        sparsity=sparsity, begin_step=begin_step, end_step=end_step, frequency=frequency, prunable=prunable,
        ranking=ranking, pack_min_numel=pack_min_numel, pack_max_density=pack_max_density, verify_every=verify_every,
        masks=masks, continue_pruning=continue_pruning, values=values,
    )
    config = optimizer.get_config()
    if name is not None:
        config["name"] = name
    distributed = _distributed_class(optimizer_class).from_config(config)
    distributed.pactrain_state = state  # tracked: tf.train.Checkpoint(optimizer=...) saves masks and step
    if _is_keras3_optimizer(optimizer_class):
        distributed.pactrain = _keras_file_entry_class()(state)  # and so do model.save / save_weights
    state.optimizer = distributed
    return distributed
