"""Horovod's torch gradient engine, mirrored from ``horovod/torch/optimizer.py`` (``_DistributedOptimizer``).

A hook per parameter starts its all-reduce once its gradient has accumulated
``backward_passes_per_step`` times; a group's members start together; ``synchronize()`` starts what
backward did not reach (in name order, the same on every rank), waits, and writes the reduced
gradients back. It reads against upstream method by method; what each all-reduce carries is the
plan's codec (``PacTrainState.compressor``: packed, dense-masked or as Horovod sends it; ternary
through ``QuantizedReduction``), in the methods that upstream calls the same. Two differences from
upstream, both on purpose: a grouped all-reduce honours ``gradient_predivide_factor`` (Horovod's drops
it), and wrapping a parameter again hands its hook over (Horovod's leaves both wrappers all-reducing).
"""

from __future__ import annotations

import warnings
import weakref
from contextlib import contextmanager
from typing import Any

import horovod.torch as hvd
import torch
from horovod.common.util import split_list
from horovod.torch.mpi_ops import allreduce_async_, grouped_allreduce_async_, sparse_allreduce_async, synchronize
from torch.utils.weak import WeakTensorKeyDictionary

from pactrain_hvd.core.config import scale_factors
from pactrain_hvd.core.lanes import SCALE_BYTES
from pactrain_hvd.torch.quantized import QuantizedSend
from pactrain_hvd.torch.state import PacTrainState

# Which engine's hooks a parameter carries.
_HOOK_OWNERS = WeakTensorKeyDictionary()


