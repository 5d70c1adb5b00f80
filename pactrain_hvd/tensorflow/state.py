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

import functools
import inspect
import io
import re
import warnings
from collections.abc import Iterable, Sequence
from typing import Any

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf
from horovod.common.util import split_list
from horovod.tensorflow.compression import Compression, Compressor

from pactrain_hvd.core import (
    CheckpointError,
    PacTrainConfig,
    StepStats,
    TensorStats,
    check_saved_world_size,
    saved_by_this_rank,
    should_pack,
)
from pactrain_hvd.core.config import (
    DEFAULT_RANKING,
    DEFAULT_VERIFY_EVERY,
    check_packed_values,
    packed_encoding,
    packed_values_argument,
    reduce_op_name,
    require_initialized,
    scale_factors,
)
from pactrain_hvd.core.lanes import ternary_layout
from pactrain_hvd.core.own_masks import schedule_sparsity
from pactrain_hvd.tensorflow.compression import PACKED, UNMASKED, PacTrainCompressor
from pactrain_hvd.tensorflow.own_masks import PendingMasks, sync_tfmot_masks
from pactrain_hvd.tensorflow.pruning import (
    Prunable,
    Pruner,
    backing_variable,
    build_optimizer,
    communicates,
    optimizer_slots,
    select_prunable,
    variable_names,
)
from pactrain_hvd.tensorflow.ternary import TernaryReduction

_NEVER = np.iinfo(np.int64).max
_DUE_NOW = -1  # ``_next_due`` value: maintain (and verify) at the next step, whatever its number
_Reduced = tuple[tf.Tensor, tf.Tensor]  # a reduced gradient and the bytes its tensor put on the wire


def _validate_groups(groups: Any) -> None:
    if groups is None:
        return
    if isinstance(groups, bool) or not (isinstance(groups, list) or (isinstance(groups, int) and groups > 0)):
        raise ValueError(f"groups should be a positive integer or a list of lists of tf.Variable, got {groups!r}")
    if isinstance(groups, list) and not all(isinstance(group, (list, tuple)) for group in groups):
        raise ValueError("groups given as a list must be a list of lists of tf.Variable")


def _checked_arguments(*, compression: Any, op: Any, gradient_predivide_factor: float, groups: Any, packed_values: str,
                       process_set: Any, prunable: Prunable, sparsity: float, masks: Any, continue_pruning: bool,
                       begin_step: int | None, end_step: int | None, frequency: int | None,
                       total_steps: int | None, ranking: str, verify_every: int,
                       pack_min_numel: int | None, pack_max_density: float | None,
                       **_unchecked: Any) -> tuple[PacTrainConfig, PendingMasks | None]:
    """``PacTrainState``'s arguments checked, before anything is created or communicated: its config and
    given masks."""
    config = PacTrainConfig.from_arguments(
        sparsity=schedule_sparsity(sparsity, masks is not None, continue_pruning), begin_step=begin_step,
        end_step=end_step, frequency=frequency, total_steps=total_steps, ranking=ranking, verify_every=verify_every,
        pack_min_numel=pack_min_numel, pack_max_density=pack_max_density,
    )
    own_masks = PendingMasks(masks) if masks is not None else None
    if not (hasattr(compression, "compress") and hasattr(compression, "decompress")):
        raise TypeError(f"compression must be a Horovod Compressor such as hvd.Compression.fp16, "
                        f"got {compression!r}")
    op_name = reduce_op_name(hvd, op, gradient_predivide_factor)
    _validate_groups(groups)
    check_packed_values(packed_values, op_name, groups is not None)  # already read by packed_values_argument
    if packed_values == "fp16" and groups is not None:
        raise ValueError("packed_values='fp16' cannot be combined with groups in the TensorFlow frontend: a pruned "
                         "tensor's plan, hence its wire dtype, is chosen when the step runs; "
                         "compression=hvd.Compression.fp16 sends every tensor as fp16 and works with groups")
    if not isinstance(process_set, hvd.ProcessSet):
        raise TypeError(f"process_set must be a horovod ProcessSet, got {type(process_set).__name__}")
    if prunable is not None and isinstance(prunable, str):
        raise TypeError("prunable must be a predicate or a list of name patterns, not a single string")
    require_initialized(hvd, "pactrain_hvd.tensorflow.PacTrainState")
    return config, own_masks


