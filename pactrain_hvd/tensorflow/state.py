"""``PacTrainState``: Horovod's TF gradient all-reduce, pruned and packed, and what persists between steps.

One explicit state object holds what persists between steps and does the reduction for both façades:
``DistributedGradientTape`` (``tape.py``) and the Keras ``DistributedOptimizer`` (``keras/optimizer.py``).

How a step runs, in or out of ``tf.function``:

1. *Maintenance*, only at the steps that need it, all of them steps every rank knows of: a
   schedule update, and Mask Tracker checks at the state's first step, every ``verify_every``
   steps and after ``broadcast_masks`` (a local call such as ``set_masks`` or a restore
   schedules none: the other ranks would all-reduce while this one allgathers). Masks are
   recomputed from the weights with numpy (``core.magnitude_masks``, as in torch), verified across
   ranks, and written into TF variables. Where nothing is communicated (``pruning.communicates``)
   pruning is local and nothing verified. Eagerly it is a plain call; inside a traced function a
   ``tf.cond`` on the step counter runs it through ``tf.py_function``, and every op of the step is
   ordered after it. Pruned weights and optimizer slots are zeroed by graph ops, before the update.
2. Per gradient, ``PacTrainCompressor`` reads its mask, surviving indices and plan from
   variables, so the traced graph stays valid across mask changes: nothing is retraced.
3. Horovod all-reduces the packed vectors (no indices travel), the compressor scatters back.

The state is composed of one member per concept, sharing one record, ``bound`` (``bound.py``: the bound
variables and each one's plan): ``binding`` (variables join the state), ``maintenance`` (masks, plans,
schedule position and Mask Tracker between steps), ``engine`` (the all-reduces); checkpoints go through
``snapshot`` and ``restore`` (the format: ``checkpoint.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf
from horovod.tensorflow.compression import Compression, Compressor

from pactrain_hvd.core import StepStats, TensorStats
from pactrain_hvd.core.checkpoint import SavedState, from_npz, to_npz
from pactrain_hvd.core.keywords import documents_keywords, pactrain_keywords
from pactrain_hvd.core.lanes import quantized_layout
from pactrain_hvd.core.resume import check_resumable, checkpoint_settings
from pactrain_hvd.tensorflow import checkpoint
from pactrain_hvd.tensorflow.arguments import checked_arguments
from pactrain_hvd.tensorflow.binding import Binding
from pactrain_hvd.tensorflow.bound import BoundTensors
from pactrain_hvd.tensorflow.compression import PACKED_WIRES
from pactrain_hvd.tensorflow.engine import HorovodEngine, ReductionArguments
from pactrain_hvd.tensorflow.maintenance import Maintenance
from pactrain_hvd.tensorflow.outer import OuterSync
from pactrain_hvd.tensorflow.pruning import Pruner
from pactrain_hvd.tensorflow.quantized import QuantizedReduction


@documents_keywords()
class PacTrainState(tf.train.experimental.PythonState):
    """What persists between steps: schedule position, masks, packing plan, wire accounting.

    The state binds to the variables of its first ``reduce`` call (more may join later). It is checkpointable:
    in a ``tf.train.Checkpoint`` it saves masks and schedule position (the Keras optimizer carries its own). A
    schedule that prunes at step 0 ranks the masks from the weights every rank holds then: broadcast the
    variables before the first step. Every rank must pass the same settings: the first step proves it. Local
    steps (``sync_every``) need the optimizer's update between the reduction and the sync: the Keras
    ``DistributedOptimizer`` drives them (in custom loops too), a tape refuses them.

    Args:
        compression: Horovod's compressor for tensors that travel dense (and packed values that inherit it).
        sparse_as_dense: as Horovod: densify sparse gradients (a pruned variable's must be dense).
        op: ``hvd.Average`` (default) or ``hvd.Sum``, ``hvd.Min``, ``hvd.Max``; not Adasum.
        gradient_predivide_factor: as Horovod: divide before the sum and multiply after.
        groups: as Horovod; not with fp16 or quantized ``packed_values`` (a plan is chosen as the step runs).
        process_set: as Horovod: the ranks this state reduces with.
        device_dense: as Horovod: where dense all-reduces run.
        device_sparse: as Horovod: where sparse all-gathers run.
        scale_local_gradients: as Horovod: gradients of local variables are scaled by 1/size.
        optimizer: whose slots (momentum, Adam moments) are zeroed at newly pruned coordinates.
        {pactrain_keywords}

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
        # stacklevel: values= warns at the caller (checked_arguments, this frame, the keyword wrapper's, the caller's)
        settings, own_masks = checked_arguments(
            compression=compression, op=op, gradient_predivide_factor=gradient_predivide_factor, groups=groups,
            process_set=process_set, device_dense=device_dense, device_sparse=device_sparse, optimizer=optimizer,
            stacklevel=4, **pactrain)
        self.config, encoding = settings.config, settings.encoding
        layout = quantized_layout(process_set.size(), encoding.levels) if encoding.quantized else None
        self._encoding = encoding.reported(lanes_fit=layout is not None)
        self.reduction = ReductionArguments(
            compression=compression, sparse_as_dense=bool(sparse_as_dense), op=settings.op,
            gradient_predivide_factor=float(gradient_predivide_factor), groups=settings.groups, process_set=process_set,
            device_dense=device_dense, device_sparse=device_sparse, scale_local_gradients=bool(scale_local_gradients),
            packed_values=settings.packed_values,
            packed_compression=encoding.wire_of(PACKED_WIRES, "horovod.tensorflow") or compression)
        pruner = Pruner({}, [], self.config.schedule, self.config.ranking, process_set,
                        settings=settings.agreed(compression))
        # A rank outside the process set never reduces.
        quantized = (QuantizedReduction(process_set, encoding.levels)
                     if layout is not None and process_set.included() else None)
        outer = OuterSync(self.config.outer_lr, self.config.outer_momentum) if self.config.sync_every > 1 else None
        self.bound = BoundTensors(pruner, quantized, outer)
        self.maintenance = Maintenance(self.bound, self.config, optimizer, tfmot_masks={})
        self.binding = Binding(self.bound, self.maintenance, pactrain["prunable"], compression, own_masks, self.restore)
        self.engine = HorovodEngine(self.bound, self.binding, self.maintenance, self.reduction)

    # -- what users read ------------------------------------------------------------------------
    @property
    def step_count(self) -> int:
        """Gradient reductions done: the schedule position."""
        return int(self.maintenance.step.numpy())

    @property
    def process_set(self) -> hvd.ProcessSet:
        return self.reduction.process_set

    @property
    def optimizer(self) -> Any:
        """Whose slots (momentum, Adam moments) are zeroed at newly pruned coordinates."""
        return self.maintenance.optimizer

    @optimizer.setter
    def optimizer(self, optimizer: Any) -> None:
        self.maintenance.optimizer = optimizer

    @property
    def traces(self) -> int:
        """Times the reduction was traced into a graph; mask changes add none."""
        return self.engine.traces

    def masks(self) -> dict[str, np.ndarray]:
        """``{variable name: bool mask}`` for every pruned variable (copies; restored but not yet
        bound: under the names they were saved with)."""
        if self.binding.pending_restore is not None:
            return dict(from_npz(self.binding.pending_restore).masks)
        return {name: mask.copy() for name, mask in self.bound.pruner.masks.items()}

    def stats(self) -> dict:
        """The last step's wire bytes (sent and dense-equivalent), bits per packed value, per-tensor density and plan.

        ``values`` says how packed values travelled: as the ``packed_values`` argument, or ``"fp16"`` where a
        quantized encoding fell back (too many ranks for 3 lanes per word).
        """
        bound = self.bound
        sent = bound.sent_bytes.numpy()
        tensors = {}
        for position, name in enumerate(bound.names):
            if position >= sent.size or sent[position] < 0:
                continue  # not communicated in the last step (no gradient, or a local source)
            numel = bound.pruner.variables[name].shape.num_elements()
            mask = bound.pruner.masks.get(name)
            tensors[name] = TensorStats(numel=numel, kept=numel if mask is None else int(mask.sum()),
                                        packed=bound.packed.get(name, False), sent_bytes=int(sent[position]),
                                        dense_bytes=bound.dense_bytes[position])
        stats = StepStats(step=max(self.step_count - 1, 0), tensors=tensors)
        return dict(stats.as_dict(), sparsity=bound.pruner.sparsity(), values=self._encoding)

    # -- the step ----------------------------------------------------------------------------------
    def reduce(self, grads: Sequence[Any], variables: Sequence[Any]) -> list[Any]:
        """All-reduce ``grads`` of ``variables`` (pruned ones packed) and advance the schedule one step
        (``HorovodEngine.reduce``)."""
        return self.engine.reduce(grads, variables)

    def sync_if_due(self) -> None:
        """Local steps (``sync_every``), after the optimizer's update: the outer sync where an interval ended
        (``HorovodEngine.sync_if_due``); nothing otherwise. Graph-safe."""
        if self.bound.outer is not None:
            self.engine.sync_if_due()

    def bind(self, variables: Sequence[Any]) -> tuple[int, ...]:
        """Register variables (idempotent); returns their positions. Safe inside ``tf.function``."""
        return self.binding.bind(variables)

    def enforce(self, variables: Iterable[Any]) -> None:
        """Pruned weights become exactly 0 (+0.0) whatever the optimizer did; graph-safe."""
        self.maintenance.enforce(variables)

    def on_every_rank(self, flag: Any) -> tf.Tensor:
        """Whether ``flag`` holds on every rank this state reduces with (one int all-reduce); ``flag`` itself
        where nothing is communicated. For decisions all ranks must take alike, such as skipping a step."""
        return self.engine.on_every_rank(flag)

    def register_local(self, variable: Any) -> None:
        """Gradients of ``variable`` stay local: not reduced (scaled by 1/size if ``scale_local_gradients``)."""
        self.binding.register_local(variable)

    def is_local(self, variable: Any) -> bool:
        return self.binding.is_local(variable)

    # -- masks and settings ------------------------------------------------------------------------
    def set_masks(self, masks: dict[str, Any]) -> None:
        """Replace the masks (bool arrays or tensors by variable name); local, no communication.

        Schedules no verification (the other ranks would not know of it): ranks are proven to agree
        at the next step that every rank verifies (the first, a mask update, every ``verify_every``
        steps, after ``broadcast_masks``), or now with ``verify()`` called on every rank.
        """
        if not isinstance(masks, dict):
            raise TypeError(f"masks must be a dict of variable name -> bool array, got {type(masks).__name__}")
        self.maintenance.install(self.bound.pruner.validate({name: np.asarray(mask) for name, mask in masks.items()}))

    def verify(self) -> None:
        """Mask Tracker, now: a collective call that raises ``MaskMismatchError`` on every rank."""
        self.bound.pruner.verify(self.step_count)

    def request_verification(self) -> None:
        """Verify masks at the next step. Only for calls every rank makes (``broadcast_masks``, elastic
        sync): a rank that verifies alone waits for the others forever."""
        self.maintenance.request_verification()

    def share_settings(self, **settings: Any) -> None:
        """More settings every rank must hold the same (proven at every Mask Tracker check, the first step's
        included), e.g. the Keras optimizer's ``backward_passes_per_step``."""
        self.bound.pruner.settings.update(settings)

    def shared_settings(self) -> dict[str, Any]:
        """What every rank must hold the same, by name (``core.agreement``)."""
        return dict(self.bound.pruner.settings)

    # -- checkpoints (tf.train.Checkpoint calls these; the format: checkpoint.py) --------------------
    def serialize(self) -> bytes:
        """Schedule position and masks (and quantized values' held scales and error memory, local steps' anchor
        and outer momentum) as bytes."""
        if self.binding.pending_restore is not None:
            return self.binding.pending_restore
        return to_npz(self.snapshot())

    def deserialize(self, string_value: bytes) -> None:
        """Restore schedule position and masks; local, validated before anything changes."""
        saved = from_npz(string_value)
        check_resumable(saved, self.config, self.reduction.packed_values, self.reduction.group_size())
        if not self.bound.names:
            self.binding.pending_restore = bytes(string_value)  # applied when the state binds to its variables
            self.maintenance.set_step(saved.step)
            return
        self.restore(saved)

    def snapshot(self) -> SavedState:
        """What a checkpoint saves (``checkpoint.snapshot``)."""
        settings = checkpoint_settings(self.config, self.reduction.packed_values)
        return checkpoint.snapshot(self.bound, self.step_count, settings, self.reduction.group_size(),
                                   self.process_set.rank)

    def restore(self, saved: SavedState) -> None:
        """Install a checkpoint's state into the bound variables (``checkpoint.restore``); local."""
        checkpoint.restore(self.bound, self.maintenance, saved, self.process_set.rank)
