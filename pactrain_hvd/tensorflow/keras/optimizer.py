"""``DistributedOptimizer`` for Keras 3 and tf-keras 2: ``hvd.keras.DistributedOptimizer``, pruned and packed.

Horovod's Keras optimizer all-reduces in ``_compute_gradients`` / ``get_gradients``, which Keras 3's
``train_step`` never calls (it goes from the tape straight to ``apply_gradients``): under Keras 3
it trains without averaging. Ours reduces where every path meets: ``apply`` under Keras 3
(``apply_gradients`` and loss-scale wrappers call it), ``apply_gradients`` under tf-keras 2.

The result is a subclass of the user's optimizer class (so ``isinstance``, ``get_config`` and
saving behave as before) and of a mixin written as an ordinary class with zero-argument ``super()`` (``apply.py``),
the two joined by ``type(name, bases, {})`` (see ``_distributed_class``): it can itself be
subclassed, unlike a class generated from a copied ``__dict__``.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import horovod.tensorflow as hvd
import tensorflow as tf
from horovod.tensorflow.compression import Compression, Compressor

from pactrain_hvd.core.config import passes_per_step
from pactrain_hvd.core.encodings import packed_values_argument
from pactrain_hvd.core.keywords import documents_keywords, pactrain_keywords
from pactrain_hvd.tensorflow.keras.apply import Keras3Apply, PacTrainOptimizer, TfKerasApply, agree_on_skipped_steps
from pactrain_hvd.tensorflow.keras.gradient_aggregation import LocalAggregation
from pactrain_hvd.tensorflow.keras.saving import keras_file_entry_class
from pactrain_hvd.tensorflow.state import PacTrainState


def _is_keras3_optimizer(optimizer_class: type) -> bool:
    return hasattr(optimizer_class, "stateless_apply")


@functools.cache
def _distributed_class(optimizer_class: type) -> type:
    """One subclass per optimizer class, named like it so saved models load without pactrain_hvd."""
    hooks = Keras3Apply if _is_keras3_optimizer(optimizer_class) else TfKerasApply
    return type(optimizer_class.__name__, (hooks, optimizer_class),
                {"__module__": optimizer_class.__module__, "__qualname__": optimizer_class.__qualname__})


@documents_keywords()
@pactrain_keywords()
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
    **pactrain: Any,
) -> Any:
    """Drop-in replacement for ``horovod.tensorflow.keras.DistributedOptimizer`` that prunes and packs.

    Takes every argument of Horovod's with the same defaults, plus PacTrain's keywords. Works with Keras 3 and
    tf-keras 2 optimizers, in ``model.fit`` and in custom loops (``optimizer.apply_gradients`` reduces: do not
    also wrap the tape); local steps (``sync_every``) take their outer sync right after the update. Like
    Horovod's, it is rebuilt from ``optimizer.get_config()``: wrap before training. Use
    ``callbacks.BroadcastGlobalVariablesCallback``: it makes every rank start from the same weights (masks are
    computed from them) and masks. Horovod's ops have no XLA kernels: on GPUs compile with ``jit_compile=False``
    (Keras 3 defaults to XLA).

    Args:
        optimizer: the Keras 3 or tf-keras optimizer to wrap.
        name: as Horovod: the wrapped optimizer's name (default: ``Distributed`` + its class name).
        device_dense: as Horovod: where dense all-reduces run.
        device_sparse: as Horovod: where sparse all-gathers run.
        compression: Horovod's compressor for tensors that travel dense (and packed values that inherit it).
        sparse_as_dense: as Horovod: densify sparse gradients (a pruned variable's must be dense).
        gradient_predivide_factor: as Horovod: divide before the sum and multiply after.
        op: ``hvd.Average`` (default) or ``hvd.Sum``.
        backward_passes_per_step: as Horovod: gradients are summed locally and reduced every that many calls
            (``LocalAggregation``); one reduction is one schedule step.
        average_aggregated_gradients: as Horovod: divide the locally summed gradients by their count.
        num_groups: deprecated, as Horovod: use ``groups``.
        groups: as Horovod; not with fp16 or quantized ``packed_values``.
        process_set: as Horovod: the ranks this optimizer reduces with.
        scale_local_gradients: as Horovod: gradients of local variables are scaled by 1/size.
        {pactrain_keywords}

    Returns:
        An optimizer of the wrapped one's class (Keras' saving and ``get_config`` behave as before) that
        reduces, prunes and packs in ``apply_gradients``; its ``pactrain_state`` holds masks and schedule.

    Example::

        >>> opt = ptk.DistributedOptimizer(keras.optimizers.SGD(0.01, momentum=0.9), sparsity=0.9)
        >>> model.compile(optimizer=opt, loss="sparse_categorical_crossentropy")
        >>> model.fit(x, y, callbacks=[ptk.callbacks.BroadcastGlobalVariablesCallback(0)])
    """
    optimizer_class = type(optimizer)
    if isinstance(optimizer, PacTrainOptimizer):
        raise TypeError("optimizer is already a pactrain_hvd DistributedOptimizer")
    if not (hasattr(optimizer, "apply_gradients") and hasattr(optimizer, "get_config")
            and hasattr(optimizer_class, "from_config")) or isinstance(optimizer, tf.compat.v1.train.Optimizer):
        raise TypeError(f"optimizer must be a Keras 3 or tf-keras optimizer, got {optimizer_class.__name__}; "
                        "for other training loops use pactrain_hvd.tensorflow.DistributedGradientTape")
    if op not in (hvd.Average, hvd.Sum):
        raise ValueError("op currently only supports Average and Sum")
    backward_passes_per_step = passes_per_step(backward_passes_per_step)
    if not isinstance(average_aggregated_gradients, bool):
        raise TypeError(f"average_aggregated_gradients must be a bool, got {average_aggregated_gradients!r}")
    if num_groups != 0:
        warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be removed in v0.23.0.",
                      DeprecationWarning, stacklevel=3)
        groups = groups if groups is not None else num_groups
    # read here, so that a deprecated spelling warns at the caller (this frame, the keyword wrapper's, the caller's)
    pactrain["packed_values"] = packed_values_argument(pactrain.pop("packed_values"), pactrain.pop("values"),
                                                       stacklevel=4)
    state = PacTrainState(
        compression=compression, sparse_as_dense=sparse_as_dense, op=op,
        gradient_predivide_factor=gradient_predivide_factor, groups=groups, process_set=process_set,
        device_dense=device_dense, device_sparse=device_sparse, scale_local_gradients=scale_local_gradients,
        **pactrain,
    )
    state.share_settings(backward_passes_per_step=backward_passes_per_step,
                         average_aggregated_gradients=average_aggregated_gradients)
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
        agree_on_skipped_steps()
    state.optimizer = distributed
    return distributed


def PartialDistributedOptimizer(optimizer: Any, *args: Any, local_layers: Any = None, **kwargs: Any) -> Any:  # noqa: N802
    """``hvd.PartialDistributedOptimizer``: the trainable weights of ``local_layers`` are not reduced.

    Their gradients are scaled by ``1 / size`` where ``scale_local_gradients``, as Horovod's; every other
    argument (``*args``, ``**kwargs``) as ``DistributedOptimizer``, Horovod's and PacTrain's included.

    Args:
        optimizer: the Keras 3 or tf-keras optimizer to wrap, as ``hvd.PartialDistributedOptimizer``'s.
        local_layers: a built Keras layer or a list of them whose trainable weights stay local; None: none.

    Returns:
        The ``DistributedOptimizer`` made from ``optimizer``, with those weights registered as local.

    Raises:
        ValueError: ``local_layers`` is not a Keras layer or a list of them.

    Example::

        >>> opt = ptk.PartialDistributedOptimizer(keras.optimizers.SGD(0.01), local_layers=[model.layers[-1]],
        ...                                       sparsity=0.9)
    """
    layers = [] if local_layers is None else [local_layers] if hasattr(local_layers, "trainable_weights") \
        else list(local_layers)
    if not all(hasattr(layer, "trainable_weights") for layer in layers):
        raise ValueError("local_layers must be a Keras layer or a list of Keras layers")
    distributed = DistributedOptimizer(optimizer, *args, **kwargs)
    for layer in layers:
        for weight in layer.trainable_weights:
            distributed.pactrain_state.register_local(weight)
    return distributed
