"""``HorovodEngine``: a ``PacTrainState``'s reduction, per tensor by the plan's codec.

What upstream's ``_make_allreduce_grads_fn`` does (compress, all-reduce, grouped as Horovod would,
decompress; sparse gradients allgathered), except that a pruned tensor's codec is its
``PacTrainCompressor``, which reads its mask and plan from variables. With ``packed_values`` fp16 or
ternary, a pruned tensor's packed values travel another way than its dense ones, so it takes a
``tf.cond`` on its plan. Before the all-reduces of a step: binding of new variables, a pending
broadcast, and the maintenance due at the step (``Maintenance``). With local steps (``sync_every``) a step's
gradients stay on their rank, and ``sync_if_due`` reduces the interval's progress after the update instead.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import horovod.tensorflow as hvd
import tensorflow as tf
from horovod.common.util import split_list
from horovod.tensorflow.compression import Compressor

from pactrain_hvd.core.config import scale_factors
from pactrain_hvd.core.encodings import ENCODINGS
from pactrain_hvd.tensorflow.binding import Binding
from pactrain_hvd.tensorflow.bound import BoundTensors
from pactrain_hvd.tensorflow.compression import PACKED, PacTrainCompressor
from pactrain_hvd.tensorflow.maintenance import Maintenance
from pactrain_hvd.tensorflow.pruning import backing_variable, build_optimizer, communicates, run_if, safe_name

_Reduced = tuple[tf.Tensor, tf.Tensor]  # a reduced gradient and the bytes its tensor put on the wire


@dataclasses.dataclass(frozen=True)
class ReductionArguments:
    """What a reduction was asked for: Horovod's arguments (as ``hvd.DistributedGradientTape`` takes them),
    ``packed_values``, and the compressor packed values travel with (``compression`` where it inherits)."""

    compression: type[Compressor]
    sparse_as_dense: bool
    op: Any
    gradient_predivide_factor: float
    groups: int | list | None
    process_set: hvd.ProcessSet
    device_dense: str
    device_sparse: str
    scale_local_gradients: bool
    packed_values: str
    packed_compression: type[Compressor]

    def group_size(self) -> int:
        """The ranks a reduction averages over: the process set's, or 1 outside it (where Horovod's
        ``ProcessSet.size()`` may even fail: "Process set does not exist or has not been registered")."""
        return self.process_set.size() if self.process_set.included() else 1


class HorovodEngine:
    """The reduction of one step's gradients: ``reduce``.

    Args:
        bound: the bound variables and their plans (read; the bytes sent written).
        binding: binds the variables of each reduction.
        maintenance: masks, plans and step counter between steps.
        arguments: Horovod's arguments and ``packed_values``.
    """

    def __init__(self, bound: BoundTensors, binding: Binding, maintenance: Maintenance,
                 arguments: ReductionArguments) -> None:
        self.bound = bound
        self.binding = binding
        self.maintenance = maintenance
        self.arguments = arguments
        self.broadcast_request: Any = None  # a pending broadcast (functions.broadcast_variables_at_next_reduction)
        self.traces = 0  # times the reduction was traced into a graph; mask changes add none
        # Not converted by AutoGraph: the branches are tf.cond already, as in a traced step (``reduce`` is not).
        self._communicate_eagerly = tf.function(self._communicate, autograph=False)
        self._sync_eagerly = tf.function(self._sync, autograph=False)

    @tf.autograph.experimental.do_not_convert
    def reduce(self, grads: Sequence[Any], variables: Sequence[Any]) -> list[Any]:
        """All-reduce ``grads`` of ``variables`` (pruned ones packed) and advance the schedule one step.

        Eagerly, maintenance runs here in Python and the communication in a cached
        ``tf.function`` (as Horovod does); inside a traced function both become graph ops.
        Before maintenance: a broadcast asked for by ``broadcast_variables_at_next_reduction`` (variables
        bound and the optimizer built first, so all exist), then the zeroing of masks installed when a
        trace bound the variables.
        """
        if len(grads) != len(variables):
            raise ValueError(f"got {len(grads)} gradients for {len(variables)} variables")
        grads = list(grads)
        shared = [i for i, v in enumerate(variables) if not self.binding.is_local(v)]
        bound = len(self.bound.names)
        positions = self.binding.bind([variables[i] for i in shared])
        if len(self.bound.names) > bound:  # slots are cleared by ops traced before the optimizer's: create them now
            with tf.init_scope():
                build_optimizer(self.maintenance.optimizer, variables)
        shared_grads = [grads[i] for i in shared]
        self._refuse_sparse_pruned(shared_grads, positions)
        before = [] if self.broadcast_request is None else [self.broadcast_request([variables[i] for i in shared])]
        with tf.control_dependencies(before):
            before += self.maintenance.zeroing_due()
        with tf.control_dependencies(before):
            if not tf.executing_eagerly():
                reduced = self._communicate(shared_grads, positions, maintain=True)
            else:
                step = int(self.maintenance.step.numpy())
                if self.maintenance.cycle.maintenance_due(step):
                    self.maintenance.maintain(step)
                reduced = self._communicate_eagerly(shared_grads, positions, maintain=False)
        local = sorted(set(range(len(grads))) - set(shared))
        for i, grad in zip(shared, reduced):
            grads[i] = grad
        size = self.arguments.group_size() if local else 1
        if self.arguments.scale_local_gradients and size > 1:
            for i in local:
                grads[i] = None if grads[i] is None else scale_gradient(grads[i], 1.0 / size)
        return grads

    def on_every_rank(self, flag: Any) -> tf.Tensor:
        """Whether ``flag`` holds on every rank this state reduces with (one int all-reduce); ``flag`` itself
        where nothing is communicated. For decisions all ranks must take alike, such as skipping a step."""
        flag = tf.convert_to_tensor(flag, tf.bool)
        if not communicates(self.arguments.process_set):
            return flag
        agreed = hvd.allreduce(tf.cast(flag, tf.int32), op=hvd.Min, name="pactrain.on_every_rank",
                               process_set=self.arguments.process_set)
        return tf.cast(agreed, tf.bool)

    def _refuse_sparse_pruned(self, grads: list[Any], positions: tuple[int, ...]) -> None:
        """Before maintenance and communication: a prunable variable's gradient must be dense."""
        if self.arguments.sparse_as_dense:
            return
        for grad, position in zip(grads, positions):
            name = self.bound.names[position]
            if isinstance(grad, tf.IndexedSlices) and name in self.bound.compressors:
                raise ValueError(f"variable {name!r} has a sparse gradient (tf.IndexedSlices): pass "
                                 "sparse_as_dense=True (packing needs dense gradients)")

    def _communicate(self, grads: list[Any], positions: tuple[int, ...], maintain: bool) -> list[Any]:
        self.traces += 1
        maintenance = self.maintenance
        with tf.name_scope("PacTrain"):
            dependencies = []
            if maintain:
                step = maintenance.step.read_value()
                changed = run_if(maintenance.due(step), lambda: tf.ensure_shape(
                    tf.py_function(maintenance.maintain_in_graph, [step], tf.bool), []))
                # Zeroing is done by graph ops, not in the py_function: TF's automatic control
                # dependencies order them after this step's reads of the weights and before the
                # optimizer's update of weights and slots, which a py_function's writes are not.
                with tf.control_dependencies([changed]):
                    dependencies.append(run_if(changed, maintenance.zero_pruned))
            with tf.control_dependencies(dependencies):
                reduced, recorded = self._allreduce(grads, positions, local=maintenance.cycle.local)
                done = [recorded]
                if maintenance.cycle.local:  # after the maintenance's zeroing, before the update
                    done.append(run_if(maintenance.interval_begins(), self.bound.outer.take_anchor))
            with tf.control_dependencies(done):
                maintenance.step.assign_add(1)
        return reduced

    # -- local steps (``core.local_steps``) ---------------------------------------------------------
    def sync_if_due(self) -> None:
        """After the update, where an interval ended: the outer sync through each tensor's codec. Graph-safe."""
        if not tf.executing_eagerly():
            run_if(self.maintenance.interval_begins(), self._sync)
        elif self.maintenance.interval_begins():
            self._sync_eagerly()

    def _sync(self) -> tf.Tensor:
        outer = self.bound.outer
        positions = tuple(self.bound.positions[variable.ref()] for variable in outer.variables.values())
        reduced, recorded = self._allreduce(outer.outer_gradients(), positions)
        with tf.control_dependencies([recorded]):
            outer.step(reduced)
        return tf.constant(True)

    def _allreduce(self, grads: list[Any], positions: tuple[int, ...],
                   local: bool = False) -> tuple[list[Any], tf.Tensor]:
        """Compress, reduce (grouped as Horovod would), decompress; also the op that records the bytes each tensor
        put on the wire. ``local``: a local step's gradients, which stay on their rank."""
        sent: list[tf.Tensor] = [tf.constant(-1, tf.int64)] * len(self.bound.names)
        reduced: list[Any] = list(grads)
        communicating = communicates(self.arguments.process_set) and not local
        dense: list[tuple[int, tf.Tensor, Compressor]] = []
        for index, (grad, position) in enumerate(zip(grads, positions)):
            if grad is None:
                continue
            name = self.bound.names[position]
            compressor = self.bound.compressors.get(name, self.arguments.compression)
            if isinstance(grad, tf.IndexedSlices):
                if not self.arguments.sparse_as_dense:
                    if communicating:
                        reduced[index], sent[position] = self._allgather_sparse(grad)
                    continue
                grad = tf.convert_to_tensor(grad)
            if not communicating:  # as Horovod: the local gradient (pruned here: zero where masked)
                pruned = isinstance(compressor, PacTrainCompressor)
                reduced[index] = tf.where(compressor.mask, grad, tf.zeros_like(grad)) if pruned else grad
                continue
            self.bound.dense_bytes[position] = self.bound.pruner.variables[name].shape.num_elements() * grad.dtype.size
            dense.append((index, grad, compressor))
        plain, by_plan = [], []
        own_wire = ENCODINGS[self.arguments.packed_values].own_wire
        for item in dense:
            (by_plan if own_wire and isinstance(item[2], PacTrainCompressor) else plain).append(item)
        with tf.device(self.arguments.device_dense):
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
        return reduced, self.bound.sent_bytes.assign(tf.stack(sent))

    def _reduce_by_plan(self, items: list[tuple[int, tf.Tensor, PacTrainCompressor]]) -> list[_Reduced]:
        """``packed_values`` fp16 or ternary: a pruned tensor's packed values travel another way than its dense
        ones, and its plan is known only when the step runs, so each takes a ``tf.cond`` on its plan
        (every rank the same branch: the plans agree). Returns (reduced gradient, bytes sent) each."""
        results = []
        for position, grad, compressor in items:
            if self.bound.quantized is not None:
                packed = functools.partial(self.bound.quantized.allreduce, self.bound.names[position], compressor, grad,
                                           self.arguments.op == hvd.Average, grad.dtype,
                                           self._wire_name("ternary", position), self.maintenance.step)
            else:
                packed = functools.partial(self._reduce_packed, position, grad, compressor)
            plain = functools.partial(self._reduce_plain, position, grad, compressor)
            results.append(tf.cond(tf.equal(compressor.plan, PACKED), packed, plain))
        return results

    def _reduce_packed(self, position: int, grad: tf.Tensor, compressor: PacTrainCompressor) -> _Reduced:
        """Surviving values as ``_packed_compression`` says (fp16)."""
        wire, ctx = self.arguments.packed_compression.compress(compressor.survivors(grad))
        output = hvd.allreduce(wire, name=self._wire_name("packed", position), **self._reduce_arguments())
        values = self.arguments.packed_compression.decompress(output, ctx)
        return compressor.unpack(values), tf.size(wire, tf.int64) * wire.dtype.size

    def _reduce_plain(self, position: int, grad: tf.Tensor, compressor: PacTrainCompressor) -> _Reduced:
        """As ``compression`` says, whatever the plan (here: not packed)."""
        wire, ctx = compressor.compress(grad)
        output = hvd.allreduce(wire, name=self._wire_name("plain", position), **self._reduce_arguments())
        return compressor.decompress(output, ctx), tf.size(wire, tf.int64) * wire.dtype.size

    def _wire_name(self, kind: str, position: int) -> str:
        """A Horovod name per tensor: ops in ``tf.cond`` branches are not uniquified by TF as ops of one graph are."""
        return f"pactrain_{kind}_" + safe_name(self.bound.names[position])

    def _reduce_arguments(self) -> dict[str, Any]:
        return dict(op=self.arguments.op, process_set=self.arguments.process_set,
                    **scale_factors(self.arguments.op == hvd.Average, self.arguments.gradient_predivide_factor))

    def _reduce_wires(self, wires: list[tf.Tensor], positions: list[int]) -> list[tf.Tensor]:
        if not wires:
            return wires
        common = self._reduce_arguments()
        if self.arguments.groups is None:
            return [hvd.allreduce(wire, **common) for wire in wires]
        outputs: list[Any] = [None] * len(wires)
        for members in self._group(positions):
            grouped = hvd.grouped_allreduce([wires[i] for i in members], **common)
            for i, output in zip(members, grouped):
                outputs[i] = output
        return outputs

    def _group(self, positions: list[int]) -> list[list[int]]:
        """Split wire indices into Horovod groups: ``groups`` chunks, or by the given variable lists."""
        if isinstance(self.arguments.groups, int):
            return [members for members in split_list(list(range(len(positions))), self.arguments.groups) if members]
        group_of = {}
        for number, group in enumerate(self.arguments.groups):
            for variable in group:
                group_of[self.bound.positions.get(backing_variable(variable).ref())] = number
        grouped: dict[Any, list[int]] = {}
        for i, position in enumerate(positions):
            grouped.setdefault(group_of.get(position, ("alone", i)), []).append(i)
        return list(grouped.values())

    def _allgather_sparse(self, grad: tf.IndexedSlices) -> tuple[tf.IndexedSlices, tf.Tensor]:
        """Unpruned sparse gradients travel as Horovod sends them: values and indices allgathered."""
        with tf.device(self.arguments.device_sparse):
            reduced = hvd.allreduce(grad, op=self.arguments.op, compression=self.arguments.compression, process_set=self.arguments.process_set)
        sent = sum(tf.size(part, tf.int64) * part.dtype.size for part in (grad.values, grad.indices))
        return reduced, sent


def scale_gradient(grad: Any, factor: Any) -> Any:
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values * factor, grad.indices, grad.dense_shape)
    return grad * factor