def state_arguments(**kwargs: Any) -> dict[str, Any]:
    """All of ``PacTrainState``'s arguments (defaults filled in), checked without making one."""
    bound = inspect.signature(PacTrainState).bind(**kwargs)
    bound.apply_defaults()
    _checked_arguments(**bound.arguments)
    return dict(bound.arguments)


class PacTrainState(tf.train.experimental.PythonState):
    """What persists between steps: schedule position, masks, packing plan, wire accounting.

    Takes Horovod's reduction arguments (``compression``, ``op``, ``gradient_predivide_factor``,
    ``groups``, ``sparse_as_dense``, ``process_set``, ``device_dense``, ``device_sparse``,
    ``scale_local_gradients``) and PacTrain's (``sparsity``, ``begin_step``, ``end_step``,
    ``frequency``, ``total_steps``, ``prunable``: a predicate ``(name, variable) -> bool`` or glob patterns,
    ``ranking``, ``pack_min_numel``, ``pack_max_density``, ``verify_every``; as in
    ``pactrain_hvd.torch.DistributedOptimizer``). ``optimizer``: whose slots (momentum, Adam
    moments) are zeroed at newly pruned coordinates when masks change. ``masks``: bring your own
    mask, ``{variable name: bool mask}`` or a model wrapped by tfmot's ``prune_low_magnitude``;
    fixed (the schedule is off) unless ``continue_pruning=True`` (see ``core.own_masks``).
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
        optimizer: Any = None,
        masks: dict[str, Any] | Any = None,
        continue_pruning: bool = False,
        packed_values: str = "inherit",
        values: str | None = None,
    ) -> None:
        packed_values, values = packed_values_argument(packed_values, values), None
        arguments = {name: value for name, value in locals().items() if name not in ("self", "__class__")}
        self.config, self._own_masks = _checked_arguments(**arguments)
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
        layout = ternary_layout(process_set.size()) if packed_values == "ternary" else None
        # A rank outside the process set never reduces.
        self._ternary = TernaryReduction(process_set) if layout is not None and process_set.included() else None
        self._encoding = packed_encoding(packed_values, layout is not None)
        self._packed_compression = Compression.fp16 if packed_values in ("fp16", "ternary") else compression

        self._names: list[str] = []
        self._positions: dict[Any, int] = {}
        self._local: set[Any] = set()
        self._compressors: dict[str, PacTrainCompressor] = {}
        self._packed: dict[str, bool] = {}
        self._dense_bytes: dict[int, int] = {}
        self._pruner = Pruner({}, [], self.config.schedule, self.config.ranking, process_set)
        self._pending_restore: bytes | None = None
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
            return {name: mask for _, name, mask in _parse_state(self._pending_restore)[1]}
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

    def on_every_rank(self, flag: Any) -> tf.Tensor:
        """Whether ``flag`` holds on every rank this state reduces with (one int all-reduce); ``flag`` itself
        where nothing is communicated. For decisions all ranks must take alike, such as skipping a step."""
        flag = tf.convert_to_tensor(flag, tf.bool)
        if not communicates(self.process_set):
            return flag
        agreed = hvd.allreduce(tf.cast(flag, tf.int32), op=hvd.Min, name="pactrain.on_every_rank",
                               process_set=self.process_set)
        return tf.cast(agreed, tf.bool)

    # -- binding to variables -------------------------------------------------------------------
    @tf.autograph.experimental.do_not_convert
    def bind(self, variables: Sequence[Any]) -> tuple[int, ...]:
        """Register variables (idempotent); returns their positions. Safe inside ``tf.function``."""
        backing = [backing_variable(v) for v in variables]
        new = [(v, b) for v, b in zip(variables, backing) if b.ref() not in self._positions]
        if new:
            with tf.init_scope():
                self._register(new)
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
            self._restore(*_parse_state(blob))

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
        if zero_now:
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
            self._install(self._pruner.compute(step), zero_now)
        elif int(self._next_due.numpy()) == _DUE_NOW or (cfg.verify_every and step % cfg.verify_every == 0):
            self._pruner.verify(step)
        self._next_due.assign(self._next_maintenance_after(step))
        return changed

    def _next_maintenance_after(self, step: int) -> int:
        """The next step that needs ``_maintain``: a schedule update or a periodic verification."""
        following = [s for s in (self.config.schedule.next_update_after(step),) if s is not None]
        if self.config.verify_every:
            following.append((step // self.config.verify_every + 1) * self.config.verify_every)
        return min(following, default=_NEVER)

    def _maintain_in_graph(self, step: tf.Tensor) -> bool:
        """The ``py_function`` body. TF re-raises a Python error from here as ``tf.errors.UnknownError``
        whose message carries it, e.g. ``MaskMismatchError: pruning masks differ across ranks: ...``."""
        return self._maintain(int(step), zero_now=False)

    # -- the reduction ----------------------------------------------------------------------------
    @tf.autograph.experimental.do_not_convert
    def reduce(self, grads: Sequence[Any], variables: Sequence[Any]) -> list[Any]:
        """All-reduce ``grads`` of ``variables`` (pruned ones packed) and advance the schedule one step.

        Eagerly, maintenance runs here in Python and the communication in a cached
        ``tf.function`` (as Horovod does); inside a traced function both become graph ops.
        """
        if len(grads) != len(variables):
            raise ValueError(f"got {len(grads)} gradients for {len(variables)} variables")
        grads = list(grads)
        shared = [i for i, v in enumerate(variables) if backing_variable(v).ref() not in self._local]
        bound = len(self._names)
        positions = self.bind([variables[i] for i in shared])
        if len(self._names) > bound:  # slots are cleared by ops traced before the optimizer's: create them now
            with tf.init_scope():
                build_optimizer(self.optimizer, variables)
        shared_grads = [grads[i] for i in shared]
        self._refuse_sparse_pruned(shared_grads, positions)
        if not tf.executing_eagerly():
            reduced = self._communicate(shared_grads, positions, maintain=True)
        else:
            step = self.step_count
            if self._maintenance_due(step):
                self._maintain(step)
            reduced = self._communicate_eagerly(shared_grads, positions, maintain=False)
        local = sorted(set(range(len(grads))) - set(shared))
        for i, grad in zip(shared, reduced):
            grads[i] = grad
        size = self._group_size() if local else 1
        if self.scale_local_gradients and size > 1:
            for i in local:
                grads[i] = None if grads[i] is None else scale_gradient(grads[i], 1.0 / size)
        return grads

    def _refuse_sparse_pruned(self, grads: list[Any], positions: tuple[int, ...]) -> None:
        """Before maintenance and communication: a prunable variable's gradient must be dense."""
        if self.sparse_as_dense:
            return
        for grad, position in zip(grads, positions):
            name = self._names[position]
            if isinstance(grad, tf.IndexedSlices) and name in self._compressors:
                raise ValueError(f"variable {name!r} has a sparse gradient (tf.IndexedSlices): pass "
                                 "sparse_as_dense=True (packing needs dense gradients)")

    def _communicate(self, grads: list[Any], positions: tuple[int, ...], maintain: bool) -> list[Any]:
        self.traces += 1
        with tf.name_scope("PacTrain"):
            dependencies = []
            if maintain:
                step = self._step.read_value()
                changed = tf.cond(self._maintenance_due(step),
                                  lambda: tf.ensure_shape(tf.py_function(self._maintain_in_graph, [step], tf.bool), []),
                                  lambda: tf.constant(False))
                # Zeroing is done by graph ops, not in the py_function: TF's automatic control
                # dependencies order them after this step's reads of the weights and before the
                # optimizer's update of weights and slots, which a py_function's writes are not.
                with tf.control_dependencies([changed]):
                    dependencies.append(tf.cond(changed, self._zero_pruned, lambda: tf.constant(False)))
            with tf.control_dependencies(dependencies):
                reduced, sent = self._allreduce(grads, positions)
                record = self._sent_bytes.assign(tf.stack(sent))
            with tf.control_dependencies([record]):
                self._step.assign_add(1)
        return reduced

    def _allreduce(self, grads: list[Any], positions: tuple[int, ...]) -> tuple[list[Any], list[tf.Tensor]]:
        """Compress, reduce (grouped as Horovod would), decompress; also the bytes each tensor put on the wire."""
        sent: list[tf.Tensor] = [tf.constant(-1, tf.int64)] * len(self._names)
        reduced: list[Any] = list(grads)
        communicating = communicates(self.process_set)
        dense: list[tuple[int, tf.Tensor, Compressor]] = []
        for index, (grad, position) in enumerate(zip(grads, positions)):
            if grad is None:
                continue
            name = self._names[position]
            compressor = self._compressors.get(name, self.compression)
            if isinstance(grad, tf.IndexedSlices):
                if not self.sparse_as_dense:
                    if communicating:
                        reduced[index], sent[position] = self._allgather_sparse(grad)
                    continue
                grad = tf.convert_to_tensor(grad)
            if not communicating:  # as Horovod: the local gradient (pruned here: zero where masked)
                pruned = isinstance(compressor, PacTrainCompressor)
                reduced[index] = tf.where(compressor.mask, grad, tf.zeros_like(grad)) if pruned else grad
                continue
            self._dense_bytes[position] = self._pruner.variables[name].shape.num_elements() * grad.dtype.size
            dense.append((index, grad, compressor))
        plain, by_plan = [], []
        for item in dense:
            (by_plan if self.packed_values != "inherit" and isinstance(item[2], PacTrainCompressor) else plain).append(item)
        with tf.device(self.device_dense):
            wires, contexts = [], []
            for index, grad, compressor in plain:
                wire, ctx = compressor.compress(grad)
                wires.append(wire)
                contexts.append(ctx)
                sent[positions[index]] = tf.size(wire, tf.int64) * wire.dtype.size
            outputs = self._reduce_wires(wires, [positions[i] for i, _, _ in plain])
            for (index, _, compressor), output, ctx in zip(plain, outputs, contexts):
                reduced[index] = compressor.decompress(output, ctx)
            if by_plan:
                results = self._reduce_by_plan([(positions[index], grad, c) for index, grad, c in by_plan])
                for (index, _, _), (output, size) in zip(by_plan, results):
                    reduced[index], sent[positions[index]] = output, size
        return reduced, sent

    def _reduce_by_plan(self, items: list[tuple[int, tf.Tensor, PacTrainCompressor]]) -> list[_Reduced]:
        """``packed_values`` fp16 or ternary: a pruned tensor's packed values travel another way than its dense
        ones, and its plan is known only when the step runs, so each takes a ``tf.cond`` on its plan
        (every rank the same branch: the plans agree). Returns (reduced gradient, bytes sent) each."""
        results = []
        for position, grad, compressor in items:
            if self._ternary is not None:
                packed = functools.partial(self._ternary.allreduce, self._names[position], compressor, grad,
                                           self.op == hvd.Average, grad.dtype, self._wire_name("ternary", position))
            else:
                packed = functools.partial(self._reduce_packed, position, grad, compressor)
            plain = functools.partial(self._reduce_plain, position, grad, compressor)
            results.append(tf.cond(tf.equal(compressor.plan, PACKED), packed, plain))
        return results

    def _reduce_packed(self, position: int, grad: tf.Tensor, compressor: PacTrainCompressor) -> _Reduced:
        """Surviving values as ``_packed_compression`` says (fp16)."""
        wire, ctx = self._packed_compression.compress(compressor.survivors(grad))
        output = hvd.allreduce(wire, name=self._wire_name("packed", position), **self._reduce_arguments())
        values = self._packed_compression.decompress(output, ctx)
        return compressor.unpack(values), tf.size(wire, tf.int64) * wire.dtype.size

    def _reduce_plain(self, position: int, grad: tf.Tensor, compressor: PacTrainCompressor) -> _Reduced:
        """As ``compression`` says, whatever the plan (here: not packed)."""
        wire, ctx = compressor.compress(grad)
        output = hvd.allreduce(wire, name=self._wire_name("plain", position), **self._reduce_arguments())
        return compressor.decompress(output, ctx), tf.size(wire, tf.int64) * wire.dtype.size

    def _wire_name(self, kind: str, position: int) -> str:
        """A Horovod name per tensor: ops in ``tf.cond`` branches are not uniquified by TF as ops of one graph are."""
        return f"pactrain_{kind}_" + re.sub("[^a-zA-Z0-9_]", "_", self._names[position])

    def _reduce_arguments(self) -> dict[str, Any]:
        return dict(op=self.op, process_set=self.process_set,
                    **scale_factors(self.op == hvd.Average, self.gradient_predivide_factor))

    def _reduce_wires(self, wires: list[tf.Tensor], positions: list[int]) -> list[tf.Tensor]:
        if not wires:
            return wires
        common = self._reduce_arguments()
        if self.groups is None:
            return [hvd.allreduce(wire, **common) for wire in wires]
        outputs: list[Any] = [None] * len(wires)
        for members in self._group(positions):
            grouped = hvd.grouped_allreduce([wires[i] for i in members], **common)
            for i, output in zip(members, grouped):
                outputs[i] = output
        return outputs

    def _group(self, positions: list[int]) -> list[list[int]]:
        """Split wire indices into Horovod groups: ``groups`` chunks, or by the given variable lists."""
        if isinstance(self.groups, int):
            return [members for members in split_list(list(range(len(positions))), self.groups) if members]
        group_of = {}
        for number, group in enumerate(self.groups):
            for variable in group:
                group_of[self._positions.get(backing_variable(variable).ref())] = number
        grouped: dict[Any, list[int]] = {}
        for i, position in enumerate(positions):
            grouped.setdefault(group_of.get(position, ("alone", i)), []).append(i)
        return list(grouped.values())

    def _allgather_sparse(self, grad: tf.IndexedSlices) -> tuple[tf.IndexedSlices, tf.Tensor]:
        """Unpruned sparse gradients travel as Horovod sends them: values and indices allgathered."""
        with tf.device(self.device_sparse):
            reduced = hvd.allreduce(grad, op=self.op, compression=self.compression, process_set=self.process_set)
        sent = sum(tf.size(part, tf.int64) * part.dtype.size for part in (grad.values, grad.indices))
        return reduced, sent

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

    # -- checkpoints (tf.train.Checkpoint calls these) --------------------------------------------
    def serialize(self) -> bytes:
        """Schedule position and masks as an ``.npz`` blob; with ``packed_values="ternary"`` also the held scales
        (the same on every rank) and this rank's error memory and rounding-noise state (restored only on
        the same rank, as in torch).

        Masks are keyed by the variable's position in binding order (the model's variable
        order), so they restore into a rebuilt model whose generated names differ (Keras
        numbers layers per process); the saved names serve the error messages.
        """
        if self._pending_restore is not None:
            return self._pending_restore
        names = sorted(self._pruner.masks)
        ternary = {}
        if self._ternary is not None:
            scaled = sorted(self._ternary.scales)
            ternary = {"ternary_rank": np.int64(self.process_set.rank()),
                       "ternary_noise": self._ternary.noise.generator.state.numpy(),
                       "scale_positions": np.array([self._names.index(name) for name in scaled], dtype=np.int64),
                       "ternary_scales": np.array([self._ternary.scales[name].numpy() for name in scaled], np.float32),
                       **{f"residual_{i}": self._ternary.memory.residuals[name].numpy() for i, name in enumerate(names)}}
        buffer = io.BytesIO()
        np.savez(buffer, step=np.int64(self.step_count), world_size=np.int64(self._group_size()),
                 names=np.array(names, dtype=np.str_),
                 positions=np.array([self._names.index(name) for name in names], dtype=np.int64),
                 **{f"mask_{i}": self._pruner.masks[name] for i, name in enumerate(names)}, **ternary)
        return buffer.getvalue()

    def deserialize(self, string_value: bytes) -> None:
        """Restore schedule position and masks; local, validated before anything changes."""
        step, saved, ternary = _parse_state(string_value)
        check_saved_world_size(_saved_world_size(string_value), self._group_size())
        if not self._names:
            self._pending_restore = bytes(string_value)  # applied when the state binds to its variables
            self._set_step(step)
            return
        self._restore(step, saved, ternary)

    def _restore(self, step: int, saved: list[tuple[int, str, np.ndarray]], ternary: _SavedTernary | None) -> None:
        masks = {}
        for position, saved_name, mask in saved:
            if position >= len(self._names):
                raise CheckpointError(f"checkpoint has a mask for variable #{position} ({saved_name!r}), but only "
                                      f"{len(self._names)} variables are bound here")
            masks[self._names[position]] = mask
        try:
            masks = self._pruner.validate(masks)
        except (TypeError, ValueError) as error:
            raise CheckpointError(f"checkpoint does not fit these variables: {error}") from error
        residuals = self._saved_residuals(ternary, masks)
        scales = ternary[3] if ternary else {}
        bad = {self._names[p] if p < len(self._names) else p: v for p, v in scales.items()
               if not (np.isnan(v) or 0 <= v < np.inf)}
        if bad:
            raise CheckpointError(f"checkpoint ternary scales must be >= 0 and finite, or NaN (none held), got {bad}")
        self._set_step(step)
        self._install(masks)
        if self._ternary is not None:  # none held where the checkpoint has none: that step agrees one
            self._ternary.hold_scales({self._names[p]: v for p, v in scales.items() if p < len(self._names)})
        if residuals is not None:
            self._ternary.noise.generator.state.assign(ternary[1])
            for name, residual in residuals.items():
                self._ternary.memory.residuals[name].assign(residual)

    def _saved_residuals(self, ternary: _SavedTernary | None, masks: dict[str, np.ndarray]) -> dict | None:
        """The checkpoint's residuals by name, checked against the masks, if this rank saved them."""
        if ternary is None or self._ternary is None:
            return None
        rank, _, by_position, _ = ternary
        if not saved_by_this_rank(rank, self.process_set.rank):
            return None
        residuals = {}
        for position, residual in by_position.items():
            name = self._names[position]
            expected = int(masks[name].sum()) if self._packs(masks.get(name)) else 0
            if residual.ndim != 1 or residual.size != expected:
                raise CheckpointError(f"ternary residual of {name!r} has shape {residual.shape}, its packed values "
                                      f"number {expected}")
            residuals[name] = residual.astype(np.float32)
        return residuals


