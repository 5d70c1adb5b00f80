"""``PacTrainState``: Horovod's TF gradient all-reduce, pruned and packed, and what persists between steps.

One explicit state object holds what persists between steps (schedule position, masks, plan,
wire accounting) and does the reduction for both façades: ``DistributedGradientTape``
(``pactrain_hvd.tensorflow.tape``) and the Keras ``DistributedOptimizer``
(``pactrain_hvd.tensorflow.keras``).

How a step runs, in or out of ``tf.function``:

1. *Maintenance*, only at the steps that need it, all of them steps every rank knows of: a
   schedule update, and Mask Tracker checks at the state's first step, every ``verify_every``
   steps and after ``broadcast_masks`` (a local call such as ``set_masks`` or a restore
   schedules none: the other ranks would all-reduce while this one allgathers). Masks are
   recomputed from the weights with numpy (``core.magnitude_masks``, the same code as the torch
   frontend), verified across ranks, and written into TF variables. Where nothing is
   communicated (``pruning.communicates``: Horovod's rule) pruning is local and nothing verified.
   Eagerly it is a plain call; inside a traced function a ``tf.cond`` on the step counter runs
   it through ``tf.py_function``, and every op of the step is ordered after it. Pruned weights
   and optimizer slots are zeroed by graph ops, ordered before the optimizer's update.
2. Per gradient, ``PacTrainCompressor`` reads its mask, surviving indices and plan from
   variables, so the traced graph stays valid across mask changes: nothing is retraced.
3. Horovod all-reduces the packed vectors (no indices travel), the compressor scatters back.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Iterable, Sequence
from typing import Any

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf
from horovod.tensorflow.compression import Compression, Compressor

from pactrain_hvd.core import (
    StepStats,
    TensorStats,
    should_pack,
)
from pactrain_hvd.core.agreement import horovod_settings
from pactrain_hvd.core.config import pactrain_keywords, reduce_op_name
from pactrain_hvd.core.encodings import ENCODINGS, packed_values_argument
from pactrain_hvd.core.lanes import ternary_layout
from pactrain_hvd.tensorflow import checkpoint
from pactrain_hvd.tensorflow.arguments import checked_arguments
from pactrain_hvd.tensorflow.compression import PACKED_WIRES, UNMASKED, PacTrainCompressor
from pactrain_hvd.tensorflow.engine import HorovodEngine
from pactrain_hvd.tensorflow.own_masks import sync_tfmot_masks
from pactrain_hvd.tensorflow.pruning import (
    Pruner,
    backing_variable,
    build_optimizer,
    optimizer_slots,
    select_prunable,
    variable_names,
)
from pactrain_hvd.tensorflow.ternary import TernaryReduction

_NEVER = np.iinfo(np.int64).max
_DUE_NOW = -1  # ``_next_due`` value: maintain (and verify) at the next step, whatever its number


def state_arguments(**kwargs: Any) -> dict[str, Any]:
    """All of ``PacTrainState``'s arguments (defaults filled in), checked without making one."""
    bound = inspect.signature(PacTrainState).bind(**kwargs)
    bound.apply_defaults()
    checked_arguments(**bound.arguments)
    return dict(bound.arguments)


