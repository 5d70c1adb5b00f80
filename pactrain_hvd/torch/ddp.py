"""PacTrain for ``torch.nn.parallel.DistributedDataParallel``: a comm hook beside torch's PowerSGD.

Example::

    >>> import pactrain_hvd.torch as pt
    >>> state = pt.ddp.PacTrainHookState(ddp_model, optimizer, sparsity=0.9, end_step=1000)
    >>> ddp_model.register_comm_hook(state, pt.ddp.pactrain_hook)   # the loop is unchanged

DDP hands the hook one ``GradBucket`` at a time: a flat buffer holding several parameters' gradients
back to back. The hook sends the bucket's surviving coordinates (the concatenated masks of its
parameters; cached per mask change and per bucket, so DDP's rebuild of buckets after the first
iteration is a new plan) through one asynchronous ``dist.all_reduce`` and scatters the result
back, divided by the world size as DDP's default hook does. A bucket the plan keeps dense travels
whole, with pruned coordinates zeroed; a bucket with nothing pruned is DDP's default all-reduce.
Dense buckets travel in the bucket's dtype: for fp16 there too (as ``hvd.Compression.fp16`` does for the
Horovod frontend's dense tensors), wrap the hook as torch wraps its own:
``register_comm_hook(state, fp16_compress_wrapper(pactrain_hook))``.

Pruning, the Mask Tracker and enforcement are the Horovod frontend's (``Pruner``), moved by
``torch.distributed``. DDP does not wrap the optimizer, so the state registers step hooks on it:
before a step, the schedule's mask update (verified across ranks, state cleared at newly pruned
coordinates, this step's gradients masked); after it, pruned weights back to 0 where the optimizer
could have moved them, and the schedule advances. A step a loss scaler skips is not a step.
"""

# No ``from __future__ import annotations``: DDP checks the hook's annotations as objects.
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from pactrain_hvd.core import CheckpointError, PacTrainConfig, StepStats, TensorStats, should_pack
from pactrain_hvd.core.config import config_arguments, pactrain_keywords
from pactrain_hvd.core.encodings import ENCODINGS, packed_values_argument
from pactrain_hvd.core.lanes import LaneLayout, ternary_layout
from pactrain_hvd.core.resume import check_saved_settings, checkpoint_settings
from pactrain_hvd.torch.checkpoint import saved_step_and_masks
from pactrain_hvd.torch.compression import fills_storage, storage_view
from pactrain_hvd.torch.lanes import dequantize, encode, local_scale, stochastic_ternary
from pactrain_hvd.torch.memory import ErrorFeedback
from pactrain_hvd.torch.pruning import Pruner, TableExchange, select_prunable, zero_stays_zero

_NOISE_SEED = 0xDD9  # ternary rounding noise: drawn per (rank, step, parameter), see _rounding_noise


