"""Maintenance of ``PacTrainState``, between steps: new masks and plan, zeroing, schedule and Mask Tracker.

A mixin of ``PacTrainState`` (``state.py``), whose attributes it reads. Which steps need maintenance, and
what is due there, is the state's ``core.cycle.PruningCycle``'s (``next_due``, ``maintenance``); eagerly it
runs in Python before the step's communication, inside a traced step through a ``tf.py_function`` under a
``tf.cond`` on the step counter (``engine.py``), and the zeroing of what new masks prune is then done by graph ops.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any

import numpy as np
import tensorflow as tf

from pactrain_hvd.core import should_pack
from pactrain_hvd.core.cycle import DUE_NOW
from pactrain_hvd.tensorflow.compression import UNMASKED
from pactrain_hvd.tensorflow.own_masks import sync_tfmot_masks
from pactrain_hvd.tensorflow.pruning import backing_variable, optimizer_slots


class Maintenance:
    """Masks, plan and schedule position between steps (local, except the Mask Tracker's check)."""

    def _zero_pruned_once(self) -> tf.Tensor:
        self._zero_pruned()
        self._zero_due.assign(False)
        return tf.constant(True)

    # -- maintenance: between steps, eagerly ----------------------------------------------------
    def _install(self, masks: dict[str, np.ndarray], zero_now: bool = True) -> None:
        """New masks and plan (local only); ``zero_now``: zero what they prune, here and now (a
        traced step does that with graph ops instead: see ``_communicate``)."""
        self._pruner.install(masks)
        sync_tfmot_masks(self._tfmot_masks, self._pruner.masks)
        for name, compressor in self._compressors.items():
            mask = self._pruner.masks.get(name)
            packed = self._packs(mask)
            previous = compressor.surviving_indices.numpy() if self._ternary is not None else None
            compressor.set_mask(mask, packed)
            self._packed[name] = packed
            if self._ternary is not None:
                self._ternary.memory.remap(name, previous, compressor.surviving_indices.numpy(),
                                           compressor.shape.num_elements())
        if zero_now and self._zero_in_graph:
            if self._zero_due is None:
                self._zero_due = tf.Variable(False, trainable=False, name="pactrain_zero_due")
            self._zero_due.assign(True)
        elif zero_now:
            self._zero_pruned()

    def _packs(self, mask: np.ndarray | None) -> bool:
        """The plan for a tensor with this mask: pack its surviving values (else send it dense)."""
        return mask is not None and should_pack(mask.size, int(mask.sum()), self.config.pack_min_numel,
                                                self.config.pack_max_density)

    def _zero_pruned(self) -> tf.Tensor:
        """Pruned weights and their optimizer slots (momentum, Adam moments) become 0, so nothing
        revives them, and survivors take the factors ``_survivor_scales`` holds (then 1 again); reads the
        variables, eagerly or as graph ops."""
        for position, name in enumerate(self._names):
            compressor = self._compressors.get(name)
            if compressor is None:
                continue
            weight = self._pruner.variables[name]
            scale = tf.cast(self._survivor_scales[position], weight.dtype)
            weight.assign(tf.where(compressor.mask, weight * scale, tf.zeros_like(weight)))
            for slot in optimizer_slots(self.optimizer, weight):
                slot.assign(tf.where(compressor.mask, slot, tf.zeros_like(slot)))
        self._survivor_scales.assign(tf.ones_like(self._survivor_scales))
        return tf.constant(True)

    def request_verification(self) -> None:
        """Verify masks at the next step. Only for calls every rank makes (``broadcast_masks``, elastic
        sync): a rank that verifies alone waits for the others forever."""
        self.cycle.request_verification()
        self._next_due.assign(self.cycle.next_due())

    def _set_step(self, step: int) -> None:
        """Move the schedule position (a restore); the next maintenance follows from it, nothing more."""
        self.cycle.step = step
        self._step.assign(step)
        self._next_due.assign(self.cycle.next_due())

    def _maintenance_due(self, step: Any) -> tf.Tensor:
        """``PruningCycle.maintenance_due`` as graph ops, on the cycle's mirrors."""
        due = self._next_due.read_value()
        return tf.logical_or(tf.equal(step, due), tf.equal(due, DUE_NOW))

    def _maintain(self, step: int, zero_now: bool = True) -> bool:
        """Schedule update and/or Mask Tracker check due at ``step`` (``core.lifecycle.StepLifecycle.maintain``);
        then when to come back. Returns whether the masks changed."""
        changed = self.lifecycle.maintain(step, early=not zero_now)
        self._next_due.assign(self.cycle.next_due())
        return changed

    # -- the mask operations ``StepLifecycle.maintain`` asks for -------------------------------------
    def rank_masks(self, step: int, early: bool) -> None:
        """``early``: inside a traced step, whose graph ops zero what the masks prune (``_communicate``)."""
        if self.optimizer is None and not self._pruner.masks:
            warnings.warn("PacTrainState has no optimizer: its slots (momentum, Adam moments) will not be "
                          "cleared at pruned coordinates. Pass optimizer=...", stacklevel=5)
        masks = self._pruner.rank(step)
        if step == 0 and self.config.rescale_survivors and not self._pruner.masks:  # applied with the zeroing
            scales = self._pruner.survivor_scales(masks)
            self._survivor_scales.assign([scales.get(name, 1.0) for name in self._names])
        self._install(masks, zero_now=not early)

    def verify_masks(self, position: int) -> None:
        self._pruner.verify(position)

    def _maintain_in_graph(self, step: tf.Tensor) -> bool:
        """The ``py_function`` body. TF re-raises a Python error from here as ``tf.errors.UnknownError``
        whose message carries it, e.g. ``MaskMismatchError: pruning masks differ across ranks: ...``."""
        return self._maintain(int(step), zero_now=False)

    @tf.autograph.experimental.do_not_convert
    def enforce(self, variables: Iterable[Any]) -> None:
        """Pruned weights become exactly 0 (+0.0) whatever the optimizer did; graph-safe, skipped while unmasked."""
        for variable in variables:
            backing = backing_variable(variable)
            position = self._positions.get(backing.ref())
            compressor = None if position is None else self._compressors.get(self._names[position])
            if compressor is not None:
                tf.cond(tf.equal(compressor.plan.read_value(), UNMASKED), lambda: tf.constant(False),
                        lambda b=backing, c=compressor: _zero_pruned(b, c.mask))


def _zero_pruned(weight: tf.Variable, mask: tf.Variable) -> tf.Tensor:
    weight.assign(tf.where(mask, weight, tf.zeros_like(weight)))
    return tf.constant(True)
