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

Pruning, the Mask Tracker and enforcement are the Horovod frontend's (``Pruner``), moved by
``torch.distributed``. DDP does not wrap the optimizer, so the state registers step hooks on it:
before a step, the schedule's mask update (verified across ranks, state cleared at newly pruned
coordinates, this step's gradients masked); after it, pruned weights back to 0 where the optimizer
could have moved them, and the schedule advances. A step a loss scaler skips is not a step.
"""

# No ``from __future__ import annotations``: DDP checks the hook's annotations as objects.
import numbers
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from pactrain_hvd.core import CheckpointError, PacTrainConfig, StepStats, TensorStats, should_pack
from pactrain_hvd.core.config import DEFAULT_VERIFY_EVERY
from pactrain_hvd.torch.pruning import Prunable, Pruner, TableExchange, host_masks, select_prunable, zero_stays_zero

PACKED_VALUES = {"fp32": torch.float32, "fp16": torch.float16}


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

    parameters: tuple[int, ...]  # ids of the bucket's parameters, in buffer order: DDP may rebuild buckets
    names: tuple[str, ...]
    surviving: torch.Tensor | None
    pruned: torch.Tensor | None
    kept: int
    numel: int


class PacTrainHookState:
    """What ``pactrain_hook`` keeps between steps: schedule position, masks, bucket plans, wire accounting.

    Takes the PacTrain arguments of ``pt.DistributedOptimizer`` (``sparsity``, ``begin_step``,
    ``end_step``, ``frequency``, ``prunable``, ``ranking``, ``pack_min_numel``, ``pack_max_density``,
    ``verify_every``) plus ``process_group`` (DDP's; default: the world) and ``packed_values``
    (``"fp32"`` or ``"fp16"``: how surviving values travel; dense buckets travel as DDP sends them).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        sparsity: float = 0.9,
        begin_step: int = 0,
        end_step: int = 1000,
        frequency: int = 100,
        prunable: Prunable = None,
        ranking: str = "layer",
        pack_min_numel: int | None = None,
        pack_max_density: float | None = None,
        verify_every: int = DEFAULT_VERIFY_EVERY,
        process_group: dist.ProcessGroup | None = None,
        packed_values: str = "fp32",
    ) -> None:
        plan_overrides = {k: v for k, v in (("pack_min_numel", pack_min_numel), ("pack_max_density", pack_max_density))
                          if v is not None}
        self.config = PacTrainConfig(sparsity=sparsity, begin_step=begin_step, end_step=end_step, frequency=frequency,
                                     ranking=ranking, verify_every=verify_every, **plan_overrides)
        if packed_values not in PACKED_VALUES:
            raise ValueError(f"packed_values must be one of {', '.join(map(repr, PACKED_VALUES))}, got {packed_values!r}")
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
        self.packed_dtype = PACKED_VALUES[packed_values]
        self.optimizer = optimizer
        self._pruner = Pruner(self.parameters, select_prunable(self.parameters, prunable), self.config.schedule,
                              self.config.ranking, exchange=dist_exchange(process_group))
        self._checks_masks = bool(self._pruner.prunable_names) and self.config.sparsity > 0
        self._verify_pending = self._checks_masks  # every rank's first step: a local load is caught there
        self._step = 0
        self._sent: set[int] = set()  # indices of the buckets sent in this backward pass
        self._plans: dict[tuple[int, ...], BucketPlan] = {}
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
        return {"step": self._step, "sparsity": self.config.sparsity,
                "masks": {name: mask.to(torch.uint8).cpu() for name, mask in self._pruner.masks.items()}}

    def load_state_dict(self, state: dict) -> None:
        """Masks and schedule position; validated before anything changes. Local: load it on every rank."""
        if not isinstance(state, dict) or not {"step", "masks"} <= set(state):
            raise CheckpointError("a PacTrainHookState state dict needs 'step' and 'masks'")
        step = state["step"]
        if isinstance(step, bool) or not isinstance(step, numbers.Integral) or step < 0:
            raise CheckpointError(f"checkpoint step must be an int >= 0, got {step!r}")
        try:
            masks = self._pruner.validate(host_masks(state["masks"], flags=True))
        except (TypeError, ValueError) as error:
            raise CheckpointError(f"checkpoint does not fit this model: {error}") from error
        self._step = int(step)
        self._install(masks)

    # -- the schedule, around the optimizer's step ---------------------------------------------
    def _install(self, masks: dict[str, np.ndarray]) -> None:
        self._pruner.install(masks)
        self._pruner.clear_optimizer_state(self.optimizer.state)
        self._plans.clear()

    def _before_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._verify_if_due()  # a step with no gradient sent (nothing to reduce) still checks when due
        if self.config.schedule.is_update_step(self._step):
            self._pruner.update(self._step)
            self._pruner.clear_optimizer_state(optimizer.state)
            self._plans.clear()
            self._pruner.mask_gradients()  # this step's gradients were reduced under the old mask

    def _after_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if not self._zero_stays_zero:
            self._pruner.apply_to_weights()
        self._stats.step = self._step
        self._step += 1
        self._sent.clear()
        if self._checks_masks and self.config.verify_every and self._step % self.config.verify_every == 0:
            self._verify_pending = True

    def _begin_bucket(self, index: int) -> None:
        """The first bucket of a backward pass (none sent yet, or this one again: a step a loss scaler
        skipped never reached ``_after_step``) runs a Mask Tracker check due now, on every rank alike."""
        if not self._sent or index in self._sent:
            self._sent.clear()
            self._stats.tensors.clear()
            self._verify_if_due()
        self._sent.add(index)

    def _verify_if_due(self) -> None:
        if self._verify_pending:
            self._pruner.verify(self._step)
            self._verify_pending = False

    # -- buckets ---------------------------------------------------------------------------------
    def _plan(self, bucket: dist.GradBucket) -> BucketPlan:
        parameters = bucket.parameters()
        key = tuple(id(p) for p in parameters)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self._make_plan(parameters, bucket.buffer().numel())
        return plan

    def _make_plan(self, parameters: list[torch.Tensor], buffer_numel: int) -> BucketPlan:
        names = tuple(self._names.get(id(p), "") for p in parameters)
        if sum(p.numel() for p in parameters) != buffer_numel:
            raise RuntimeError(f"bucket of {len(parameters)} parameters does not hold them back to back: "
                               f"{buffer_numel} values for {sum(p.numel() for p in parameters)}")
        masks = [self._pruner.masks.get(name) for name in names]
        numel = buffer_numel
        if all(mask is None for mask in masks):
            return BucketPlan(tuple(id(p) for p in parameters), names, None, None, numel, numel)
        flat = torch.cat([(mask if mask is not None else torch.ones_like(p, dtype=torch.bool)).reshape(-1)
                          for p, mask in zip(parameters, masks)])
        kept = int(flat.sum())
        if should_pack(numel, kept, self.config.pack_min_numel, self.config.pack_max_density):
            return BucketPlan(tuple(id(p) for p in parameters), names, flat.nonzero().squeeze(1), None, kept, numel)
        return BucketPlan(tuple(id(p) for p in parameters), names, None, ~flat, kept, numel)

    def _record(self, bucket: dist.GradBucket, plan: BucketPlan, wire: torch.Tensor) -> None:
        buffer = bucket.buffer()
        self._stats.tensors[f"bucket{bucket.index()}"] = TensorStats(
            numel=plan.numel, kept=plan.kept, packed=plan.surviving is not None,
            sent_bytes=wire.numel() * wire.element_size(), dense_bytes=buffer.numel() * buffer.element_size())


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
        state._record(bucket, plan, buffer)
        buffer.div_(world_size)  # as DDP's default hook: divide first (fp16 overflow)
        return dist.all_reduce(buffer, group=group, async_op=True).get_future().then(lambda fut: fut.value()[0])
    values = buffer.index_select(0, plan.surviving).to(state.packed_dtype).div_(world_size)
    state._record(bucket, plan, values)

    def scatter(fut: torch.futures.Future) -> torch.Tensor:
        buffer.zero_().index_copy_(0, plan.surviving, fut.value()[0].to(buffer.dtype))
        return buffer

    return dist.all_reduce(values, group=group, async_op=True).get_future().then(scatter)
