"""``Binding``: variables join a ``PacTrainState``: names, positions, what is prunable, what stays local.

The state binds to the variables of its first reduction (more may join later), inside ``tf.function``
too; masks of its own (given, or restored before binding) are installed once the names are known.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from pactrain_hvd.core.checkpoint import SavedState, from_npz
from pactrain_hvd.tensorflow.bound import BoundTensors
from pactrain_hvd.tensorflow.compression import PacTrainCompressor
from pactrain_hvd.tensorflow.maintenance import Maintenance
from pactrain_hvd.tensorflow.pruning import backing_variable, select_prunable, variable_names


class Binding:
    """Adds variables to ``bound``, installing masks of the state's own at the first binding.

    Args:
        bound: the record variables join.
        maintenance: installs masks (its zeroing deferred to the graph where a trace creates the variables).
        prunable: the state's ``prunable`` (predicate, patterns or None: every variable ``select_prunable`` takes).
        compression: Horovod's compressor, for the values of tensors that are not packed.
        own_masks: ``core.own_masks`` masks to resolve against the first names, or None.
        restore: installs a ``core.checkpoint.SavedState`` into the bound variables.
    """

    def __init__(self, bound: BoundTensors, maintenance: Maintenance, prunable: Any, compression: Any,
                 own_masks: Any, restore: Callable[[SavedState], None]) -> None:
        self.bound = bound
        self.maintenance = maintenance
        self.prunable = prunable
        self.compression = compression
        self.own_masks = own_masks
        self.restore = restore
        self.pending_restore: bytes | None = None  # a checkpoint restored before binding, applied at it
        self.local: set[Any] = set()

    def register_local(self, variable: Any) -> None:
        self.local.add(backing_variable(variable).ref())

    def is_local(self, variable: Any) -> bool:
        return backing_variable(variable).ref() in self.local

    @tf.autograph.experimental.do_not_convert
    def bind(self, variables: Sequence[Any]) -> tuple[int, ...]:
        """Register variables (idempotent); returns their positions. Safe inside ``tf.function``."""
        bound = self.bound
        backing = [backing_variable(v) for v in variables]
        new = [(v, b) for v, b in zip(variables, backing) if b.ref() not in bound.positions]
        if new:
            tracing = not tf.executing_eagerly()
            with tf.init_scope():
                # Variables a trace creates (a model Keras builds at its first call) hold their values only when
                # the traced step runs: masks installed now are applied to them by the step's graph ops.
                with self.maintenance.deferred_zeroing(tracing and not all(bool(b.is_initialized()) for _, b in new)):
                    self._register(new)
        return tuple(bound.positions[b.ref()] for b in backing)

    def _register(self, new: list[tuple[Any, tf.Variable]]) -> None:
        bound = self.bound
        names = variable_names([v for v, _ in new])
        clashes = sorted(set(names) & set(bound.names))
        if clashes:
            raise ValueError(f"variables named {', '.join(clashes)} are already bound to this PacTrainState under the "
                             "same names: use one state per set of variables")
        named = dict(zip(names, (b for _, b in new)))
        own_masks = {}
        if self.own_masks is not None:  # the first binding: names are known now
            own_masks, tfmot_masks = self.own_masks.resolve(named)
            self.maintenance.tfmot_masks.update(tfmot_masks)
            self.own_masks = None
        prunable = sorted(own_masks) if own_masks and self.prunable is None else select_prunable(named, self.prunable)
        for name, variable in named.items():
            compressor = (PacTrainCompressor(shape=variable.shape, value_compression=self.compression)
                          if name in prunable else None)
            bound.add(name, variable, compressor)
        bound.resize()
        if own_masks:  # proven equal on all ranks at the first step
            self.maintenance.install(bound.pruner.validate(own_masks))
        if self.pending_restore is not None:
            blob, self.pending_restore = self.pending_restore, None
            self.restore(from_npz(blob))