# saving rank, noise state, residual by position (those three: that rank's), held scale by position (every rank's)
_SavedTernary = tuple[int, np.ndarray, dict[int, np.ndarray], dict[int, float]]


def _parse_state(blob: bytes) -> tuple[int, list[tuple[int, str, np.ndarray]], _SavedTernary | None]:
    """(step, [(position, saved name, mask)], ternary memory or None) from ``PacTrainState.serialize``."""
    try:
        with np.load(io.BytesIO(blob), allow_pickle=False) as saved:
            names = [str(name) for name in saved["names"]]
            positions = [int(position) for position in saved["positions"]]
            entries = [(position, name, saved[f"mask_{i}"]) for i, (position, name) in enumerate(zip(positions, names))]
            ternary = None
            if "ternary_rank" in saved.files:
                scales = ({int(position): float(scale) for position, scale in
                           zip(saved["scale_positions"], saved["ternary_scales"])} if "ternary_scales" in saved.files
                          else {})
                ternary = (int(saved["ternary_rank"]), saved["ternary_noise"],
                           {position: saved[f"residual_{i}"] for i, position in enumerate(positions)}, scales)
            return int(saved["step"]), entries, ternary
    except (OSError, KeyError, ValueError, EOFError) as error:
        raise CheckpointError(f"not a PacTrain state: {error}") from error


def _saved_world_size(blob: bytes) -> int | None:
    """The world size a ``PacTrainState.serialize`` blob was written under (None: written before it was recorded)."""
    with np.load(io.BytesIO(blob), allow_pickle=False) as saved:
        return int(saved["world_size"]) if "world_size" in saved.files else None


def _zero_pruned(weight: tf.Variable, mask: tf.Variable) -> tf.Tensor:
    weight.assign(tf.where(mask, weight, tf.zeros_like(weight)))
    return tf.constant(True)


def scale_gradient(grad: Any, factor: Any) -> Any:
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values * factor, grad.indices, grad.dense_shape)
    return grad * factor