def in_bucket_order(mask: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """``mask`` flattened as DDP lays ``p``'s gradient into a bucket: in ``p``'s memory order, since DDP's
    bucket views follow a dense parameter's strides (a channels_last weight lies there in NHWC order)."""
    if p.is_contiguous() or not fills_storage(p):
        return mask.reshape(-1)
    return storage_view(torch.empty_like(p, dtype=torch.bool).copy_(mask))


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


@dataclass(frozen=True)
class BucketPlan:
    """How one bucket travels: ``surviving`` flat positions (packed), or whole with ``pruned`` zeroed."""

    names: tuple[str, ...]  # the bucket's parameters, in buffer order
    surviving: torch.Tensor | None
    pruned: torch.Tensor | None
    kept: int
    numel: int
    dense_bytes: int  # the bucket in its parameters' dtype: what dense DDP would send
    segments: tuple[tuple[str, int], ...] = ()  # packed: (parameter name, its surviving count), in buffer order


class PacTrainHookState:
    """What ``pactrain_hook`` keeps between steps: schedule position, masks, bucket plans, wire accounting.

    Takes the PacTrain arguments of ``pt.DistributedOptimizer`` (``sparsity``, ``begin_step``,
    ``end_step``, ``frequency``, ``total_steps``, ``schedule``, ``prunable``, ``ranking``, ``pack_min_numel``, ``pack_max_density``,
    ``verify_every``) plus ``process_group`` (DDP's; default: the world) and ``packed_values``:
    how surviving values travel (dense buckets travel as DDP hands them): ``"inherit"`` (the bucket's dtype:
    fp32, or fp16 under ``fp16_compress_wrapper``; ``"fp32"`` is its deprecated name), ``"fp16"``, ``"bf16"``
    (Gloo and NCCL carry bfloat16; Horovod's all-reduce does not), or ``"ternary"``, the Horovod frontend's shared-scale stochastic ternary with error feedback in int32
    lanes (one MAX all-reduce of the bucket's scale, then the codes; fp16 where lanes do not pay).
    ``resume_changed_settings`` as in ``pt.DistributedOptimizer``. Every rank must pass the same settings:
    the first step proves it (``SettingsMismatchError`` on every rank instead of a hang).
    """

    @pactrain_keywords(without=("masks", "continue_pruning", "values"))
    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 process_group: dist.ProcessGroup | None = None, **pactrain: Any) -> None:
        self.config = PacTrainConfig.from_arguments(**config_arguments(pactrain))
        packed_values = packed_values_argument(pactrain["packed_values"])
        self.packed_values = packed_values
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        module = model.module if isinstance(model, DistributedDataParallel) else model
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module (or its DistributedDataParallel), got {type(model).__name__}")
        if not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialized: call dist.init_process_group() first")
        optimized = {id(p) for group in optimizer.param_groups for p in group["params"]}
        self.parameters = {name: p for name, p in module.named_parameters() if id(p) in optimized}
        self._names = {id(p): name for name, p in self.parameters.items()}
        self.process_group = process_group
        self.optimizer = optimizer
        world_size = dist.get_world_size(process_group)
        encoding = ENCODINGS[packed_values]
        self.lanes: LaneLayout | None = ternary_layout(world_size) if encoding.quantized else None
        # None: the bucket's dtype; a quantized encoding's where lanes do not pay. Gloo and NCCL carry bfloat16.
        self.packed_dtype = None if encoding.wire is None else getattr(torch, encoding.wire)
        # Per parameter, not per bucket: DDP rebuilds its buckets after the first iteration (and a resumed
        # run starts from the first buckets again), so only per-parameter memory and noise resume exactly.
        self.memory = ErrorFeedback()
        self._rank = dist.get_rank(process_group)
        self._generators: dict[torch.device, torch.Generator] = {}
        self._pruner = Pruner(self.parameters, select_prunable(self.parameters, pactrain["prunable"]), self.config.schedule,
                              self.config.ranking, exchange=dist_exchange(process_group),
                              settings={**self.config.shared_settings(), "packed_values": packed_values})
        self._checks_masks = bool(self._pruner.prunable_names) and self.config.sparsity > 0
        # Every rank's first step checks, whatever its settings: differing settings, or a load on one rank, are
        # caught there, not a hang.
        self._verify_pending = True
        self._step = 0
        self._pruned_at: int | None = None  # the step whose masks were ranked before its first bucket
        self._sent: set[int] = set()  # indices of the buckets sent in this backward pass
        self._plans: dict[tuple[int, ...], BucketPlan] = {}  # by the ids of a bucket's parameters: DDP rebuilds buckets
        self._surviving: dict[str, torch.Tensor] = {}  # per parameter, the last plan's: the memory follows it
        self._stats = StepStats()
        self._zero_stays_zero = zero_stays_zero(optimizer)
        self._hooks = [optimizer.register_step_pre_hook(self._before_step),
                       optimizer.register_step_post_hook(self._after_step)]

    # -- what a user reads ---------------------------------------------------------------------
    @property
    def step_count(self) -> int:
        return self._step

    def masks(self) -> dict[str, torch.Tensor]:
        return {name: mask.clone() for name, mask in self._pruner.masks.items()}

    def stats(self) -> dict:
        """The last step's bytes handed to ``all_reduce`` (and DDP's fp32 equivalent), per bucket."""
        return dict(self._stats.as_dict(), sparsity=self._pruner.sparsity())

    # -- checkpoints ---------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Masks and schedule position; with ternary values also this rank's error memory (its noise is a
        function of rank, step and parameter: nothing to save)."""
        state = {"step": self._step, "sparsity": self.config.sparsity,
                 "settings": checkpoint_settings(self.config, self.packed_values),
                 "masks": {name: mask.to(torch.uint8).cpu() for name, mask in self._pruner.masks.items()}}
        if self.lanes is not None:
            state["ternary"] = {"rank": self._rank,
                                "residuals": {k: r.detach().cpu().clone() for k, r in self.memory.residuals.items()}}
        return state

    def load_state_dict(self, state: dict) -> None:
        """Masks and schedule position; validated before anything changes. Local: load it on every rank."""
        step, masks = saved_step_and_masks(self._pruner, state, "a PacTrainHookState state dict")
        check_saved_settings(state.get("settings", {"sparsity": state["sparsity"]} if "sparsity" in state else None),
                             checkpoint_settings(self.config, self.packed_values), step, self.config)
        ternary = state.get("ternary")
        if ternary is not None and not (isinstance(ternary, dict) and {"rank", "residuals"} <= set(ternary)):
            raise CheckpointError("the 'ternary' entry needs 'rank' and 'residuals'")
        residuals = None
        if self.lanes is not None and ternary is not None and ternary["rank"] == self._rank:  # this rank's own
            kept = {name: int(masks[name].sum()) if name in masks else p.numel() for name, p in self.parameters.items()}
            residuals = self.memory.validate(ternary["residuals"], kept)
        self._step = step
        self._install(masks)
        if residuals is not None:
            self.memory.residuals = {name: r.to(self.parameters[name].device) for name, r in residuals.items()}
            self.memory.pending.clear()

    # -- the schedule, around the optimizer's step ---------------------------------------------
    def _install(self, masks: dict[str, np.ndarray]) -> None:
        """Loaded masks: plans and error memory start from them (no remap from the masks they replace)."""
        self._pruner.install(masks)
        self._pruner.clear_optimizer_state(self.optimizer.state)
        self._plans.clear()
        self._surviving.clear()

    def _before_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._verify_if_due()  # a step with no gradient sent (nothing to reduce) still checks when due
        if self._pruned_at == self._step:  # masks ranked before this step's first bucket: weights zeroed now
            self._pruner.apply_to_weights()
            self._pruner.mask_gradients()
        elif self.config.schedule.is_update_step(self._step):
            self._pruner.update(self._step)
            self._pruner.clear_optimizer_state(optimizer.state)
            self._plans.clear()
            self._pruner.mask_gradients()  # this step's gradients were reduced under the old mask

    def _after_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self.memory.commit()  # the step was taken (a loss scaler that skips it never calls step)
        if not self._zero_stays_zero:
            self._pruner.apply_to_weights()
        self._stats.step = self._step
        self._step += 1
        self._sent.clear()
        if self._checks_masks and self.config.verifies_at(self._step):
            self._verify_pending = True

    def _begin_bucket(self, index: int) -> None:
        """The first bucket of a backward pass (none sent yet, or this one again: a step a loss scaler
        skipped never reached ``_after_step``) runs a Mask Tracker check due now, on every rank alike."""
        if not self._sent or index in self._sent:
            self._sent.clear()
            self._stats.tensors.clear()
            if (self._step == 0 and self._pruned_at is None and not self._pruner.masks
                    and self.config.schedule.is_update_step(0)):
                self._prune_before_reduction()
            self._verify_if_due()
        self._sent.add(index)

    def _prune_before_reduction(self) -> None:
        """A schedule that prunes at step 0 ranks its masks before the first bucket is sent, from the weights
        DDP broadcast at its construction; autograd may still read them, so they are zeroed before the update."""
        self._pruner.update(self._step, zero_weights=False)
        self._pruner.clear_optimizer_state(self.optimizer.state)
        self._plans.clear()
        self._pruned_at = self._step
        self._verify_pending = False

    def _verify_if_due(self) -> None:
        if self._verify_pending:  # with nothing pruned only the settings must agree, not the position
            self._pruner.verify(self._step if self._checks_masks else 0)
            self._verify_pending = False

    # -- buckets ---------------------------------------------------------------------------------
    def _plan(self, bucket: dist.GradBucket) -> BucketPlan:
        parameters = bucket.parameters()
        key = tuple(id(p) for p in parameters)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self._make_plan(parameters, bucket.buffer().numel())
            if self.lanes is not None:
                self._follow_survivors(parameters, plan)
        return plan

    def _follow_survivors(self, parameters: list[torch.Tensor], plan: BucketPlan) -> None:
        """After a mask change, each parameter's error memory moves to its new surviving coordinates."""
        for p, name in zip(parameters, plan.names):
            mask = self._pruner.masks.get(name)
            surviving = (in_bucket_order(mask, p).nonzero().squeeze(1) if mask is not None
                         else torch.arange(p.numel(), device=p.device))
            previous = self._surviving.get(name)
            if previous is not None and not torch.equal(previous, surviving):
                self.memory.remap(name, previous, surviving, p.numel())
            self._surviving[name] = surviving

    def _rounding_noise(self, name: str, count: int, device: torch.device) -> torch.Tensor:
        """Uniform [0, 1) noise for one parameter's survivors, a function of (rank, step, parameter)."""
        generator = self._generators.get(device)
        if generator is None:
            generator = self._generators[device] = torch.Generator(device=device)
        generator.manual_seed(zlib.crc32(f"{_NOISE_SEED}:{self._rank}:{self._step}:{name}".encode()))
        return torch.rand(count, generator=generator, device=device)

    def _make_plan(self, parameters: list[torch.Tensor], buffer_numel: int) -> BucketPlan:
        names = tuple(self._names.get(id(p), "") for p in parameters)
        if sum(p.numel() for p in parameters) != buffer_numel:
            raise RuntimeError(f"bucket of {len(parameters)} parameters does not hold them back to back: "
                               f"{buffer_numel} values for {sum(p.numel() for p in parameters)}")
        masks = [self._pruner.masks.get(name) for name in names]
        numel = buffer_numel
        dense_bytes = numel * parameters[0].element_size()
        if all(mask is None for mask in masks):
            return BucketPlan(names, None, None, numel, numel, dense_bytes)
        flat = torch.cat([in_bucket_order(mask, p) if mask is not None else torch.ones(p.numel(), dtype=torch.bool,
                                                                                       device=p.device)
                          for p, mask in zip(parameters, masks)])
        kept = int(flat.sum())
        if should_pack(numel, kept, self.config.pack_min_numel, self.config.pack_max_density):
            segments = tuple((name, int(mask.sum()) if mask is not None else p.numel())
                             for name, p, mask in zip(names, parameters, masks))
            return BucketPlan(names, flat.nonzero().squeeze(1), None, kept, numel, dense_bytes, segments)
        return BucketPlan(names, None, ~flat, kept, numel, dense_bytes)

    def _record(self, bucket: dist.GradBucket, plan: BucketPlan, sent_bytes: int) -> None:
        self._stats.tensors[f"bucket{bucket.index()}"] = TensorStats(
            numel=plan.numel, kept=plan.kept, packed=plan.surviving is not None,
            sent_bytes=sent_bytes, dense_bytes=plan.dense_bytes)


