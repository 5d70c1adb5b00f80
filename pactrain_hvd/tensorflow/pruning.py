"""Masks of the prunable variables: computed by magnitude, proven equal on every rank."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from pactrain_hvd.core import PolynomialSchedule, select_prunable_names
from pactrain_hvd.core.pruner import HostPruner

Prunable = Callable[[str, tf.Variable], bool] | Iterable[str] | None


def communicates(process_set: hvd.ProcessSet) -> bool:
    """Horovod's rule for its gradient reduction: members of the process set only, and only with another rank
    to talk to, or under Horovod elastic (where ranks may join). Otherwise nothing collective happens."""
    return process_set.included() and (process_set.size() > 1 or bool(int(os.environ.get("HOROVOD_ELASTIC", 0))))


def safe_name(text: str) -> str:
    """``text`` with every character that TF and Horovod op and variable names refuse replaced by ``_``."""
    return re.sub("[^a-zA-Z0-9_]", "_", text)


def run_if(condition: Any, action: Callable[[], tf.Tensor]) -> tf.Tensor:
    """``action()`` where ``condition`` holds, as a graph-safe ``if`` (``tf.cond``); its result, else False."""
    return tf.cond(condition, action, lambda: tf.constant(False))


def backing_variable(variable: Any) -> tf.Variable:
    """The ``tf.Variable`` behind a TF, tf-keras or Keras 3 variable (Keras 3 wraps one in ``.value``)."""
    if isinstance(variable, tf.Variable):
        return variable
    value = getattr(variable, "value", None)
    if isinstance(value, tf.Variable):
        return value
    raise TypeError(f"expected a tf.Variable or a Keras variable, got {type(variable).__name__}")


def variable_names(variables: Sequence[Any]) -> list[str]:
    """Keras 3 ``path`` or TF ``name``, made unique by position where TF names repeat."""
    names = [getattr(v, "path", None) or backing_variable(v).name for v in variables]
    seen: dict[str, int] = {}
    unique = []
    for name in names:
        count = seen.get(name, 0)
        seen[name] = count + 1
        unique.append(name if count == 0 else f"{name}#{count}")
    return unique


def default_prunable(name: str, variable: tf.Variable) -> bool:
    """Conv, dense and embedding kernels (>= 2-D); biases and norm scales stay dense.

    Args:
        name: the variable's name (unused: the rule goes by shape).
        variable: the variable.

    Returns:
        True where ``variable`` has a known rank of two or more.
    """
    return variable.shape.rank is not None and variable.shape.rank >= 2


def select_prunable(named_variables: Mapping[str, tf.Variable], prunable: Prunable) -> list[str]:
    """Names to prune: by predicate ``(name, variable) -> bool`` or by glob patterns on names."""
    return select_prunable_names(named_variables, prunable, default_prunable, lambda variable: variable.trainable)


def _variable_index(optimizer: Any, variable: tf.Variable) -> tuple[int, int] | None:
    """(position, count) of ``variable`` among the variables a Keras 3 / tf-keras optimizer was built on."""
    indices = getattr(optimizer, "_trainable_variables_indices", None)  # Keras 3
    if indices is None:
        indices = getattr(optimizer, "_index_dict", None)  # tf-keras 2
    if not indices or not hasattr(optimizer, "_var_key"):
        return None
    position = indices.get(optimizer._var_key(variable))
    return None if position is None else (position, len(indices))


def optimizer_slots(optimizer: Any, variable: Any) -> list[tf.Variable]:
    """The optimizer's per-coordinate state for ``variable`` (momentum, Adam moments, ...).

    Legacy optimizers answer ``get_slot``. Keras 3 and tf-keras 2 optimizers keep one list per
    kind of slot, aligned with the variables they were built on (``SGD.momentums``,
    ``Adam._momentums``...): every such list is found by that alignment, so optimizers we
    have never seen are covered too. Slots of another shape (Adafactor's factors) are skipped.
    """
    if optimizer is None:
        return []
    if hasattr(optimizer, "get_slot_names"):
        slots = [optimizer.get_slot(variable, name) for name in optimizer.get_slot_names()]
        return [backing_variable(s) for s in slots if s is not None and s.shape == variable.shape]
    located = _variable_index(optimizer, variable)
    if located is None:
        return []
    position, count = located
    slots = []
    for attribute, value in vars(optimizer).items():
        if attribute in ("_variables", "_trainable_variables") or not isinstance(value, list) or len(value) != count:
            continue
        slot = value[position]
        if slot is not None and slot is not variable and hasattr(slot, "assign") and slot.shape == variable.shape:
            slots.append(backing_variable(slot))
    return slots


def optimizer_variables(optimizer: Any) -> list[Any]:
    """Keras 3: a list property; tf-keras 2: a callable list; legacy optimizers: a method."""
    variables = getattr(optimizer, "variables", [])
    return list(variables() if callable(variables) else variables)


def build_optimizer(optimizer: Any, variables: Sequence[Any]) -> None:
    """Create the optimizer's slots now if it has none yet (call under ``tf.init_scope``).

    A traced step clears slots at newly pruned coordinates with graph ops, so the slots must
    exist when the step is traced: Keras would create them later in the same trace, inside
    ``apply_gradients``, out of reach of ops traced before it.
    """
    if optimizer is None:
        return
    variables = list(variables)
    if hasattr(optimizer, "get_slot_names"):  # tf-keras legacy optimizer: creates only missing slots
        optimizer._create_all_weights(variables)
    elif hasattr(optimizer, "stateless_apply"):  # Keras 3
        if not optimizer.built:
            optimizer.build(variables)
    elif hasattr(optimizer, "build") and not getattr(optimizer, "_built", False):  # tf-keras 2
        optimizer.build(variables)


class Pruner(HostPruner):
    """What persists between steps for pruning: the host masks, and the Mask Tracker check
    (``core.pruner.HostPruner``: ``rank``, ``validate``, ``verify``, ``sparsity``). Everything here runs
    eagerly (between steps, or inside the maintenance ``py_function``); nothing is checked where nothing is
    communicated (``communicates``).

    Args:
        named_variables: the variables by name.
        prunable_names: names of the variables to prune (keys of ``named_variables``).
        schedule: the sparsity schedule that masks are ranked to.
        ranking: how the target sparsity is spread over tensors: ``"layer"``, ``"erk"`` or ``"global"``.
        process_set: the Horovod process set whose ranks must hold equal masks.
        settings: settings the Mask Tracker proves equal on every rank along with the masks.
    """

    framework, kind = "tensorflow", "variables"
    hint = ("After loading a checkpoint on one rank, call pactrain_hvd.tensorflow.broadcast_masks "
            "(state, optimizer or tape) next to hvd.broadcast_variables.")

    def __init__(self, named_variables: Mapping[str, tf.Variable], prunable_names: list[str],
                 schedule: PolynomialSchedule, ranking: str = "layer",
                 process_set: hvd.ProcessSet = hvd.global_process_set, settings: Mapping[str, Any] | None = None) -> None:
        super().__init__(prunable_names, schedule, ranking, settings)
        self.variables = dict(named_variables)
        self.process_set = process_set
        self.masks: dict[str, np.ndarray] = {}

    def install(self, masks: Mapping[str, np.ndarray]) -> None:
        """Replace all masks with validated host masks (the variables are zeroed by the caller)."""
        self.masks = {name: np.array(mask, dtype=np.bool_) for name, mask in masks.items()}

    # -- the tensor operations HostPruner asks for ---------------------------------------------------
    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.variables[name].shape)

    def host_weights(self) -> dict[str, np.ndarray]:
        return {name: self.variables[name].numpy() for name in self.prunable_names}

    def host_masks(self) -> dict[str, np.ndarray]:
        return self.masks

    def weight_sums(self, weights: Mapping[str, np.ndarray] | None) -> dict[str, float]:
        if weights is None:
            return {name: float(tf.reduce_sum(tf.cast(self.variables[name], tf.float64)))
                    for name in self.prunable_names}
        return {name: float(np.sum(weights[name], dtype=np.float64)) for name in self.prunable_names}

    def communicates(self) -> bool:
        return communicates(self.process_set)

    def allgather(self, table: np.ndarray) -> tuple[np.ndarray, int]:
        gathered = hvd.allgather(tf.constant(table), name="pactrain.mask_fingerprints", process_set=self.process_set)
        return gathered.numpy(), self.process_set.size()
