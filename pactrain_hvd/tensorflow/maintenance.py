"""``Maintenance``: a ``PacTrainState``'s masks, plans and schedule position between steps.

Which steps need maintenance, and what is due there, is ``core.lifecycle.StepLifecycle``'s; this
class is its mask operations for TensorFlow and the graph's mirrors of its step counter (``step``,
``next_due``), kept here and nowhere else. Eagerly maintenance runs in Python before the step's
communication; inside a traced step ``HorovodEngine`` runs it through a ``tf.py_function`` under a
``tf.cond`` on ``due``, and the zeroing of what new masks prune is then done by graph ops.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import tensorflow as tf

from pactrain_hvd.core import should_pack
from pactrain_hvd.core.config import PacTrainConfig
from pactrain_hvd.core.cycle import DUE_NOW, PruningCycle
from pactrain_hvd.core.lifecycle import StepLifecycle
from pactrain_hvd.tensorflow.bound import BoundTensors
from pactrain_hvd.tensorflow.compression import UNMASKED
from pactrain_hvd.tensorflow.own_masks import sync_tfmot_masks
from pactrain_hvd.tensorflow.pruning import backing_variable, optimizer_slots, run_if


class Maintenance:
    """Masks, plans and schedule position between steps (local, except the Mask Tracker's check).

    Args:
        bound: the record of bound variables and their plans, changed here.
        config: the state's checked settings (packing thresholds, ``rescale_survivors``).
        optimizer: whose slots are zeroed with the weights they belong to; None: no slots.
        tfmot_masks: tfmot's mask variables to keep equal to the masks, by variable name.
    """

    def __init__(self, bound: BoundTensors, config: PacTrainConfig, optimizer: Any,
                 tfmot_masks: dict[str, tf.Variable]) -> None:
        self.bound = bound
        self.config = config
        self.optimizer = optimizer
        self.tfmot_masks = tfmot_masks
        # Every check proves the position (the Pruner skips what a process alone need not prove); the first step checks.
        self.cycle = PruningCycle(config, tracking=True)
        self.lifecycle = StepLifecycle(self.cycle, self)
        self._zero_in_graph = False  # masks installed while a trace binds variables: see ``deferred_zeroing``
        self._zero_due: tf.Variable | None = None
        with tf.init_scope():
            # The traced step's mirrors of the cycle: its position (which the graph advances) and next maintenance.
            self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="pactrain_step")
            self.next_due = tf.Variable(self.cycle.next_due(), dtype=tf.int64, trainable=False,
                                        name="pactrain_next_maintenance")

    # -- masks and plans -------------------------------------------------------------------------
    def install(self, masks: dict[str, np.ndarray], zero_now: bool = True) -> None:
        """New masks and plans (local only); ``zero_now``: zero what they prune, here and now (a
        traced step does that with graph ops instead: ``HorovodEngine``)."""
        bound = self.bound
        bound.pruner.install(masks)
        sync_tfmot_masks(self.tfmot_masks, bound.pruner.masks)
        for name, compressor in bound.compressors.items():
            mask = bound.pruner.masks.get(name)
            packed = self.packs(mask)
            previous = compressor.surviving_indices.numpy() if bound.quantized is not None else None
            compressor.set_mask(mask, packed)
            bound.packed[name] = packed
            if bound.quantized is not None:
                bound.quantized.memory.remap(name, previous, compressor.surviving_indices.numpy(),
                                             compressor.shape.num_elements())
        if zero_now and self._zero_in_graph:
            if self._zero_due is None:
                self._zero_due = tf.Variable(False, trainable=False, name="pactrain_zero_due")
            self._zero_due.assign(True)
        elif zero_now:
            self.zero_pruned()

    def packs(self, mask: np.ndarray | None) -> bool:
        """The plan for a tensor with this mask: pack its surviving values (else send it dense)."""
        return mask is not None and should_pack(mask.size, int(mask.sum()), self.config.pack_min_numel,
                                                self.config.pack_max_density)

    def zero_pruned(self) -> tf.Tensor:
        """Pruned weights, their optimizer slots (momentum, Adam moments) and local steps' anchor and outer
        momentum become 0, so nothing revives them, and survivors take the factors ``survivor_scales`` holds
        (then 1 again); eagerly or as graph ops."""
        bound = self.bound
        for position, name in enumerate(bound.names):
            compressor = bound.compressors.get(name)
            if compressor is None:
                continue
            weight = bound.pruner.variables[name]
            scale = tf.cast(bound.survivor_scales[position], weight.dtype)
            weight.assign(tf.where(compressor.mask, weight * scale, tf.zeros_like(weight)))
            for slot in optimizer_slots(self.optimizer, weight):
                slot.assign(tf.where(compressor.mask, slot, tf.zeros_like(slot)))
            if bound.outer is not None:
                bound.outer.zero_pruned(name, compressor.mask)
        bound.survivor_scales.assign(tf.ones_like(bound.survivor_scales))
        return tf.constant(True)

    @contextlib.contextmanager
    def deferred_zeroing(self, deferred: bool) -> Iterator[None]:
        """Masks installed inside (``deferred``: while a trace binds variables it creates, which hold their
        values only when the traced step runs) are zeroed by the step's graph ops: ``zeroing_due``."""
        self._zero_in_graph = deferred
        try:
            yield
        finally:
            self._zero_in_graph = False

    def zeroing_due(self) -> list[tf.Tensor]:
        """Graph ops zeroing, once, what masks installed under ``deferred_zeroing`` prune; [] if none was."""
        if self._zero_due is None:
            return []

        def zero_once() -> tf.Tensor:
            self.zero_pruned()
            self._zero_due.assign(False)
            return tf.constant(True)

        return [run_if(self._zero_due.read_value(), zero_once)]

    @tf.autograph.experimental.do_not_convert
    def enforce(self, variables: Iterable[Any]) -> None:
        """Pruned weights become exactly 0 (+0.0) whatever the optimizer did; graph-safe, skipped while unmasked."""
        for variable in variables:
            compressor = self.bound.compressor_of(variable)
            if compressor is not None:
                tf.cond(tf.equal(compressor.plan.read_value(), UNMASKED), lambda: tf.constant(False),
                        lambda b=backing_variable(variable), c=compressor: _zero_pruned(b, c.mask))

    # -- the schedule position -------------------------------------------------------------------
    def request_verification(self) -> None:
        """Verify masks at the next step. Only for calls every rank makes (``broadcast_masks``, elastic
        sync): a rank that verifies alone waits for the others forever."""
        self.cycle.request_verification()
        self.next_due.assign(self.cycle.next_due())

    def set_step(self, step: int) -> None:
        """Move the schedule position (a restore); the next maintenance follows from it, nothing more."""
        self.cycle.step = step
        self.step.assign(step)
        self.next_due.assign(self.cycle.next_due())

    def interval_begins(self) -> tf.Tensor:
        """Local steps: whether the position is an interval's first step (after a step: the interval ended)."""
        return tf.equal(self.step.read_value() % self.config.sync_every, 0)

    def due(self, step: Any) -> tf.Tensor:
        """``PruningCycle.maintenance_due`` as graph ops, on the mirrors."""
        due = self.next_due.read_value()
        return tf.logical_or(tf.equal(step, due), tf.equal(due, DUE_NOW))

    def maintain(self, step: int, zero_now: bool = True) -> bool:
        """Schedule update and/or Mask Tracker check due at ``step`` (``StepLifecycle.maintain``); then when
        to come back. Returns whether the masks changed."""
        changed = self.lifecycle.maintain(step, early=not zero_now)
        self.next_due.assign(self.cycle.next_due())
        return changed

    def maintain_in_graph(self, step: tf.Tensor) -> bool:
        """The ``py_function`` body. TF re-raises a Python error from here as ``tf.errors.UnknownError``
        whose message carries it, e.g. ``MaskMismatchError: pruning masks differ across ranks: ...``."""
        return self.maintain(int(step), zero_now=False)

    # -- the mask operations ``StepLifecycle.maintain`` asks for -------------------------------------
    def rank_masks(self, step: int, early: bool) -> None:
        """``early``: inside a traced step, whose graph ops zero what the masks prune."""
        bound = self.bound
        if self.optimizer is None and not bound.pruner.masks:
            warnings.warn("PacTrainState has no optimizer: its slots (momentum, Adam moments) will not be "
                          "cleared at pruned coordinates. Pass optimizer=...", stacklevel=5)
        masks = bound.pruner.rank(step)
        if step == 0 and self.config.rescale_survivors and not bound.pruner.masks:  # applied with the zeroing
            scales = bound.pruner.survivor_scales(masks)
            bound.survivor_scales.assign([scales.get(name, 1.0) for name in bound.names])
        self.install(masks, zero_now=not early)

    def verify_masks(self, position: int) -> None:
        self.bound.pruner.verify(position)


def _zero_pruned(weight: tf.Variable, mask: tf.Variable) -> tf.Tensor:
    weight.assign(tf.where(mask, weight, tf.zeros_like(weight)))
    return tf.constant(True)