def _ternary_allreduce(state: PacTrainHookState, plan: BucketPlan, buffer: torch.Tensor,
                       group: dist.ProcessGroup) -> torch.futures.Future[torch.Tensor]:
    """Each parameter's survivors + error memory, one MAX all-reduce of their ``local_scale`` (a scale per
    parameter, as in the Horovod frontend, so nothing depends on how DDP groups parameters into
    buckets), then their stochastic ternary codes summed in int32 lanes.

    The MAX is waited for here, in the hook: a collective started from a future's callback would race
    with the next bucket's, and ranks could then issue them in different orders.
    """
    names, counts = zip(*plan.segments)
    parts = [state.memory.add_(name, part) for name, part in
             zip(names, torch.take(buffer, plan.surviving).float().split(counts))]
    scales = torch.stack([local_scale(part) for part in parts])
    dist.all_reduce(scales, op=dist.ReduceOp.MAX, group=group)
    values = torch.cat(parts)
    per_value = torch.repeat_interleave(scales, torch.tensor(counts, device=scales.device))
    noise = torch.cat([state._rounding_noise(name, count, values.device) for name, count in plan.segments])
    ternary = stochastic_ternary(values, per_value, noise)
    words = encode(ternary, state.lanes)
    for name, value, sent in zip(names, parts, ternary.mul_(per_value).split(counts)):
        state.memory.store(name, value, sent)
    world_size = group.size()

    def scatter(fut: torch.futures.Future) -> torch.Tensor:
        averaged = dequantize(fut.value()[0], state.lanes, values.numel(), per_value, world_size)
        buffer.zero_().put_(plan.surviving, averaged.to(buffer.dtype))
        return buffer

    return dist.all_reduce(words, group=group, async_op=True).get_future().then(scatter)


