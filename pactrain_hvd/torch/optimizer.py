"""``DistributedOptimizer``: hvd.DistributedOptimizer with pruning and mask-indexed packing.

It wraps the user's optimizer (composition: no generated subclass) and runs Horovod's own torch
engine (``engine.py``: a hook per parameter starts an asynchronous all-reduce as soon as its
gradient is accumulated, ``synchronize()`` waits, ``step()`` updates). What differs is what each
all-reduce carries, chosen here per tensor: for a pruned tensor, the surviving values.
"""

from __future__ import annotations

import numbers
import os
import warnings
from collections.abc import Iterable
from typing import Any

import horovod.torch as hvd
import numpy as np
import torch
from horovod.torch.compression import Compression, Compressor
from horovod.torch.mpi_ops import allreduce_async_, sparse_allreduce_async, synchronize

from pactrain_hvd.core import (
    CheckpointError,
    PacTrainConfig,
    StepStats,
    TensorStats,
    check_saved_world_size,
    saved_by_this_rank,
    should_pack,
    while_running,
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
from pactrain_hvd.core.lanes import SCALE_BYTES, ternary_layout
from pactrain_hvd.core.own_masks import schedule_sparsity
from pactrain_hvd.torch.compression import PacTrainCompressor
from pactrain_hvd.torch.engine import HorovodEngine
from pactrain_hvd.torch.own_masks import resolve_masks, sync_prune_buffers, warn_if_torch_pruned
from pactrain_hvd.torch.pruning import Prunable, Pruner, host_masks, select_prunable, zero_stays_zero
from pactrain_hvd.torch.ternary import TernaryReduction, TernarySend

# Horovod's torch all-reduce carries fp16/fp32/fp64 gradients (bf16 travels as fp32, see compression.py);
# complex gradients it rejects mid-step ("Tensor type torch.ComplexFloatTensor is not supported").
_REDUCIBLE_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# PacTrain's entries in a prunable parameter's optimizer state (see DistributedOptimizer.state_dict)
_MASK_KEY, _STEP_KEY, _SCALES_KEY = "pactrain.mask", "pactrain.step", "pactrain.scales"


def _named_parameters(optimizer: torch.optim.Optimizer, named_parameters: Iterable | None) -> dict[str, torch.Tensor]:
    """Validate names exactly as Horovod does; names of parameters the optimizer does not hold are ignored, as
    there (fine-tuning: ``SGD(model.head.parameters())`` with ``model.named_parameters()``)."""
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
    return dict(sorted(((name, p) for name, p in pairs if id(p) in optimized_ids), key=lambda pair: pair[0]))


def _check_dtypes(parameters: dict[str, torch.Tensor]) -> None:
    """Gradients Horovod cannot all-reduce are refused here, not half-way through a backward pass."""
    for name, p in parameters.items():
        if p.requires_grad and p.dtype not in _REDUCIBLE_DTYPES:
            raise TypeError(f"parameter {name!r} has dtype {p.dtype}: Horovod all-reduces float16, bfloat16 (as float32), "
                            "float32 and float64 gradients; convert it or set requires_grad=False")


class DistributedOptimizer(HorovodEngine, torch.optim.Optimizer):
    """Drop-in replacement for ``hvd.DistributedOptimizer`` that prunes and packs.

    Takes every argument of ``hvd.DistributedOptimizer`` with the same defaults, plus:

    - ``sparsity``: final fraction of pruned coordinates in prunable tensors, ``0 <= s < 1``;
      ``0`` behaves exactly like ``hvd.DistributedOptimizer``.
    - ``begin_step``, ``end_step``, ``frequency``: the cubic schedule (masks are recomputed
      at the start of those optimizer steps, frozen after ``end_step``).
    - ``total_steps``: the run's optimizer steps; the schedule steps not given follow it (prune
      from 10 % to 60 % of the run in ten updates). Without it: steps 0 to 1000, every 100.
    - ``prunable``: predicate ``(name, param) -> bool`` or glob patterns; default: >= 2-D weights.
    - ``ranking``: ``"layer"`` (each tensor to the target), ``"erk"`` (Erdős-Rényi-Kernel shares:
      large tensors pruned more) or ``"global"`` (one magnitude threshold).
    - ``pack_min_numel``, ``pack_max_density``: the adaptive plan (pack only where it pays).
    - ``verify_every``: also prove masks agree every N steps, before that step's first
      all-reduce (0: only after mask changes).
    - ``packed_values``: how packed (surviving) values travel; dense and unpruned tensors always
      travel as ``compression`` says. ``"inherit"``: as ``compression`` says (``hvd.Compression.fp16``
      makes them fp16); ``"fp16"``: fp16; ``"ternary"``: shared-scale stochastic ternary with
      error feedback, lane-packed into int32 words (``pactrain_hvd.core.lanes``), fp16 when the
      world is too large for 3 lanes per word (> 256 ranks). Ternary needs ``op`` Average or Sum.
      ``values=`` is its old, deprecated name (``"fp32"`` there is ``"inherit"``).
    - ``masks``: bring your own mask: ``{name: bool mask}``, or the model pruned with
      ``torch.nn.utils.prune`` (its ``<name>_mask`` buffers become the masks of ``<name>_orig``).
      Fixed: the schedule is off unless ``continue_pruning=True`` (see ``core.own_masks``).

    Example::

        >>> opt = pt.DistributedOptimizer(opt, named_parameters=model.named_parameters(), sparsity=0.9,
        ...                               total_steps=epochs * len(train_loader))
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
        num_groups: int = 0,
        groups: int | list[list[torch.Tensor]] | None = None,
        sparse_as_dense: bool = False,
        process_set: hvd.ProcessSet = hvd.global_process_set,
        *,
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
        packed_values: str = "inherit",
        masks: dict[str, Any] | torch.nn.Module | None = None,
        continue_pruning: bool = False,
        values: str | None = None,
    ) -> None:
        # Everything is validated before the first collective call.
        if (not isinstance(optimizer, torch.optim.Optimizer) or isinstance(optimizer, DistributedOptimizer)
                or type(optimizer).__module__ == hvd.DistributedOptimizer.__module__):
            raise TypeError(f"optimizer must be a plain torch.optim.Optimizer, not one already wrapped in a "
                            f"DistributedOptimizer (Horovod's or ours), got {type(optimizer).__name__}")
        if num_groups != 0:
            warnings.warn("num_groups has been replaced by groups (as in Horovod)", DeprecationWarning, stacklevel=2)
            groups = num_groups if groups is None else groups
        parameters = _named_parameters(optimizer, named_parameters)
        self.config = PacTrainConfig.from_arguments(
            sparsity=schedule_sparsity(sparsity, masks is not None, continue_pruning), begin_step=begin_step,
            end_step=end_step, frequency=frequency, total_steps=total_steps, ranking=ranking, verify_every=verify_every,
            pack_min_numel=pack_min_numel, pack_max_density=pack_max_density,
        )
        if isinstance(backward_passes_per_step, bool) or not isinstance(backward_passes_per_step, int) or backward_passes_per_step <= 0:
            raise ValueError(f"backward_passes_per_step must be an int > 0, got {backward_passes_per_step!r}")
        op_name = reduce_op_name(hvd, op, gradient_predivide_factor)
        if groups is not None and not (isinstance(groups, list) or (isinstance(groups, int) and groups > 0)):
            raise ValueError("groups should be a positive integer or a list of lists of torch.Tensor")
        packed_values = packed_values_argument(packed_values, values)
        check_packed_values(packed_values, op_name, groups is not None)
        require_initialized(hvd, "pactrain_hvd.torch.DistributedOptimizer")
        self._optimizer = optimizer
        self._parameters = parameters
        _check_dtypes(self._parameters)
        self._names = {p: name for name, p in self._parameters.items()}
        own_masks, self._prune_buffers = resolve_masks(masks, self._names) if masks is not None else ({}, {})
        if masks is None:
            warn_if_torch_pruned(self._names)
        self._compression = compression
        self.backward_passes_per_step = backward_passes_per_step
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self.process_set = process_set
        prunable_names = sorted(own_masks) if own_masks and prunable is None else select_prunable(self._parameters, prunable)
        self._pruner = Pruner(self._parameters, prunable_names, self.config.schedule, self.config.ranking, process_set)
        self._step = 0
        # Horovod's rule: a rank communicates if it is in the process set and there is someone to talk to.
        self._communicating = process_set.included() and (hvd.size() > 1 or os.environ.get("HOROVOD_ELASTIC") == "1")
        # Masks can differ only where some are pruned; then every rank proves them at its first step (every
        # rank knows that step: a mask set or loaded on one rank alone is caught there, not a hang).
        self._tracking = bool(prunable_names) and (self.config.sparsity > 0 or bool(own_masks))
        self._checks_masks = self._tracking and self._communicating
        self._verify_pending = self._checks_masks
        self._exported: dict | None = None  # the PacTrain state last handed out by state_dict(), see _adopt_exported
        self._zero_stays_zero = zero_stays_zero(optimizer)
        self._weights_unmasked = False  # masks changed without zeroing the weights (adopted mid-backward)
        self._stats = StepStats()
        self.packed_values = packed_values
        layout = ternary_layout(process_set.size()) if packed_values == "ternary" else None
        self._ternary = TernaryReduction(layout, process_set) if layout is not None else None
        self._packed_compression = Compression.fp16 if packed_values in ("fp16", "ternary") else compression
        self._warned_sparse: set[torch.Tensor] = set()
        self._compressors: dict[torch.Tensor, PacTrainCompressor] = {}
        self._rebuild_plan()
        if own_masks:
            self.set_masks(own_masks)  # validated; proven equal on all ranks before the first all-reduce
        self._start_engine(groups)

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

    def register_step_pre_hook(self, hook):
        """Runs before the wrapped optimizer's update, after the gradients are reduced (``hook(inner, args, kwargs)``)."""
        return self._optimizer.register_step_pre_hook(hook)

    def register_step_post_hook(self, hook):
        """Runs after the wrapped optimizer's update, before pruned weights are re-zeroed (``hook(inner, args, kwargs)``)."""
        return self._optimizer.register_step_post_hook(hook)

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
        """The last step's wire bytes (sent and dense-equivalent), bits per packed value, per-tensor density and plan.

        ``values`` says how packed values travelled: ``"ternary"``, or ``"fp16"`` when ternary fell
        back (too many ranks for 3 lanes per word), else as the ``packed_values`` argument.
        """
        encoding = packed_encoding(self.packed_values, self._ternary is not None)
        return dict(self._stats.as_dict(), sparsity=self._pruner.sparsity(), values=encoding)

    def set_masks(self, masks: dict[str, Any]) -> None:
        """Replace the masks (bool tensors or arrays by parameter name); local, no communication.

        Ranks prove they agree at the first step, then every ``verify_every`` steps.
        """
        self._install_masks(self._pruner.validate(host_masks(masks)))

    def _install_masks(self, masks: dict[str, np.ndarray], zero_weights: bool = True) -> None:
        self._exported = None
        self._weights_unmasked |= not zero_weights
        self._pruner.install(masks, zero_weights)
        self._after_mask_change()

    def _after_mask_change(self) -> None:
        self._pruner.clear_optimizer_state(self._optimizer.state)
        sync_prune_buffers(self._prune_buffers, self._pruner.masks)
        self._rebuild_plan()

    def _adopt_and_verify(self) -> None:
        """Before the step's first communication: take state Horovod broadcast into ``state_dict()``'s
        tensors, then run a Mask Tracker check that every rank has due at this step."""
        self._adopt_exported()
        if self._verify_pending:
            self._pruner.verify(self._step)
            self._verify_pending = False

    def _verify_now(self) -> None:
        """After a collective call every rank makes (broadcasts, elastic sync): the check is due everywhere."""
        self._verify_pending = self._checks_masks
        self._adopt_and_verify()

    def _export(self) -> dict:
        """The PacTrain state as tensors for ``state_dict()``: a uint8 mask per prunable tensor (all kept where
        none) and the schedule position. Kept so that what ``hvd.broadcast_optimizer_state`` writes into
        them in place reaches this optimizer (``_adopt_exported``)."""
        names = self._pruner.prunable_names if self._tracking else sorted(self._pruner.masks)
        masks = {name: (self._pruner.masks[name].to(torch.uint8).cpu() if name in self._pruner.masks
                        else torch.ones(self._parameters[name].shape, dtype=torch.uint8)) for name in names}
        self._exported = {"step": torch.tensor([self._step], dtype=torch.int64), "masks": masks}
        if self._ternary is not None:  # and its snapshot: only a change made by a broadcast is adopted
            scales = self._ternary.scale_vector(list(self._parameters))
            self._exported.update(scales=scales, scales_as_exported=scales.clone())
        return self._exported

    def _adopt_exported(self) -> None:
        """Local: if the exported tensors changed (Horovod broadcast another rank's state into them), take it.
        Weights are not touched: they came with ``hvd.broadcast_parameters``, and autograd may be reading them."""
        exported, self._exported = self._exported, None
        if exported is None:
            return
        if "scales" in exported and not torch.equal(exported["scales"].nan_to_num(-1),
                                                    exported["scales_as_exported"].nan_to_num(-1)):
            self._hold_scales(exported["scales"])
        step = int(exported["step"][0])
        masks = host_masks(exported["masks"], flags=True)
        held = {name: mask.cpu().numpy() for name, mask in self._pruner.masks.items()}
        if step == self._step and masks.keys() >= held.keys() and all(
                np.array_equal(mask, held[name]) if name in held else mask.all() for name, mask in masks.items()):
            return
        self._step = step
        self._install_masks(self._pruner.validate(masks), zero_weights=False)

    def _hold_scales(self, vector: torch.Tensor) -> None:
        """Ternary scales by parameter, in name order (the same on every rank); NaN: none held."""
        self._ternary.hold_scales(list(self._parameters), vector,
                                  {name: p.device for name, p in self._parameters.items()})

    def _is_state_initialisation(self) -> bool:
        """``hvd.broadcast_optimizer_state`` on a rank whose optimizer has no state sets every gradient to
        zeros and calls ``step()`` with no backward pass; Horovod makes that step local for its own wrapper
        (other ranks never join it), so ours recognises it."""
        return (not self._optimizer.state and not self._handles and not self._synchronized
                and all(p.grad is not None and not p.grad.is_sparse and not p.grad.any()
                        for group in self.param_groups for p in group["params"] if p.requires_grad))

    @torch.no_grad()
    def _initialise_state(self) -> None:
        """The wrapped optimizer's step on zero gradients, locally: it creates the state (momentum, moments)
        Horovod then overwrites with the root's. Weights are put back (Horovod's own wrapper lets weight decay
        shrink them, on the resuming ranks only); the schedule does not move."""
        parameters = [p for group in self.param_groups for p in group["params"]]
        weights = [p.detach().clone() for p in parameters]
        if isinstance(self._optimizer, torch.optim.SparseAdam):  # Horovod's special case, for its own class
            for p in parameters:
                if p.grad is not None:
                    p.grad = p.grad.to_sparse()
        self._optimizer.step()
        for p, weight in zip(parameters, weights):
            p.copy_(weight)
            if self._tracking:  # an entry for every parameter, so that the masks travel (see state_dict)
                self._optimizer.state[p]  # noqa: B018

    def _rebuild_plan(self) -> None:
        """Per tensor: packed, dense-masked or untouched. Same masks, so same plan on every rank."""
        cfg = self.config
        previous, self._compressors = self._compressors, {}
        for name, p in self._parameters.items():
            mask = self._pruner.masks.get(name)
            packed = mask is not None and should_pack(p.numel(), int(mask.sum()), cfg.pack_min_numel, cfg.pack_max_density)
            lanes = self._ternary.layout if packed and self._ternary is not None else None
            self._compressors[p] = PacTrainCompressor(mask, self._packed_compression if packed else self._compression,
                                                      packed=packed, lanes=lanes)
            if self._ternary is not None and p in previous:
                self._ternary.memory.remap(name, previous[p].surviving_indices,
                                           self._compressors[p].surviving_indices if lanes else None, p.numel())

    def _record(self, p: torch.Tensor, sent_bytes: int) -> None:
        compressor = self._compressors[p]
        numel = p.numel()
        self._stats.tensors[self._names[p]] = TensorStats(
            numel=numel,
            kept=numel if compressor.kept is None else compressor.kept,
            packed=compressor.packed,
            sent_bytes=sent_bytes,
            dense_bytes=numel * p.element_size(),
        )

    # -- the codec HorovodEngine (engine.py) calls: what each all-reduce carries ------------------
    def _compress(self, p: torch.Tensor) -> tuple[torch.Tensor, Any]:
        wire, ctx = self._compressors[p].compress(self._local_grad(p))
        self._record(p, wire.numel() * wire.element_size())
        return wire, ctx

    def _local_grad(self, p: torch.Tensor) -> torch.Tensor:
        """``p``'s dense local gradient, once masks are proven to agree."""
        self._adopt_and_verify()
        if p.grad is None:
            # Another rank may have a gradient for it (dynamic graphs): send zeros, as Horovod does.
            p.grad = torch.zeros_like(p)
        grad = p.grad
        if grad.is_sparse:
            if self.sparse_as_dense:
                return grad.to_dense()  # p.grad becomes sparse again after the reduction, as in Horovod
            if p not in self._warned_sparse:
                self._warned_sparse.add(p)
                reason = "it is pruned" if self._compressors[p].mask is not None else "it is in a group"
                warnings.warn(f"parameter {self._names[p]!r} has a sparse gradient and {reason}: it travels dense "
                              "(pass sparse_as_dense=True to silence this)", stacklevel=2)
            grad = grad.to_dense()
            p.grad = grad
        return grad

    def _follow_world_size(self) -> None:
        """Lane width and the average's divisor follow the world size (Horovod elastic changes it)."""
        size = self.process_set.size()
        if size == self._ternary.layout.world_size:
            return
        layout = ternary_layout(size)
        if layout is None:
            raise RuntimeError(f"packed_values='ternary': the world size changed to {size}, where lanes no longer "
                               "pay; recreate the optimizer with packed_values='fp16'")
        self._ternary.layout = layout
        for compressor in self._compressors.values():
            if compressor.lanes is not None:
                compressor.lanes = layout

    def _ternary_start(self, p: torch.Tensor) -> tuple[TernarySend, None]:
        """Launch ``p``'s ternary all-reduce (see ``TernaryReduction``): from the hook, no blocking collective."""
        self._follow_world_size()
        send = self._ternary.start(self._names[p], self._local_grad(p), self._compressors[p],
                                   average=self.op == hvd.Average)
        self._record(p, 4 * self._ternary.layout.words(send.values.numel()) + SCALE_BYTES)  # int32 words + the MAX
        return send, None

    def _scale_factors(self) -> dict[str, float]:
        return scale_factors(self.op == hvd.Average, self.gradient_predivide_factor)

    def _allreduce_grad_async(self, p: torch.Tensor) -> tuple[Any, Any]:
        if p.grad is not None and p.grad.is_sparse and not self.sparse_as_dense and self._compressors[p].mask is None:
            return self._sparse_allreduce_grad_async(p)
        if self._compressors[p].lanes is not None:
            return self._ternary_start(p)
        wire, ctx = self._compress(p)
        handle = allreduce_async_(wire, name=self._names[p], op=self.op, process_set=self.process_set,
                                  **self._scale_factors())
        return handle, ctx

    def _sparse_allreduce_grad_async(self, p: torch.Tensor) -> tuple[Any, None]:
        """An unpruned sparse gradient travels as Horovod sends it: indices and values allgathered."""
        self._adopt_and_verify()
        grad = p.grad
        self._stats.tensors[self._names[p]] = TensorStats(
            numel=p.numel(), kept=p.numel(), packed=False,
            sent_bytes=sum(t.numel() * t.element_size() for t in (grad._indices(), grad._values())),
            dense_bytes=p.numel() * p.element_size(),
        )
        return sparse_allreduce_async(grad, name=self._names[p], op=self.op, process_set=self.process_set), None

    def _finish(self, p: torch.Tensor, handle: Any, ctx: Any) -> torch.Tensor:
        if isinstance(handle, TernarySend):
            return self._ternary.finish(handle)
        if callable(handle):  # a sparse allgather
            return handle()
        return self._decompress(p, synchronize(handle), ctx)

    def _decompress(self, p: torch.Tensor, output: torch.Tensor, ctx: Any) -> torch.Tensor:
        return self._compressors[p].decompress(output, ctx)

    def _travels_alone(self, p: torch.Tensor) -> bool:
        return self._compressors[p].lanes is not None  # ternary codes, at this tensor's own scale

    def synchronize(self) -> None:
        """Wait for every gradient all-reduce and write the reduced gradients back."""
        super().synchronize()
        if self._communicating:
            self._stats.step = self._step

    def step(self, closure=None):
        self._check_attached()
        if self._is_state_initialisation():
            self._initialise_state()
            return None
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() context after "
                              "optimizer.synchronize(). This can cause training slowdown.", stacklevel=2)
            self.synchronize()
        self._synchronized = False
        if self._ternary is not None:
            self._ternary.memory.commit()  # this step is taken (a loss scaler that skips it never calls step)
        self._adopt_and_verify()
        remask = not self._zero_stays_zero or self._weights_unmasked or (
            self.config.verify_every and self._step % self.config.verify_every == 0)
        if self.config.schedule.is_update_step(self._step):
            self._pruner.update(self._step, verify=self._communicating)
            self._after_mask_change()
            self._pruner.mask_gradients()  # this step's gradients were reduced under the old mask
        elif not self._communicating:
            self._pruner.mask_gradients()  # nothing packed them: pruned weights still get no update
        loss = self._optimizer.step(closure)
        if remask:  # (a mask change zeroed the weights itself)
            self._pruner.apply_to_weights()
            self._weights_unmasked = False
        self._step += 1
        if self._checks_masks and self.config.verify_every and self._step % self.config.verify_every == 0:
            self._verify_pending = True  # checked before the next step's first all-reduce
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._check_nothing_in_flight()
        self._optimizer.zero_grad(set_to_none=set_to_none)

    # -- checkpoints ----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The wrapped optimizer's state dict plus ``"pactrain"``: schedule position and masks, and
        with ``packed_values="ternary"`` this rank's error memory and rounding noise (``"ternary"``) and the
        held scales, the same on every rank (``"ternary_scales"``, also ``"pactrain.scales"`` in the first
        parameter's entry, so that Horovod's broadcast carries them).

        Where the wrapped optimizer has state, each prunable parameter's entry also holds its mask
        (``"pactrain.mask"``, the same uint8 tensor as in ``["pactrain"]["masks"]``: Horovod broadcasts no
        bool tensors, and a checkpoint stores it once) and the first parameter's the schedule position
        (``"pactrain.step"``): ``hvd.broadcast_optimizer_state`` broadcasts them with the rest, so
        Horovod's own resume idiom carries masks and schedule position. Where nothing is pruned
        (``sparsity=0``, no ``masks=``), ``"state"`` is the wrapped optimizer's, exactly as with Horovod.
        """
        state = self._optimizer.state_dict()
        exported = self._export()
        state["pactrain"] = {
            "step": self._step,
            "sparsity": self.config.sparsity,
            "world_size": while_running(self.process_set.size),
            "masks": exported["masks"],
        }
        if self._tracking and state["state"]:  # Horovod initialises an empty state first; then the keys match
            index = {id(p): i for i, p in enumerate(p for group in self.param_groups for p in group["params"])}
            additions = {0: {_STEP_KEY: exported["step"]}}
            if "scales" in exported:
                additions[0][_SCALES_KEY] = exported["scales"]
            for name, flags in exported["masks"].items():
                additions.setdefault(index[id(self._parameters[name])], {})[_MASK_KEY] = flags
            for pid, entries in additions.items():  # new dicts: the wrapped optimizer's own stay as they are
                state["state"][pid] = {**state["state"].get(pid, {}), **entries}
        if self._ternary is not None:
            state["pactrain"]["ternary"] = self._ternary.state_dict()
            state["pactrain"]["ternary_scales"] = exported["scales"]
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore optimizer state, masks and schedule position; validated before anything changes.

        Local (no communication), so it may run on one rank: then call ``broadcast_masks``.
        Ternary error memory and noise are per rank: they are restored only on the rank that
        saved them (for an exact resume every rank saves and loads its own checkpoint).
        """
        state_dict = dict(state_dict)
        pactrain = state_dict.pop("pactrain", None)
        if isinstance(state_dict.get("state"), dict):
            state_dict["state"] = {pid: {k: v for k, v in entry.items() if k not in (_MASK_KEY, _STEP_KEY, _SCALES_KEY)}
                                   if isinstance(entry, dict) else entry for pid, entry in state_dict["state"].items()}
        masks = None
        if pactrain is not None:
            if not isinstance(pactrain, dict) or not {"step", "masks"} <= set(pactrain):
                raise CheckpointError("the 'pactrain' entry of the optimizer state dict needs 'step' and 'masks'")
            step = pactrain["step"]
            if isinstance(step, bool) or not isinstance(step, numbers.Integral) or step < 0:
                raise CheckpointError(f"checkpoint 'pactrain' step must be an int >= 0, got {step!r}")
            try:
                masks = self._pruner.validate(host_masks(pactrain["masks"], flags=True))
            except (TypeError, ValueError) as error:
                raise CheckpointError(f"checkpoint does not fit this model: {error}") from error
            current = while_running(self.process_set.size)
            if current is not None:
                check_saved_world_size(pactrain.get("world_size"), current)
            ternary = self._saved_ternary(pactrain.get("ternary"), masks)
            scales = pactrain.get("ternary_scales") if self._ternary is not None else None
            if scales is not None and (not isinstance(scales, torch.Tensor) or scales.shape != (len(self._parameters),)):
                raise CheckpointError(f"checkpoint 'ternary_scales' must be a tensor of {len(self._parameters)} "
                                      "values, one per parameter")
        self._handles = {}
        self._synchronized = False
        self._should_synchronize = True
        if self._ternary is not None:
            self._ternary.memory.pending.clear()
        self.set_backward_passes_per_step(self.backward_passes_per_step)
        self._optimizer.load_state_dict(state_dict)
        if masks is not None:
            self._step = int(step)
            self._install_masks(masks)
            if self._ternary is not None:  # the same on every rank: whichever rank's checkpoint it is
                if scales is not None:
                    self._hold_scales(scales)
                else:
                    self._ternary.scales = {}
            if ternary is not None:
                self._ternary.noise.load_state_dict(ternary["noise"])
                devices = {name: p.device for name, p in self._parameters.items()}
                self._ternary.memory.residuals = {
                    name: residual.to(devices[name]) for name, residual in ternary["residuals"].items()
                    if self._compressors[self._parameters[name]].lanes is not None}

    def _saved_ternary(self, saved: Any, masks: dict[str, np.ndarray]) -> dict | None:
        """The checkpoint's ternary entry if this rank wrote it and this optimizer sends ternary values."""
        if saved is None or self._ternary is None:
            return None
        if not isinstance(saved, dict) or not {"rank", "noise", "residuals"} <= set(saved):
            raise CheckpointError("the 'ternary' entry of the 'pactrain' state needs 'rank', 'noise' and 'residuals'")
        if not saved_by_this_rank(saved["rank"], self.process_set.rank):
            return None
        self._ternary.memory.validate(saved["residuals"], {name: int(mask.sum()) for name, mask in masks.items()})
        return saved
