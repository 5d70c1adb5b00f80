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

The class is assembled from one module per concept: ``binding.py`` (variables join the state),
``maintenance.py`` (masks, plan, schedule and Mask Tracker between steps), ``engine.py`` (the
all-reduces); checkpoints go through ``snapshot`` and ``restore`` (the format: ``checkpoint.py``).
"""

from __future__ import annotations

from typing import Any

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf
from horovod.tensorflow.compression import Compression, Compressor

from pactrain_hvd.core import (
    CheckpointError,
    StepStats,
    TensorStats,
    check_saved_world_size,
    saved_by_this_rank,
)
from pactrain_hvd.core.agreement import horovod_settings
from pactrain_hvd.core.config import LOCAL_STEP_KEYWORDS, horovod_op, pactrain_keywords, reduce_op_name
from pactrain_hvd.core.cycle import PruningCycle
from pactrain_hvd.core.encodings import ENCODINGS, packed_values_argument
from pactrain_hvd.core.lanes import quantized_layout
from pactrain_hvd.core.lifecycle import StepLifecycle
from pactrain_hvd.core.resume import check_saved_settings, checkpoint_settings
from pactrain_hvd.tensorflow import checkpoint
from pactrain_hvd.tensorflow.arguments import checked_arguments
from pactrain_hvd.tensorflow.binding import Binding
from pactrain_hvd.tensorflow.compression import PACKED_WIRES, PacTrainCompressor
from pactrain_hvd.tensorflow.engine import HorovodEngine
from pactrain_hvd.tensorflow.maintenance import Maintenance
from pactrain_hvd.tensorflow.pruning import Pruner, backing_variable
from pactrain_hvd.tensorflow.ternary import TernaryReduction


class PacTrainState(Binding, Maintenance, HorovodEngine, tf.train.experimental.PythonState):
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
    is caught by the Mask Tracker at step 0); ``rescale_survivors`` as in torch. ``optimizer``: whose slots (momentum, Adam
    moments) are zeroed at newly pruned coordinates when masks change. ``masks``: bring your own
    mask, ``{variable name: bool mask}`` or a model wrapped by tfmot's ``prune_low_magnitude``;
    fixed (the schedule is off) unless ``continue_pruning=True`` (see ``core.own_masks``).
    ``resume_changed_settings``: restore a checkpoint saved with another ``sparsity``, schedule, ``ranking``
    or ``packed_values`` (with a warning) instead of raising ``CheckpointError``. Every rank must pass the
    same settings: the first step proves it (``SettingsMismatchError`` on every rank instead of a hang).
    ``packed_values``: how packed values travel, as in torch: ``"inherit"`` as ``compression`` says,
    ``"fp16"``, ``"ternary"`` or ``"int3"`` (shared-scale stochastic codes in {-1, 0, 1} or [-3, 3] with
    error feedback in int32 lanes, fp16 beyond 644 or 214 ranks; op Average or Sum); ``values=`` is its
    deprecated old name. Dense-plan and unpruned tensors travel as ``compression`` says. ``"fp16"``,
    ``"ternary"`` and ``"int3"`` are not combinable with ``groups``:
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

    @pactrain_keywords(without=LOCAL_STEP_KEYWORDS)
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
        prunable, op = pactrain["prunable"], horovod_op(hvd, op)  # op None: Average, as Horovod reads it
        self.config, self._own_masks, groups = checked_arguments(
            compression=compression, op=op, gradient_predivide_factor=gradient_predivide_factor, groups=groups,
            packed_values=packed_values, process_set=process_set, device_dense=device_dense,
            device_sparse=device_sparse, optimizer=optimizer, **pactrain)
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
        layout = quantized_layout(process_set.size(), encoding.levels) if encoding.quantized else None
        # A rank outside the process set never reduces.
        self._ternary = TernaryReduction(process_set, encoding.levels) if layout is not None and process_set.included() else None
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
        self.broadcast_request: Any = None  # a pending broadcast (functions.broadcast_variables_at_next_reduction)
        self._zero_in_graph = False  # binding inside a trace: see ``bind``
        self._zero_due: tf.Variable | None = None  # set when masks were installed at a traced binding
        # Every check proves the position (the Pruner skips what a process alone need not prove); the first step checks.
        self.cycle = PruningCycle(self.config, tracking=True)
        self.lifecycle = StepLifecycle(self.cycle, self)
        with tf.init_scope():
            # The traced step's mirrors of the cycle: its position (which the graph advances) and next maintenance step.
            self._step = tf.Variable(0, dtype=tf.int64, trainable=False, name="pactrain_step")
            self._next_due = tf.Variable(self.cycle.next_due(), dtype=tf.int64, trainable=False,
                                         name="pactrain_next_maintenance")
            self._sent_bytes = tf.Variable(tf.zeros([0], tf.int64), shape=tf.TensorShape([None]), trainable=False,
                                           name="pactrain_sent_bytes")
            # Per bound variable, the factor the next zeroing applies to its survivors (1 but at rescale_survivors).
            self._survivor_scales = tf.Variable(tf.ones([0]), shape=tf.TensorShape([None]), trainable=False,
                                                name="pactrain_survivor_scales")
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

        ``values`` says how packed values travelled: as the ``packed_values`` argument, or ``"fp16"`` where a
        quantized encoding fell back (too many ranks for 3 lanes per word).
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

    def share_settings(self, **settings: Any) -> None:
        """More settings every rank must hold the same (proven at every Mask Tracker check, the first step's
        included), e.g. the Keras optimizer's ``backward_passes_per_step``."""
        self._pruner.settings.update(settings)

    def shared_settings(self) -> dict[str, Any]:
        """What every rank must hold the same, by name (``core.agreement``)."""
        return dict(self._pruner.settings)

    # -- checkpoints (tf.train.Checkpoint calls these; the format: checkpoint.py) --------------------
    def serialize(self) -> bytes:
        """Schedule position and masks (and ternary's held scales, error memory and noise) as bytes."""
        if self._pending_restore is not None:
            return self._pending_restore
        return checkpoint.to_bytes(self.snapshot())

    def deserialize(self, string_value: bytes) -> None:
        """Restore schedule position and masks; local, validated before anything changes."""
        saved = checkpoint.parse(string_value)
        check_saved_settings(saved.settings, checkpoint_settings(self.config, self.packed_values), saved.step,
                             self.config)
        check_saved_world_size(saved.world_size, self._group_size())
        if not self._names:
            self._pending_restore = bytes(string_value)  # applied when the state binds to its variables
            self._set_step(saved.step)
            return
        self.restore(saved)

    def snapshot(self) -> checkpoint.SavedState:
        """What a checkpoint saves: schedule position, world size, settings and masks (by variable position);
        with ternary values the held scales and this rank's error memory and rounding-noise state."""
        names = sorted(self._pruner.masks)
        masks = [(self._names.index(name), name, self._pruner.masks[name]) for name in names]
        ternary = None
        if self._ternary is not None:
            residuals = self._ternary.memory.state_dict()
            ternary = checkpoint.SavedTernary(
                self.process_set.rank(), self._ternary.noise.generator.state.numpy(),
                {position: residuals[name] for position, name, _ in masks},
                {self._names.index(name): float(scale.numpy()) for name, scale in self._ternary.scales.items()})
        return checkpoint.SavedState(self.step_count, self._group_size(), masks, ternary,
                                     checkpoint_settings(self.config, self.packed_values))

    def restore(self, saved: checkpoint.SavedState) -> None:
        """Install a checkpoint's state into the bound variables; validated before anything changes. Local."""
        try:
            masks = self._pruner.validate(checkpoint.masks_by_name(saved, self._names))
        except (TypeError, ValueError) as error:
            raise CheckpointError(f"checkpoint does not fit these variables: {error}") from error
        residuals = None
        if (saved.ternary is not None and self._ternary is not None
                and saved_by_this_rank(saved.ternary.rank, self.process_set.rank,
                                       holds_state=saved.step > 0)):
            residuals = checkpoint.residuals_by_name(saved.ternary, self._names, {
                name: int(mask.sum()) if self._packs(mask) else 0 for name, mask in masks.items()})
        scales = checkpoint.scales_by_name(saved, self._names)
        self._set_step(saved.step)
        self._install(masks)
        if self._ternary is not None:  # none held where the checkpoint has none: that step agrees one
            self._ternary.hold_scales(scales)
        if residuals is not None:
            self._ternary.noise.generator.state.assign(saved.ternary.noise)
            self._ternary.memory.load_state_dict(residuals)


