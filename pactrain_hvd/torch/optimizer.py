"""``DistributedOptimizer``: hvd.DistributedOptimizer with pruning and mask-indexed packing.

It wraps the user's optimizer (composition: no generated subclass) and mirrors Horovod's
own torch optimizer step for step: a hook per parameter starts an asynchronous all-reduce
as soon as its gradient is accumulated, ``synchronize()`` waits, ``step()`` updates. The
only difference is what each all-reduce carries: for a pruned tensor, the surviving values.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from contextlib import contextmanager
from typing import Any

import horovod.torch as hvd
import numpy as np
import torch
from horovod.common.util import split_list
from horovod.torch.compression import Compression, Compressor
from horovod.torch.mpi_ops import allreduce_async_, grouped_allreduce_async_, synchronize

from pactrain_hvd.core import CheckpointError, PacTrainConfig, StepStats, TensorStats, should_pack
from pactrain_hvd.core.config import DEFAULT_VERIFY_EVERY
from pactrain_hvd.torch.compression import PacTrainCompressor
from pactrain_hvd.torch.pruning import Prunable, Pruner, select_prunable

_SUPPORTED_OPS = {hvd.Average: "Average", hvd.Sum: "Sum", hvd.Min: "Min", hvd.Max: "Max"}


def _require_initialized() -> None:
    if not hvd.is_initialized():
        raise RuntimeError("Horovod is not initialized: call hvd.init() before creating pactrain_hvd.torch.DistributedOptimizer")


def _named_parameters(optimizer: torch.optim.Optimizer, named_parameters: Iterable | None) -> dict[str, torch.Tensor]:
    """Validate names exactly as Horovod does, plus: every named parameter is optimized."""
    optimized = [p for group in optimizer.param_groups for p in group["params"]]
    if named_parameters is None:
        return {f"allreduce.noname.{i}.{j}": p for i, g in enumerate(optimizer.param_groups) for j, p in enumerate(g["params"])}
    pairs = list(named_parameters)
    if any(not isinstance(pair, tuple) or len(pair) != 2 for pair in pairs):
        raise ValueError("named_parameters should be a sequence of (name, parameter) tuples, usually model.named_parameters()")
    names = [name for name, _ in pairs]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"parameter names in named_parameters must be unique; duplicates: {', '.join(duplicates)}")
    named_ids = {id(p) for _, p in pairs}
    unnamed = [i for i, p in enumerate(optimized) if id(p) not in named_ids]
    if unnamed:
        raise ValueError(f"named_parameters was given, but optimizer parameters at positions {unnamed} are not named")
    optimized_ids = {id(p) for p in optimized}
    stray = [name for name, p in pairs if id(p) not in optimized_ids]
    if stray:
        raise ValueError(f"named_parameters names parameters the optimizer does not update: {', '.join(stray)}")
    return dict(sorted(pairs, key=lambda pair: pair[0]))


class DistributedOptimizer(torch.optim.Optimizer):
    """Drop-in replacement for ``hvd.DistributedOptimizer`` that prunes and packs.

    Takes every argument of ``hvd.DistributedOptimizer`` with the same defaults, plus:

    - ``sparsity``: final fraction of pruned coordinates in prunable tensors, ``0 <= s < 1``;
      ``0`` behaves exactly like ``hvd.DistributedOptimizer``.
    - ``begin_step``, ``end_step``, ``frequency``: the cubic schedule (masks are recomputed
      at the start of those optimizer steps, frozen after ``end_step``).
    - ``prunable``: predicate ``(name, param) -> bool`` or glob patterns; default: >= 2-D weights.
    - ``ranking``: ``"layer"`` (each tensor to the target) or ``"global"``.
    - ``pack_min_numel``, ``pack_max_density``: the adaptive plan (pack only where it pays).
    - ``verify_every``: also prove masks agree every N steps, before that step's first
      all-reduce (0: only after mask changes).

    Example::

        >>> opt = pt.DistributedOptimizer(opt, named_parameters=model.named_parameters(), sparsity=0.9)
        >>> hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        >>> loss.backward(); opt.step()   # the loop is unchanged
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None,
        compression: type[Compressor] = Compression.none,
        backward_passes_per_step: int = 1,
        op: int = hvd.Average,
        gradient_predivide_factor: float = 1.0,
        groups: int | list[list[torch.Tensor]] | None = None,
        sparse_as_dense: bool = False,
        process_set: hvd.ProcessSet = hvd.global_process_set,
        sparsity: float = 0.9,
        begin_step: int = 0,
        end_step: int = 1000,
        frequency: int = 100,
        prunable: Prunable = None,
        ranking: str = "layer",
        pack_min_numel: int | None = None,
        pack_max_density: float | None = None,
        verify_every: int = DEFAULT_VERIFY_EVERY,
    ) -> None:
        # Everything is validated before the first collective call.
        if not isinstance(optimizer, torch.optim.Optimizer) or isinstance(optimizer, DistributedOptimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer (not already distributed), got {type(optimizer).__name__}")
        plan_overrides = {k: v for k, v in (("pack_min_numel", pack_min_numel), ("pack_max_density", pack_max_density)) if v is not None}
        self.config = PacTrainConfig(
            sparsity=sparsity, begin_step=begin_step, end_step=end_step, frequency=frequency,
            ranking=ranking, verify_every=verify_every, **plan_overrides,
        )
        if isinstance(backward_passes_per_step, bool) or not isinstance(backward_passes_per_step, int) or backward_passes_per_step <= 0:
            raise ValueError(f"backward_passes_per_step must be an int > 0, got {backward_passes_per_step!r}")
        if op not in _SUPPORTED_OPS:
            raise ValueError(f"op={op!r} is not supported with packing: use hvd.Average, hvd.Sum, hvd.Min or hvd.Max (Adasum is not)")
        if gradient_predivide_factor != 1.0 and op != hvd.Average:
            raise ValueError("gradient_predivide_factor not supported with op != Average")
        if groups is not None and not (isinstance(groups, list) or (isinstance(groups, int) and groups > 0)):
            raise ValueError("groups should be a positive integer or a list of lists of torch.Tensor")
        _require_initialized()
        self._optimizer = optimizer
        self._parameters = _named_parameters(optimizer, named_parameters)
        self._names = {p: name for name, p in self._parameters.items()}
        self._compression = compression
        self.backward_passes_per_step = backward_passes_per_step
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self.process_set = process_set
        self._pruner = Pruner(self._parameters, select_prunable(self._parameters, prunable),
                              self.config.schedule, self.config.ranking, process_set)
        self._step = 0
        self._verify_pending = False
        self._stats = StepStats()
        self._compressors: dict[torch.Tensor, PacTrainCompressor] = {}
        self._rebuild_plan()

        self._handles: dict[Any, tuple[Any, Any]] = {}
        self._delay = {p: backward_passes_per_step for p in self._parameters.values()}
        self._requires_update: set[torch.Tensor] = set()
        self._synchronized = False
        self._should_synchronize = True
        self._groups = self._form_groups(groups) if groups is not None else None
        self._group_counts = {group: 0 for group in set((self._groups or {}).values())}
        self._hook_handles = []
        if process_set.included():
            for p in self._parameters.values():
                if p.requires_grad:
                    self._requires_update.add(p)
                    self._hook_handles.append(p.register_post_accumulate_grad_hook(self._on_gradient_ready))

    # -- what a torch.optim.Optimizer exposes, shared with the wrapped optimizer ----------------
    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self._optimizer

    @property
    def param_groups(self) -> list[dict]:
        return self._optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value: list[dict]) -> None:
        self._optimizer.param_groups = value

    @property
    def state(self) -> dict:
        return self._optimizer.state

    @state.setter
    def state(self, value: dict) -> None:
        self._optimizer.state = value

    @property
    def defaults(self) -> dict:
        return self._optimizer.defaults

    @defaults.setter
    def defaults(self, value: dict) -> None:
        self._optimizer.defaults = value

    def add_param_group(self, param_group: dict) -> None:
        raise NotImplementedError("add parameter groups to the optimizer before wrapping it in DistributedOptimizer")

    def __repr__(self) -> str:
        return f"pactrain_hvd.torch.DistributedOptimizer(sparsity={self.config.sparsity}, optimizer={self._optimizer!r})"

    def __getstate__(self) -> dict:
        raise TypeError("DistributedOptimizer holds live Horovod handles: pickle its state_dict() instead")

    # -- PacTrain state ----------------------------------------------------------------------
    @property
    def step_count(self) -> int:
        """Optimizer steps taken: the schedule position."""
        return self._step

    def masks(self) -> dict[str, torch.Tensor]:
        """``{parameter name: bool mask}`` for every pruned parameter (copies)."""
        return {name: mask.clone() for name, mask in self._pruner.masks.items()}

    def stats(self) -> dict:
        """The last step's wire bytes (sent and dense-equivalent), per-tensor density and plan."""
        return dict(self._stats.as_dict(), sparsity=self._pruner.sparsity())

    def set_masks(self, masks: dict[str, Any]) -> None:
        """Replace the masks (bool tensors or arrays by parameter name); local, no communication.

        Ranks are proven to agree before the next gradient is communicated.
        """
        self._install_masks(self._pruner.validate(_host_masks(masks)))

    def _install_masks(self, masks: dict[str, np.ndarray]) -> None:
        self._pruner.install(masks)
        self._after_mask_change()
        self._verify_pending = True

    def _after_mask_change(self) -> None:
        self._pruner.clear_optimizer_state(self._optimizer.state)
        self._rebuild_plan()

    def _verify_if_pending(self) -> None:
        if self._verify_pending:
            self._pruner.verify()
            self._verify_pending = False

    def _rebuild_plan(self) -> None:
        """Per tensor: packed, dense-masked or untouched. Same masks, so same plan on every rank."""
        cfg = self.config
        self._compressors = {}
        for name, p in self._parameters.items():
            mask = self._pruner.masks.get(name)
            packed = mask is not None and should_pack(p.numel(), int(mask.sum()), cfg.pack_min_numel, cfg.pack_max_density)
            self._compressors[p] = PacTrainCompressor(mask, self._compression, packed=packed)

    def _record(self, p: torch.Tensor, wire: torch.Tensor) -> None:
        compressor = self._compressors[p]
        numel = p.numel()
        self._stats.tensors[self._names[p]] = TensorStats(
            numel=numel,
            kept=numel if compressor.kept is None else compressor.kept,
            packed=compressor.packed,
            sent_bytes=wire.numel() * wire.element_size(),
            dense_bytes=numel * p.element_size(),
        )

    # -- communication, mirroring horovod/torch/optimizer.py ---------------------------------
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

    def _compress(self, p: torch.Tensor) -> tuple[torch.Tensor, Any]:
        self._verify_if_pending()
        if p.grad is None:
            # Another rank may have a gradient for it (dynamic graphs): send zeros, as Horovod does.
            p.grad = torch.zeros_like(p)
        grad = p.grad
        if grad.is_sparse:
            if not self.sparse_as_dense:
                raise ValueError(f"parameter {self._names[p]!r} has a sparse gradient: pass sparse_as_dense=True "
                                 "(packing needs dense gradients)")
            grad = grad.to_dense()
            p.grad = grad
        wire, ctx = self._compressors[p].compress(grad)
        self._record(p, wire)
        return wire, ctx

    def _allreduce_grad_async(self, p: torch.Tensor) -> tuple[Any, Any]:
        wire, ctx = self._compress(p)
        if self.op == hvd.Average:
            # Split the average like Horovod: the C++ side applies the extra 1/size.
            prescale, postscale = 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
        else:
            prescale = postscale = 1.0
        handle = allreduce_async_(wire, name=self._names[p], op=self.op, prescale_factor=prescale,
                                  postscale_factor=postscale, process_set=self.process_set)
        return handle, ctx

    def _grouped_allreduce_grad_async(self, group: tuple) -> tuple[Any, Any]:
        wires, ctxs = zip(*[self._compress(p) for p in group])
        handle = grouped_allreduce_async_(list(wires), name=self._names[group[0]], op=self.op, process_set=self.process_set)
        return handle, ctxs

    def _on_gradient_ready(self, p: torch.Tensor) -> None:
        if p in self._handles and self._handles[p][0] is not None and self._delay[p] <= 0:
            raise AssertionError("Gradients were computed more than backward_passes_per_step times before call to step(). "
                                 "Increase backward_passes_per_step to accumulate gradients locally.")
        self._delay[p] -= 1
        handle, ctx = None, None
        if self._delay[p] == 0:
            if self._groups is not None:
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
        if not self.process_set.included():
            self._synchronized = True
            return
        started: set[torch.Tensor] = set()
        for key in self._handles:
            started.update(key) if isinstance(key, tuple) else started.add(key)
        for p in self._requires_update - started:
            self._handles[p] = self._allreduce_grad_async(p)
        for p, (handle, _) in list(self._handles.items()):
            if handle is None:
                self._handles[p] = self._allreduce_grad_async(p)
        for key, (handle, ctx) in self._handles.items():
            if isinstance(key, tuple):
                for p, output, p_ctx in zip(key, synchronize(handle), ctx):
                    self._delay[p] = self.backward_passes_per_step
                    p.grad.set_(self._compressors[p].decompress(output, p_ctx))
                self._group_counts[key] = 0
            else:
                output = synchronize(handle)
                self._delay[key] = self.backward_passes_per_step
                if self._groups is not None:
                    self._group_counts[self._groups[key]] = 0
                key.grad.set_(self._compressors[key].decompress(output, ctx))
        self._handles.clear()
        self._stats.step = self._step
        self._synchronized = True

    @contextmanager
    def skip_synchronize(self):
        """``opt.synchronize(); with opt.skip_synchronize(): opt.step()`` (e.g. for gradient clipping)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() context after "
                              "optimizer.synchronize(). This can cause training slowdown.", stacklevel=2)
            self.synchronize()
        self._synchronized = False
        if self.config.schedule.is_update_step(self._step):
            self._pruner.update(self._step)
            self._after_mask_change()
            self._pruner.mask_gradients()  # this step's gradients were reduced under the old mask
        self._verify_if_pending()
        loss = self._optimizer.step(closure)
        self._pruner.apply_to_weights()
        self._step += 1
        if self.config.verify_every and self._step % self.config.verify_every == 0:
            self._verify_pending = True  # checked before the next step's first all-reduce
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._handles:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but before optimizer.step() "
                                 "or optimizer.synchronize(). This is prohibited as it can cause a race condition.")
        self._optimizer.zero_grad(set_to_none=set_to_none)

    def set_backward_passes_per_step(self, passes: int) -> None:
        self.backward_passes_per_step = passes
        for p in self._delay:
            self._delay[p] = passes

    # -- checkpoints ----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The wrapped optimizer's state dict plus ``"pactrain"``: schedule position and masks."""
        state = self._optimizer.state_dict()
        state["pactrain"] = {
            "step": self._step,
            "sparsity": self.config.sparsity,
            "masks": {name: mask.cpu().clone() for name, mask in self._pruner.masks.items()},
        }
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore optimizer state, masks and schedule position; validated before anything changes.

        Local (no communication), so it may run on one rank: then call ``broadcast_masks``.
        """
        state_dict = dict(state_dict)
        pactrain = state_dict.pop("pactrain", None)
        masks = None
        if pactrain is not None:
            if not isinstance(pactrain, dict) or not {"step", "masks"} <= set(pactrain):
                raise CheckpointError("the 'pactrain' entry of the optimizer state dict needs 'step' and 'masks'")
            try:
                masks = self._pruner.validate(_host_masks(pactrain["masks"]))
            except (TypeError, ValueError) as error:
                raise CheckpointError(f"checkpoint does not fit this model: {error}") from error
        self._handles = {}
        self._synchronized = False
        self._should_synchronize = True
        self.set_backward_passes_per_step(self.backward_passes_per_step)
        self._optimizer.load_state_dict(state_dict)
        if masks is not None:
            self._step = int(pactrain["step"])
            self._install_masks(masks)


def _host_masks(masks: dict[str, Any]) -> dict[str, np.ndarray]:
    return {name: torch.as_tensor(mask).cpu().numpy() for name, mask in masks.items()}


def broadcast_masks(optimizer: DistributedOptimizer, root_rank: int = 0) -> None:
    """Give every rank ``root_rank``'s masks and schedule position (start and resume).

    Use next to ``hvd.broadcast_parameters`` and ``hvd.broadcast_optimizer_state``.
    """
    if not isinstance(optimizer, DistributedOptimizer):
        raise TypeError(f"broadcast_masks needs a pactrain_hvd.torch.DistributedOptimizer, got {type(optimizer).__name__}")
    pruner, process_set = optimizer._pruner, optimizer.process_set
    header = hvd.broadcast_object({"step": optimizer._step, "masked": sorted(pruner.masks)}, root_rank,
                                  name="pactrain.masks_header", process_set=process_set)
    masks = {}
    for name in header["masked"]:
        param = pruner.parameters[name]
        local = pruner.masks.get(name)
        flags = (local if local is not None else torch.ones_like(param, dtype=torch.bool)).to(torch.uint8)
        flags = hvd.broadcast(flags.cpu(), root_rank, name=f"pactrain.mask.{name}", process_set=process_set)
        masks[name] = flags.numpy().astype(np.bool_)
    optimizer._step = int(header["step"])
    optimizer._install_masks(masks)
    optimizer._verify_if_pending()
