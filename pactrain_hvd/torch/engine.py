"""Horovod's torch gradient engine, mirrored from ``horovod/torch/optimizer.py`` (``_DistributedOptimizer``).

A hook per parameter starts its all-reduce once its gradient has accumulated
``backward_passes_per_step`` times; a group's members start together; ``synchronize()`` starts what
backward did not reach (in name order, the same on every rank), waits, and writes the reduced
gradients back. Kept apart so that it reads against upstream line by line: what each all-reduce
carries is the subclass's codec (``_allreduce_grad_async``, ``_compress``, ``_finish``,
``_decompress``, ``_travels_alone``). Two differences from upstream, both on purpose: a grouped
all-reduce honours ``gradient_predivide_factor`` (Horovod's drops it), and wrapping a parameter again
hands its hook over (Horovod's leaves both wrappers all-reducing).
"""

from __future__ import annotations

import warnings
import weakref
from contextlib import contextmanager
from typing import Any

import torch
from horovod.common.util import split_list
from horovod.torch.mpi_ops import grouped_allreduce_async_, synchronize
from torch.utils.weak import WeakTensorKeyDictionary

# Which engine's hooks a parameter carries.
_HOOK_OWNERS = WeakTensorKeyDictionary()


class HorovodEngine:
    """The hook / delay / group machinery. Before ``_start_engine`` the subclass sets ``_parameters``
    (name -> parameter, in name order), ``_names``, ``op``, ``process_set``, ``backward_passes_per_step``
    and ``_communicating`` (Horovod's rule: in the process set, with someone to talk to)."""

    def _start_engine(self, groups: int | list[list[torch.Tensor]] | None) -> None:
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

    # -- what the subclass's codec provides -------------------------------------------------------
    def _allreduce_grad_async(self, p: torch.Tensor) -> tuple[Any, Any]:
        raise NotImplementedError

    def _compress(self, p: torch.Tensor) -> tuple[torch.Tensor, Any]:
        raise NotImplementedError

    def _finish(self, p: torch.Tensor, handle: Any, ctx: Any) -> torch.Tensor:
        raise NotImplementedError

    def _decompress(self, p: torch.Tensor, output: torch.Tensor, ctx: Any) -> torch.Tensor:
        raise NotImplementedError

    def _travels_alone(self, p: torch.Tensor) -> bool:
        """Whether ``p`` leaves its group (its wire cannot be fused with others)."""
        return False

    def _scale_factors(self) -> dict[str, float]:
        raise NotImplementedError

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
        wires, ctxs = zip(*[self._compress(p) for p in group])
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