class PacTrainState(HorovodEngine, tf.train.experimental.PythonState):
    """What persists between steps: schedule position, masks, packing plan, wire accounting.

    Takes Horovod's reduction arguments (``compression``, ``op``, ``gradient_predivide_factor``,
    ``groups``, ``sparse_as_dense``, ``process_set``, ``device_dense``, ``device_sparse``,
    ``scale_local_gradients``) and PacTrain's (``sparsity``, ``begin_step``, ``end_step``,
    ``frequency``, ``total_steps``, ``prunable``: a predicate ``(name, variable) -> bool`` or glob patterns,
    ``ranking``, ``pack_min_numel``, ``pack_max_density``, ``verify_every``; as in
    ``pactrain_hvd.torch.DistributedOptimizer``). ``schedule``: a schedule object in place of ``sparsity`` and
    the steps (``pt.ConstantSparsity(0.95)``: sparse from the first step; ``pt.PolynomialDecay``;
    ``pt.short_ramp``); a schedule that prunes at step 0 ranks the masks before step 0's reduction, from
    the weights every rank holds then, so broadcast the variables before the first step (a difference
    is caught by the Mask Tracker at step 0). ``optimizer``: whose slots (momentum, Adam
    moments) are zeroed at newly pruned coordinates when masks change. ``masks``: bring your own
    mask, ``{variable name: bool mask}`` or a model wrapped by tfmot's ``prune_low_magnitude``;
    fixed (the schedule is off) unless ``continue_pruning=True`` (see ``core.own_masks``).
    ``resume_changed_settings``: restore a checkpoint saved with another ``sparsity``, schedule, ``ranking``
    or ``packed_values`` (with a warning) instead of raising ``CheckpointError``. Every rank must pass the
    same settings: the first step proves it (``SettingsMismatchError`` on every rank instead of a hang).
    ``packed_values``: how packed values travel, as in torch: ``"inherit"`` as ``compression`` says,
    ``"fp16"``, or ``"ternary"`` (shared-scale stochastic ternary with error feedback in int32 lanes, fp16
    beyond 256 ranks; op Average or Sum); ``values=`` is its deprecated old name. Dense-plan and unpruned
    tensors travel as ``compression`` says. ``"fp16"`` and ``"ternary"`` are not combinable with ``groups``:
    a pruned tensor's plan, hence its wire, is chosen when the step runs.

    The state binds to the variables of its first ``reduce`` call (more may join later). It is a
    checkpointable object: put it in a ``tf.train.Checkpoint`` to save masks and schedule
    position (the Keras optimizer carries its own, so ``Checkpoint(optimizer=opt)`` does it).

    Example::

        >>> state = pt.PacTrainState(sparsity=0.9, end_step=1000, frequency=100, optimizer=opt)
        >>> @tf.function
        ... def train_step(x, y):
        ...     with tf.GradientTape() as tape:
        ...         loss = loss_fn(y, model(x, training=True))
        ...     tape = pt.DistributedGradientTape(tape, state=state)
        ...     grads = tape.gradient(loss, model.trainable_variables)
        ...     opt.apply_gradients(zip(grads, model.trainable_variables))
    """

    @pactrain_keywords()
    def __init__(
        self,
        compression: type[Compressor] = Compression.none,
        sparse_as_dense: bool = False,
        op: Any = hvd.Average,
        gradient_predivide_factor: float = 1.0,
        groups: int | list | None = None,
        process_set: hvd.ProcessSet = hvd.global_process_set,
        device_dense: str = "",
        device_sparse: str = "",
        scale_local_gradients: bool = True,
        optimizer: Any = None,
        **pactrain: Any,
    ) -> None:
        # warns at the caller if values= is given (this frame, the keyword wrapper's, then the caller's)
        packed_values = packed_values_argument(pactrain.pop("packed_values"), pactrain.pop("values"), stacklevel=4)
        prunable = pactrain["prunable"]
        self.config, self._own_masks = checked_arguments(
            compression=compression, op=op, gradient_predivide_factor=gradient_predivide_factor, groups=groups,
            packed_values=packed_values, process_set=process_set, **pactrain)
        self._tfmot_masks: dict[str, tf.Variable] = {}
        self.compression = compression
        self.sparse_as_dense = bool(sparse_as_dense)
        self.op = op
        self.gradient_predivide_factor = float(gradient_predivide_factor)
        self.groups = groups
        self.process_set = process_set
        self.device_dense = device_dense
        self.device_sparse = device_sparse
        self.scale_local_gradients = bool(scale_local_gradients)
        self.prunable = prunable
        self.optimizer = optimizer
        self.packed_values = packed_values
        encoding = ENCODINGS[packed_values]
        layout = ternary_layout(process_set.size()) if encoding.quantized else None
        # A rank outside the process set never reduces.
        self._ternary = TernaryReduction(process_set) if layout is not None and process_set.included() else None
        self._encoding = encoding.reported(lanes_fit=layout is not None)
        self._packed_compression = encoding.wire_of(PACKED_WIRES, "horovod.tensorflow") or compression

        self._names: list[str] = []
        self._positions: dict[Any, int] = {}
        self._local: set[Any] = set()
        self._compressors: dict[str, PacTrainCompressor] = {}
        self._packed: dict[str, bool] = {}
        self._dense_bytes: dict[int, int] = {}
        op_name = reduce_op_name(hvd, op, gradient_predivide_factor)
        self._pruner = Pruner({}, [], self.config.schedule, self.config.ranking, process_set, settings={
            **self.config.shared_settings(), "packed_values": packed_values,
            **horovod_settings(op_name, compression, groups, 1, gradient_predivide_factor)})
        self._pending_restore: bytes | None = None
        self._broadcast_request: Any = None  # see functions.broadcast_variables_at_next_reduction
        self._zero_in_graph = False  # binding inside a trace: see ``bind``
        self._zero_due: tf.Variable | None = None  # set when masks were installed at a traced binding
        with tf.init_scope():
            self._step = tf.Variable(0, dtype=tf.int64, trainable=False, name="pactrain_step")
            # The first step verifies (every rank makes one); later, the steps ``_maintain`` chooses.
            self._next_due = tf.Variable(_DUE_NOW, dtype=tf.int64, trainable=False, name="pactrain_next_maintenance")
            self._sent_bytes = tf.Variable(tf.zeros([0], tf.int64), shape=tf.TensorShape([None]), trainable=False,
                                           name="pactrain_sent_bytes")
        self._communicate_eagerly = tf.function(self._communicate)
        self.traces = 0  # times the reduction was traced into a graph; mask changes add none

    # -- what users read ------------------------------------------------------------------------
    @property
    def step_count(self) -> int:
        """Gradient reductions done: the schedule position."""
        return int(self._step.numpy())

    def masks(self) -> dict[str, np.ndarray]:
        """``{variable name: bool mask}`` for every pruned variable (copies; restored but not yet
        bound: under the names they were saved with)."""
        if self._pending_restore is not None:
            return {name: mask for _, name, mask in checkpoint.parse(self._pending_restore).masks}
        return {name: mask.copy() for name, mask in self._pruner.masks.items()}

    def stats(self) -> dict:
        """The last step's wire bytes (sent and dense-equivalent), bits per packed value, per-tensor density and plan.

        ``values`` says how packed values travelled: ``"ternary"``, or ``"fp16"`` when ternary fell
        back (too many ranks for 3 lanes per word), else as the ``packed_values`` argument.
        """
        sent = self._sent_bytes.numpy()
        tensors = {}
        for position, name in enumerate(self._names):
            if position >= sent.size or sent[position] < 0:
                continue  # not communicated in the last step (no gradient, or a local source)
            numel = self._pruner.variables[name].shape.num_elements()
            mask = self._pruner.masks.get(name)
            tensors[name] = TensorStats(numel=numel, kept=numel if mask is None else int(mask.sum()),
                                        packed=self._packed.get(name, False), sent_bytes=int(sent[position]),
                                        dense_bytes=self._dense_bytes[position])
        stats = StepStats(step=max(self.step_count - 1, 0), tensors=tensors)
        return dict(stats.as_dict(), sparsity=self._pruner.sparsity(), values=self._encoding)

    def set_masks(self, masks: dict[str, Any]) -> None:
        """Replace the masks (bool arrays or tensors by variable name); local, no communication.

        Schedules no verification (the other ranks would not know of it): ranks are proven to agree
        at the next step that every rank verifies (the first, a mask update, every ``verify_every``
        steps, after ``broadcast_masks``), or now with ``verify()`` called on every rank.
        """
        if not isinstance(masks, dict):
            raise TypeError(f"masks must be a dict of variable name -> bool array, got {type(masks).__name__}")
        self._install(self._pruner.validate({name: np.asarray(mask) for name, mask in masks.items()}))

    def verify(self) -> None:
        """Mask Tracker, now: a collective call that raises ``MaskMismatchError`` on every rank."""
        self._pruner.verify(self.step_count)

    def _group_size(self) -> int:
        """The ranks this state averages over: its process set's, or 1 outside it (where Horovod's
        ``ProcessSet.size()`` may even fail: "Process set does not exist or has not been registered")."""
        return self.process_set.size() if self.process_set.included() else 1

    def register_local(self, variable: Any) -> None:
        """Gradients of ``variable`` stay local: not reduced (scaled by 1/size if ``scale_local_gradients``)."""
        self._local.add(backing_variable(variable).ref())

    def is_local(self, variable: Any) -> bool:
        return backing_variable(variable).ref() in self._local

    # -- binding to variables -------------------------------------------------------------------
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
        if own_masks:
            self.set_masks(own_masks)  # proven equal on all ranks at the first step
        if self._pending_restore is not None:
            blob, self._pending_restore = self._pending_restore, None
            checkpoint.restore(self, checkpoint.parse(blob))

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
        before = [] if self._broadcast_request is None else [self._broadcast_request(shared)]
        if self._zero_due is not None:
            with tf.control_dependencies(before):
                before = [tf.cond(self._zero_due.read_value(), self._zero_pruned_once, lambda: tf.constant(False))]
        if not before:
            return super().reduce(grads, variables)
        with tf.control_dependencies(before):
            return super().reduce(grads, variables)

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
        revives them; reads the mask variables, eagerly or as graph ops."""
        for name, compressor in self._compressors.items():
            weight = self._pruner.variables[name]
            for variable in (weight, *optimizer_slots(self.optimizer, weight)):
                variable.assign(tf.where(compressor.mask, variable, tf.zeros_like(variable)))
        return tf.constant(True)

    def share_settings(self, **settings: Any) -> None:
        """More settings every rank must hold the same (proven at every Mask Tracker check, the first step's
        included), e.g. the Keras optimizer's ``backward_passes_per_step``."""
        self._pruner.settings.update(settings)

    def request_verification(self) -> None:
        """Verify masks at the next step. Only for calls every rank makes (``broadcast_masks``, elastic
        sync): a rank that verifies alone waits for the others forever."""
        self._next_due.assign(_DUE_NOW)

    def _set_step(self, step: int) -> None:
        """Move the schedule position (a restore); the next maintenance follows from it, nothing more."""
        self._step.assign(step)
        if int(self._next_due.numpy()) != _DUE_NOW:
            self._next_due.assign(self._next_maintenance_after(step - 1))

    def _maintenance_due(self, step: Any) -> tf.Tensor:
        due = self._next_due.read_value()
        return tf.logical_or(tf.equal(step, due), tf.equal(due, _DUE_NOW))

    def _maintain(self, step: int, zero_now: bool = True) -> bool:
        """Schedule update and/or Mask Tracker check due at ``step``; then when to come back.
        Returns whether the masks changed."""
        cfg = self.config
        changed = cfg.schedule.is_update_step(step)
        if changed:
            if self.optimizer is None and not self._pruner.masks:
                warnings.warn("PacTrainState has no optimizer: its slots (momentum, Adam moments) will not be "
                              "cleared at pruned coordinates. Pass optimizer=...", stacklevel=3)
            self._install(self._pruner.rank(step), zero_now)
        elif int(self._next_due.numpy()) == _DUE_NOW or cfg.verifies_at(step):
            self._pruner.verify(step)
        self._next_due.assign(self._next_maintenance_after(step))
        return changed

    def _next_maintenance_after(self, step: int) -> int:
        following = self.config.next_maintenance_after(step)
        return _NEVER if following is None else following

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

    # -- checkpoints (tf.train.Checkpoint calls these; the format: checkpoint.py) --------------------
    def serialize(self) -> bytes:
        """Schedule position and masks (and ternary's held scales, error memory and noise) as bytes."""
        return checkpoint.serialize(self)

    def deserialize(self, string_value: bytes) -> None:
        """Restore schedule position and masks; local, validated before anything changes."""
        checkpoint.deserialize(self, string_value)


def _zero_pruned(weight: tf.Variable, mask: tf.Variable) -> tf.Tensor:
    weight.assign(tf.where(mask, weight, tf.zeros_like(weight)))
    return tf.constant(True)
