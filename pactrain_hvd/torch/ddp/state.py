"""``PacTrainHookState``: what the DDP comm hook keeps between steps, around the optimizer's step.

Schedule position and Mask Tracker bookkeeping are ``core.cycle``'s; masks, the Mask Tracker and
enforcement are the Horovod frontend's ``Pruner``, moved by ``torch.distributed``; bucket plans are
``buckets.py``'s. The hook itself (what each bucket sends): ``hook.py``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from pactrain_hvd.core import StepStats, TensorStats
from pactrain_hvd.core.checkpoint import SavedState, entry, read_entry
from pactrain_hvd.core.cycle import PruningCycle
from pactrain_hvd.core.encodings import ENCODINGS
from pactrain_hvd.core.keywords import LOCAL_STEP_KEYWORDS, documents_keywords, pactrain_keywords
from pactrain_hvd.core.lanes import LaneLayout, quantized_layout
from pactrain_hvd.core.lifecycle import StepLifecycle
from pactrain_hvd.core.resume import check_resumable, checkpoint_settings, saved_by_this_rank
from pactrain_hvd.core.settings import pactrain_settings
from pactrain_hvd.torch.checkpoint import fitted_masks
from pactrain_hvd.torch.ddp.buckets import BucketPlan, BucketPlans
from pactrain_hvd.torch.lanes import Noise
from pactrain_hvd.torch.memory import ErrorFeedback
from pactrain_hvd.torch.pruning import (
    Pruner,
    PruningReadout,
    SharedMaskOperations,
    TableExchange,
    host_masks,
    select_prunable,
    zero_stays_zero,
)

# What the hook state does not take: masks of the user's own, the deprecated ``values``, local steps (a DDP hook
# sees gradients only, not the weights an outer step moves).
DDP_WITHOUT = ("masks", "continue_pruning", "values") + LOCAL_STEP_KEYWORDS

def dist_exchange(group: dist.ProcessGroup | None) -> TableExchange:
    """Fingerprint tables over ``torch.distributed``: all_gather pads to the longest table, then trims."""

    def allgather(table: torch.Tensor) -> torch.Tensor:
        size = dist.get_world_size(group)
        # NCCL moves only CUDA tensors; Gloo and MPI host ones
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" else "cpu"
        rows = torch.tensor([table.shape[0]], device=device)
        all_rows = [torch.zeros_like(rows) for _ in range(size)]
        dist.all_gather(all_rows, rows, group=group)
        counts = [int(n) for n in all_rows]
        padded = torch.zeros((max(counts), table.shape[1]), dtype=table.dtype, device=device)
        padded[:table.shape[0]] = table.to(device)
        tables = [torch.empty_like(padded) for _ in range(size)]
        dist.all_gather(tables, padded, group=group)
        return torch.cat([t[:n] for t, n in zip(tables, counts)]).cpu()

    return TableExchange(allgather=allgather, size=lambda: dist.get_world_size(group),
                         hint="After loading a checkpoint on one rank, load it on every rank "
                              "(state.load_state_dict), as DDP's own modules are.")


def stepped_optimizer(optimizer: Any) -> Any:
    """The optimizer whose ``step`` updates the weights. A wrapper that subclasses ``torch.optim.Optimizer``
    without initialising it and steps the optimizer it holds as ``.optimizer`` (Accelerate's
    ``AcceleratedOptimizer``) has no step hooks of its own: the one it holds has them."""
    inner = getattr(optimizer, "optimizer", None)
    if isinstance(inner, torch.optim.Optimizer) and not hasattr(optimizer, "_optimizer_step_pre_hooks"):
        return inner
    return optimizer


@documents_keywords(without=DDP_WITHOUT, meaning={"packed_values": (
    "How surviving values travel (dense buckets travel as DDP hands them): ``\"inherit\"`` (the bucket's dtype: fp32, "
    "or fp16 under ``fp16_compress_wrapper``), ``\"fp16\"``, ``\"bf16\"`` (Gloo and NCCL carry it), or quantized "
    "codes ``\"ternary\"`` / ``\"int3\"`` with error feedback in int32 lanes (one MAX all-reduce of the scales first).")})
class PacTrainHookState(PruningReadout, SharedMaskOperations):
    """What ``pactrain_hook`` keeps between steps: schedule position, masks, bucket plans, wire accounting.

    Every rank must pass the same settings: the first step proves it (``SettingsMismatchError`` on every
    rank instead of a hang).

    Args:
        model: the ``DistributedDataParallel`` model whose buckets the hook reduces.
        optimizer: the optimizer that steps it (momentum and moments are cleared at pruned coordinates).
        process_group: DDP's process group; default: the world.
        {pactrain_keywords}
    """

    @pactrain_keywords(without=DDP_WITHOUT)
    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 process_group: dist.ProcessGroup | None = None, **pactrain: Any) -> None:
        self.config, packed_values = pactrain_settings(pactrain, stacklevel=4)
        self.packed_values = packed_values
        optimizer = stepped_optimizer(optimizer)
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        module = model.module if isinstance(model, DistributedDataParallel) else model
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module (or its DistributedDataParallel), got {type(model).__name__}")
        if process_group is not None and not isinstance(process_group, dist.ProcessGroup):
            raise TypeError(f"process_group must be a torch.distributed.ProcessGroup (the one the DDP reduces over) or "
                            f"None for the default group, got {process_group!r} ({type(process_group).__name__})")
        if not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialized: call dist.init_process_group() first")
        optimized = {id(p) for group in optimizer.param_groups for p in group["params"]}
        self.parameters = {name: p for name, p in module.named_parameters() if id(p) in optimized}
        if not self.parameters:
            raise ValueError("optimizer holds none of the model's parameters: build it from the model the DDP wraps "
                             "(torch.optim.SGD(model.parameters(), ...)) before PacTrainHookState")
        self.process_group = process_group
        self.optimizer = optimizer
        world_size = dist.get_world_size(process_group)
        encoding = ENCODINGS[packed_values]
        self.lanes: LaneLayout | None = quantized_layout(world_size, encoding.levels) if encoding.quantized else None
        # None: the bucket's dtype; a quantized encoding's where lanes do not pay. Gloo and NCCL carry bfloat16.
        self.packed_dtype = None if encoding.wire is None else getattr(torch, encoding.wire)
        # Per parameter, not per bucket: DDP rebuilds its buckets after the first iteration (and a resumed
        # run starts from the first buckets again), so only per-parameter memory and noise (``core.quantized``) resume exactly.
        self.memory = ErrorFeedback()
        self._rank = dist.get_rank(process_group)
        self.noise = Noise(self._rank)  # rounding noise of quantized codes, drawn for (rank, parameter, step)
        self.pruner = Pruner(self.parameters, select_prunable(self.parameters, pactrain["prunable"]), self.config.schedule,
                              self.config.ranking, exchange=dist_exchange(process_group),
                              settings={**self.config.shared_settings(), "packed_values": packed_values})
        self.cycle = PruningCycle(self.config, bool(self.pruner.prunable_names) and self.config.sparsity > 0)
        self.lifecycle = StepLifecycle(self.cycle, self)
        self.weights_unmasked = False  # masks ranked before the first bucket, weights not yet zeroed
        self._remask = False
        self._sent: set[int] = set()  # indices of the buckets sent in this backward pass
        names = {id(p): name for name, p in self.parameters.items()}
        self._plans = BucketPlans(names, self.config, self.memory if self.lanes is not None else None)
        self._stats = StepStats()
        self._zero_stays_zero = zero_stays_zero(optimizer)
        self._hooks = [optimizer.register_step_pre_hook(self._before_step),
                       optimizer.register_step_post_hook(self._after_step)]

    # -- what a user reads ---------------------------------------------------------------------
    def stats(self) -> dict:
        """The last step's bytes handed to ``all_reduce`` (and DDP's fp32 equivalent), per bucket."""
        return dict(self._stats.as_dict(), sparsity=self.pruner.sparsity())

    # -- checkpoints ---------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Core's checkpoint entry (``pactrain_hvd.core.checkpoint``): masks, schedule position, settings, world
        size; with quantized values also this rank's error memory (its noise is drawn for the step: nothing to
        save)."""
        masks = {name: mask.to(torch.uint8).cpu() for name, mask in self.pruner.masks.items()}
        quantized = {"rank": self._rank, "residuals": self.memory.state_dict()} if self.lanes is not None else None
        return entry(SavedState(self.cycle.step, masks, checkpoint_settings(self.config, self.packed_values),
                                dist.get_world_size(self.process_group), quantized=quantized))

    def load_state_dict(self, state: dict) -> None:
        """Masks and schedule position; validated before anything changes. Local: load it on every rank."""
        saved = read_entry(state, "a PacTrainHookState state dict")
        masks = fitted_masks(self.fit_masks, saved.masks)
        check_resumable(saved, self.config, self.packed_values, dist.get_world_size(self.process_group))
        residuals = None
        if self.lanes is not None and saved.quantized is not None and saved_by_this_rank(
                saved.quantized["rank"], lambda: self._rank, holds_state=saved.step > 0):
            kept = {name: int(masks[name].sum()) if name in masks else p.numel() for name, p in self.parameters.items()}
            residuals = self.memory.validate(saved.quantized["residuals"], kept)
        self.cycle.step = saved.step
        self._install(masks)
        if residuals is not None:
            self.memory.load_state_dict(residuals, {name: p.device for name, p in self.parameters.items()})

    def fit_masks(self, masks: dict[str, Any]) -> dict[str, np.ndarray]:
        """Masks (bool or uint8 flags, tensors or arrays) as validated host masks of these parameters."""
        return self.pruner.validate(host_masks(masks, flags=True))

    # -- the schedule, around the optimizer's step ---------------------------------------------
    def _install(self, masks: dict[str, np.ndarray]) -> None:
        """Loaded masks: plans and error memory start from them (no remap from the masks they replace)."""
        self.pruner.install(masks)
        self.pruner.clear_optimizer_state(self.optimizer.state)
        self._plans.start_from(self.pruner.masks, self.parameters)

    def _before_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        # (a step with no gradient sent, nothing to reduce, still checks when due)
        self._remask = self.lifecycle.before_update()

    def _after_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._stats.step = self.cycle.step
        self.lifecycle.after_update(self._remask)
        self._sent.clear()

    # -- the mask operations ``core.lifecycle.StepLifecycle`` asks for -----------------------------
    gradients_masked_by_reduction = True  # the hook zeroes pruned coordinates of every bucket it sends

    def adopt_broadcast(self) -> None:
        """Nothing to adopt: DDP broadcasts no PacTrain state."""

    def rank_masks(self, step: int, early: bool) -> None:
        """``early``: a schedule that prunes at step 0 ranks before the first bucket is sent, from the weights DDP
        broadcast at its construction; autograd may still read them, so they are zeroed before the update."""
        self.pruner.update(step, zero_weights=not early)
        self.pruner.clear_optimizer_state(self.optimizer.state)
        self._plans.clear()
        self.weights_unmasked |= early

    def needs_remask(self, step: int) -> bool:
        return not self._zero_stays_zero

    def commit_codec_memory(self) -> None:
        self.memory.commit()

    def begin_interval(self) -> None:
        raise AssertionError("the DDP hook takes no local steps")

    # -- what the hook asks, bucket by bucket (hook.py) -------------------------------------------
    def begin_bucket(self, index: int) -> None:
        """The first bucket of a backward pass (none sent yet, or this one again: a step a loss scaler
        skipped never reached ``_after_step``) runs a Mask Tracker check due now, on every rank alike."""
        if not self._sent or index in self._sent:
            self._sent.clear()
            self._stats.tensors.clear()
            self.lifecycle.before_communication()
        self._sent.add(index)

    def plan(self, bucket: dist.GradBucket) -> BucketPlan:
        """How ``bucket`` travels under the current masks."""
        return self._plans.of(bucket, self.pruner.masks)

    def record(self, bucket: dist.GradBucket, plan: BucketPlan, sent_bytes: int) -> None:
        """What ``bucket`` put on the wire: ``stats()``."""
        self._stats.tensors[f"bucket{bucket.index()}"] = TensorStats(
            numel=plan.numel, kept=plan.kept, packed=plan.surviving is not None,
            sent_bytes=sent_bytes, dense_bytes=plan.dense_bytes)