def pactrain_hook(state: PacTrainHookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: all-reduce the bucket's surviving gradient values only, averaged like DDP's default.

    Example::

        >>> state = PacTrainHookState(ddp_model, optimizer, sparsity=0.9)
        >>> ddp_model.register_comm_hook(state, pactrain_hook)
    """
    state._begin_bucket(bucket.index())
    group = state.process_group if state.process_group is not None else dist.group.WORLD
    world_size = group.size()
    buffer = bucket.buffer()
    plan = state._plan(bucket)
    if plan.surviving is None:
        if plan.pruned is not None:
            buffer.masked_fill_(plan.pruned, 0)
        state._record(bucket, plan, buffer.numel() * buffer.element_size())
        buffer.div_(world_size)  # as DDP's default hook: divide first (fp16 overflow)
        return dist.all_reduce(buffer, group=group, async_op=True).get_future().then(lambda fut: fut.value()[0])
    if state.lanes is not None:
        # int32 words and one fp32 scale per parameter
        state._record(bucket, plan, 4 * (state.lanes.words(plan.kept) + len(plan.segments)))
        return _ternary_allreduce(state, plan, buffer, group)
    values = torch.take(buffer, plan.surviving).to(state.packed_dtype or buffer.dtype).div_(world_size)
    state._record(bucket, plan, values.numel() * values.element_size())

    def scatter(fut: torch.futures.Future) -> torch.Tensor:
        buffer.zero_().put_(plan.surviving, fut.value()[0].to(buffer.dtype))
        return buffer

    return dist.all_reduce(values, group=group, async_op=True).get_future().then(scatter)
