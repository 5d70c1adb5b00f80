"""Binding ``PacTrainState`` to variables: names, positions, what is prunable, and the work due before a reduction.

A mixin of ``PacTrainState`` (``state.py``), whose attributes it reads. The state binds to the variables
of its first ``reduce`` call (more may join later), inside ``tf.function`` too; masks of its own (given,
or restored before binding) are installed once the names are known.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from pactrain_hvd.tensorflow import checkpoint
from pactrain_hvd.tensorflow.compression import PacTrainCompressor
from pactrain_hvd.tensorflow.pruning import backing_variable, build_optimizer, select_prunable, variable_names


class Binding:
    """Variables join the state here; ``reduce`` does what must precede the step's maintenance."""

    @tf.autograph.experimental.do_not_convert
    def bind(self, variables: Sequence[Any]) -> tuple[int, ...]:
        """Register variables (idempotent); returns their positions. Safe inside ``tf.function``."""
        backing = [backing_variable(v) for v in variables]
        new = [(v, b) for v, b in zip(variables, backing) if b.ref() not in self._positions]
        if new:
            tracing = not tf.executing_eagerly()
            try:
                with tf.init_scope():
                    # Variables a trace creates (a model Keras builds at its first call) hold their values only
                    # when the traced step runs: masks installed now are applied to them by the step's graph ops.
                    self._zero_in_graph = tracing and not all(bool(b.is_initialized()) for _, b in new)
                    self._register(new)
            finally:
                self._zero_in_graph = False
        return tuple(self._positions[b.ref()] for b in backing)

    def _register(self, new: list[tuple[Any, tf.Variable]]) -> None:
        names = variable_names([v for v, _ in new])
        taken = set(self._names)
        clashes = sorted(name for name in names if name in taken)
        if clashes:
            raise ValueError(f"variables named {', '.join(clashes)} are already bound to this PacTrainState under the "
                             "same names: use one state per set of variables")
        named = dict(zip(names, (b for _, b in new)))
        own_masks = {}
        if self._own_masks is not None:  # the first binding: names are known now
            own_masks, self._tfmot_masks = self._own_masks.resolve(named)
            self._own_masks = None
        prunable = sorted(own_masks) if own_masks and self.prunable is None else select_prunable(named, self.prunable)
        for name, variable in named.items():
            self._positions[variable.ref()] = len(self._names)
            self._names.append(name)
            self._pruner.variables[name] = variable
            if name in prunable:
                self._pruner.prunable_names.append(name)
                self._compressors[name] = PacTrainCompressor(shape=variable.shape, value_compression=self.compression)
                if self._ternary is not None:
                    self._ternary.track(name)
        self._sent_bytes.assign(-tf.ones([len(self._names)], tf.int64))
        self._survivor_scales.assign(tf.ones([len(self._names)]))
        if own_masks:
            self.set_masks(own_masks)  # proven equal on all ranks at the first step
        if self._pending_restore is not None:
            blob, self._pending_restore = self._pending_restore, None
            self.restore(checkpoint.parse(blob))

    @tf.autograph.experimental.do_not_convert
    def reduce(self, grads: Sequence[Any], variables: Sequence[Any]) -> list[Any]:
        """``HorovodEngine.reduce``, after what must come before this step's maintenance: a broadcast asked for
        by ``broadcast_variables_at_next_reduction`` (variables bound and the optimizer built first, so all
        exist), then the zeroing of masks installed when a trace bound the variables (see ``bind``)."""
        bound = len(self._names)
        shared = [variable for variable in variables if not self.is_local(variable)]
        self.bind(shared)
        if len(self._names) > bound:  # as HorovodEngine.reduce would, before anything reads the slots
            with tf.init_scope():
                build_optimizer(self.optimizer, variables)
        before = [] if self.broadcast_request is None else [self.broadcast_request(shared)]
        if self._zero_due is not None:
            with tf.control_dependencies(before):
                before = [tf.cond(self._zero_due.read_value(), self._zero_pruned_once, lambda: tf.constant(False))]
        if not before:
            return super().reduce(grads, variables)
        with tf.control_dependencies(before):
            return super().reduce(grads, variables)