class HorovodEngine:
    """The hook / delay / group machinery. Before ``_start_engine`` the subclass sets ``op``, ``process_set``,
    ``backward_passes_per_step``, ``gradient_predivide_factor`` and ``sparse_as_dense``."""

    def _start_engine(self, state: PacTrainState, groups: int | list[list[torch.Tensor]] | None) -> None:
        self._pactrain = state
        self._parameters = state.parameters  # name -> parameter, in name order
        self._names = state.names
        self._communicating = state.communicating and not state.cycle.local  # local steps: gradients stay
        self._warned_sparse: set[torch.Tensor] = set()
        self._handles: dict[Any, tuple[Any, Any]] = {}
        self._delay = {p: self.backward_passes_per_step for p in self._parameters.values()}
        self._requires_update: set[torch.Tensor] = set()
        self._synchronized = False
        self._should_synchronize = True
        self._groups = self._form_groups(groups) if groups is not None else None
        self._group_counts = {group: 0 for group in set((self._groups or {}).values())}
        self._hook_handles = []
        self._detached = False
        if self._communicating:
            for p in self._parameters.values():
                if p.requires_grad:
                    self._requires_update.add(p)
                    self._hook_handles.append(p.register_post_accumulate_grad_hook(self._on_gradient_ready))
                    self._take_over(p)

    # -- what each all-reduce carries: the plan's codec, per tensor ------------------------------
    def _local_grad(self, p: torch.Tensor) -> torch.Tensor:
        """``p``'s dense local gradient, once masks are proven to agree (a Mask Tracker check, when due, is
        the step's first communication; a schedule that prunes at step 0 ranks its masks just before it)."""
        self._pactrain.before_communication()
        if p.grad is None:
            # Another rank may have a gradient for it (dynamic graphs): send zeros, as Horovod does.
            p.grad = torch.zeros_like(p)
        grad = p.grad
        if grad.is_sparse:
            if self.sparse_as_dense:
                return grad.to_dense()  # p.grad becomes sparse again after the reduction, as in Horovod
            if p not in self._warned_sparse:
                self._warned_sparse.add(p)
                reason = "it is pruned" if self._pactrain.compressor(p).mask is not None else "it is in a group"
                warnings.warn(f"parameter {self._names[p]!r} has a sparse gradient and {reason}: it travels dense "
                              "(pass sparse_as_dense=True to silence this)", stacklevel=2)
            grad = grad.to_dense()
            p.grad = grad
        return grad

    def _compress(self, p: torch.Tensor, tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        wire, ctx = self._pactrain.compressor(p).compress(tensor)
        self._pactrain.record(p, wire.numel() * wire.element_size())
        return wire, ctx

    def _allreduce_grad_async(self, p: torch.Tensor) -> tuple[Any, Any]:
        self._pactrain.before_communication()  # may rank step 0's masks: the plan is read after it
        compressor = self._pactrain.compressor(p)
        if p.grad is not None and p.grad.is_sparse and not self.sparse_as_dense and compressor.mask is None:
            return self._sparse_allreduce_grad_async(p)
        return self._start(p, self._local_grad(p), self.op, **self._scale_factors())

    def _start(self, p: torch.Tensor, tensor: torch.Tensor, op: int, **factors: float) -> tuple[Any, Any]:
        """Launch the all-reduce of ``tensor`` (``p``'s gradient or outer gradient) through ``p``'s codec."""
        state = self._pactrain
        compressor = state.compressor(p)
        if compressor.lanes is not None:  # quantized codes (see ``QuantizedReduction``): no blocking collective
            state.follow_world_size()
            ternary = state.quantized
            send = ternary.start(self._names[p], tensor, compressor, average=op == hvd.Average, step=state.step_count)
            state.record(p, 4 * ternary.layout.words(send.values.numel()) + SCALE_BYTES)  # int32 words + the MAX
            return send, None
        wire, ctx = self._compress(p, tensor)
        return allreduce_async_(wire, name=self._names[p], op=op, process_set=self.process_set, **factors), ctx

    def _outer_sync(self) -> None:
        """Local steps' sync (``core.local_steps``): the ranks' outer gradients averaged through each tensor's
        codec, then the outer step; every rank continues from the new anchor."""
        state = self._pactrain
        gradients = state.outer.outer_gradients()
        if state.communicating:
            sends = {name: self._start(self._parameters[name], gradient, hvd.Average)
                     for name, gradient in gradients.items()}  # in name order, the same on every rank
            gradients = {name: self._finish(self._parameters[name], *send) for name, send in sends.items()}
        state.outer.step(gradients)
        state.synced()

    def _sparse_allreduce_grad_async(self, p: torch.Tensor) -> tuple[Any, None]:
        """An unpruned sparse gradient travels as Horovod sends it: indices and values allgathered."""
        self._pactrain.before_communication()
        grad = p.grad
        self._pactrain.record(p, sum(t.numel() * t.element_size() for t in (grad._indices(), grad._values())))
        return sparse_allreduce_async(grad, name=self._names[p], op=self.op, process_set=self.process_set), None

    def _finish(self, p: torch.Tensor, handle: Any, ctx: Any) -> torch.Tensor:
        if isinstance(handle, QuantizedSend):
            return self._pactrain.quantized.finish(handle)
        if callable(handle):  # a sparse allgather
            return handle()
        return self._decompress(p, synchronize(handle), ctx)

    def _decompress(self, p: torch.Tensor, output: torch.Tensor, ctx: Any) -> torch.Tensor:
        return self._pactrain.compressor(p).decompress(output, ctx)

    def _travels_alone(self, p: torch.Tensor) -> bool:
        """Whether ``p`` leaves its group: ternary codes travel at their tensor's own scale."""
        return self._pactrain.compressor(p).lanes is not None

    def _scale_factors(self) -> dict[str, float]:
        return scale_factors(self.op == hvd.Average, self.gradient_predivide_factor)

    # -- hooks ----------------------------------------------------------------------------------
    def _take_over(self, p: torch.Tensor) -> None:
        owner = _HOOK_OWNERS.get(p)
        previous = owner() if owner is not None else None
        if previous is not None and previous is not self and not previous._detached:
            warnings.warn(f"parameter {self._names[p]!r} was wrapped by another pt.DistributedOptimizer: that one's "
                          "gradient hooks are removed and it can no longer step", stacklevel=4)
            previous._detach()
        _HOOK_OWNERS[p] = weakref.ref(self)

    def _detach(self) -> None:
        for handle in self._hook_handles:
            handle.remove()
        self._hook_handles = []
        self._detached = True

    def _check_attached(self) -> None:
        if self._detached:
            raise RuntimeError("this pt.DistributedOptimizer was replaced: another one wraps its parameters now")

    def _form_groups(self, groups: int | list[list[torch.Tensor]]) -> dict[torch.Tensor, tuple]:
        params = [p for p in self._parameters.values() if p.requires_grad]  # sorted by name on every rank
        if isinstance(groups, list):
            seen: set[int] = set()
            formed = []
            for group in groups:
                for p in group:
                    if not isinstance(p, torch.Tensor):
                        raise ValueError("groups must consist of torch.Tensor")
                    if id(p) in seen:
                        raise ValueError("a parameter can only appear once in groups")
                    seen.add(id(p))
                formed.append([p for p in params if any(p is q for q in group)])
            formed += [[p] for p in params if id(p) not in seen]
        else:
            formed = split_list(params, groups)
        return {p: tuple(group) for group in formed if group for p in group}

    def _grouped_allreduce_grad_async(self, group: tuple) -> tuple[Any, Any]:
        self._pactrain.before_communication()
        wires, ctxs = zip(*[self._compress(p, self._local_grad(p)) for p in group])
        handle = grouped_allreduce_async_(list(wires), name=self._names[group[0]], op=self.op, process_set=self.process_set,
                                          **self._scale_factors())
        return handle, ctxs

    def _on_gradient_ready(self, p: torch.Tensor) -> None:
        if p in self._handles and self._handles[p][0] is not None and self._delay[p] <= 0:
            raise AssertionError("Gradients were computed more than backward_passes_per_step times before call to step(). "
                                 "Increase backward_passes_per_step to accumulate gradients locally.")
        self._delay[p] -= 1
        handle, ctx = None, None
        if self._delay[p] == 0:
            self._pactrain.before_communication()  # before the plan decides how p travels
            if self._groups is not None and not self._travels_alone(p):
                group = self._groups[p]
                self._group_counts[group] += 1
                if self._group_counts[group] == len(group):
                    self._handles[group] = self._grouped_allreduce_grad_async(group)
                    for member in group:
                        self._handles.pop(member, None)
                    self._group_counts[group] = 0
                    return
            else:
                handle, ctx = self._allreduce_grad_async(p)
        self._handles[p] = (handle, ctx)

    def synchronize(self) -> None:
        """Wait for every gradient all-reduce and write the reduced gradients back."""
        self._check_attached()
        if not self._communicating:
            self._synchronized = True
            return
        started: set[torch.Tensor] = set()
        for key in self._handles:
            started.update(key) if isinstance(key, tuple) else started.add(key)
        missing = self._requires_update - started
        for p in [p for p in self._parameters.values() if p in missing]:  # in name order, the same on every rank
            self._handles[p] = self._allreduce_grad_async(p)
        for p, (handle, _) in list(self._handles.items()):
            if handle is None:
                self._handles[p] = self._allreduce_grad_async(p)
        for key, (handle, ctx) in self._handles.items():
            if isinstance(key, tuple):
                for p, output, p_ctx in zip(key, synchronize(handle), ctx):
                    self._delay[p] = self.backward_passes_per_step
                    self._write_back(p, self._decompress(p, output, p_ctx))
                self._group_counts[key] = 0
            else:
                self._delay[key] = self.backward_passes_per_step
                if self._groups is not None:
                    self._group_counts[self._groups[key]] = 0
                self._write_back(key, self._finish(key, handle, ctx))
        self._handles.clear()
        self._synchronized = True
        self._pactrain.reduced()

    @staticmethod
    def _write_back(p: torch.Tensor, reduced: torch.Tensor) -> None:
        if p.grad.is_sparse:  # sparse gradients do not support set_; sparse_as_dense made them dense on the wire
            p.grad.zero_().add_(reduced if reduced.is_sparse else reduced.to_sparse())
        else:
            p.grad.set_(reduced)

    @contextmanager
    def skip_synchronize(self):
        """``opt.synchronize(); with opt.skip_synchronize(): opt.step()`` (e.g. for gradient clipping)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def _check_nothing_in_flight(self) -> None:
        if self._handles:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but before optimizer.step() "
                                 "or optimizer.synchronize(). This is prohibited as it can cause a race condition.")

    def set_backward_passes_per_step(self, passes: int) -> None:
        self.backward_passes_per_step = passes
        for p in self._delay:
            self._delay[p] = passes

    def _reset_engine(self) -> None:
        """Nothing in flight, nothing accumulated (a state dict is being loaded)."""
        self._handles = {}
        self._synchronized = False
        self._should_synchronize = True
        self._pactrain.discard_step()
        self.set_backward_passes_per_step(self.backward_passes_per_step)
