"""DDP's buckets: how each travels (packed, dense with pruned coordinates zeroed, or untouched).

A ``GradBucket`` is a flat buffer holding several parameters' gradients back to back. Its plan is
cached per mask change and per bucket (by its parameters: DDP rebuilds its buckets after the first
iteration, which is then a new plan); with error feedback, each parameter's memory follows its
surviving coordinates from one plan to the next.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pactrain_hvd.core import PacTrainConfig, should_pack
from pactrain_hvd.torch.compression import fills_storage, storage_view
from pactrain_hvd.torch.memory import ErrorFeedback


def in_bucket_order(mask: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """``mask`` flattened as DDP lays ``p``'s gradient into a bucket: in ``p``'s memory order, since DDP's
    bucket views follow a dense parameter's strides (a channels_last weight lies there in NHWC order)."""
    if p.is_contiguous() or not fills_storage(p):
        return mask.reshape(-1)
    return storage_view(torch.empty_like(p, dtype=torch.bool).copy_(mask))


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


class BucketPlans:
    """The plans of the buckets seen since the last mask change; ``memory``: error feedback that follows the
    survivors of each parameter (None: no error feedback)."""

    def __init__(self, names: dict[int, str], config: PacTrainConfig, memory: ErrorFeedback | None) -> None:
        self._names = names  # parameter id -> name
        self._config = config
        self._memory = memory
        self._plans: dict[tuple[int, ...], BucketPlan] = {}  # by the ids of a bucket's parameters
        self._surviving: dict[str, torch.Tensor] = {}  # per parameter, the last plan's: the memory follows it

    def clear(self) -> None:
        """Masks changed: plans are made anew, and each parameter's memory follows its survivors to them."""
        self._plans.clear()

    def start_from(self, masks: dict[str, torch.Tensor], parameters: dict[str, torch.Tensor]) -> None:
        """Loaded masks (a checkpoint's, with the memory saved under them): plans are made anew, and the memory
        follows their survivors from here, not from the masks they replace, whether or not a bucket is planned
        before the next mask change (``optimizer.step(closure)`` ranks masks before its backward)."""
        self._plans.clear()
        self._surviving = {name: in_bucket_order(masks[name], p).nonzero().squeeze(1) if name in masks
                           else torch.arange(p.numel(), device=p.device) for name, p in parameters.items()}

    def of(self, bucket: torch.distributed.GradBucket, masks: dict[str, torch.Tensor]) -> BucketPlan:
        parameters = bucket.parameters()
        key = tuple(id(p) for p in parameters)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self._make(parameters, bucket.buffer().numel(), masks)
            if self._memory is not None:
                self._follow_survivors(parameters, plan, masks)
        return plan

    def _follow_survivors(self, parameters: list[torch.Tensor], plan: BucketPlan,
                          masks: dict[str, torch.Tensor]) -> None:
        """After a mask change, each parameter's error memory moves to its new surviving coordinates."""
        for p, name in zip(parameters, plan.names):
            mask = masks.get(name)
            surviving = (in_bucket_order(mask, p).nonzero().squeeze(1) if mask is not None
                         else torch.arange(p.numel(), device=p.device))
            previous = self._surviving.get(name)
            if previous is not None and not torch.equal(previous, surviving):
                self._memory.remap(name, previous, surviving, p.numel())
            self._surviving[name] = surviving

    def _make(self, parameters: list[torch.Tensor], buffer_numel: int, held: dict[str, torch.Tensor]) -> BucketPlan:
        names = tuple(self._names.get(id(p), "") for p in parameters)
        if sum(p.numel() for p in parameters) != buffer_numel:
            raise RuntimeError(f"bucket of {len(parameters)} parameters does not hold them back to back: "
                               f"{buffer_numel} values for {sum(p.numel() for p in parameters)}")
        masks = [held.get(name) for name in names]
        numel = buffer_numel
        dense_bytes = numel * parameters[0].element_size()
        if all(mask is None for mask in masks):
            return BucketPlan(names, None, None, numel, numel, dense_bytes)
        flat = torch.cat([in_bucket_order(mask, p) if mask is not None else torch.ones(p.numel(), dtype=torch.bool,
                                                                                       device=p.device)
                          for p, mask in zip(parameters, masks)])
        kept = int(flat.sum())
        if should_pack(numel, kept, self._config.pack_min_numel, self._config.pack_max_density):
            segments = tuple((name, int(mask.sum()) if mask is not None else p.numel())
                             for name, p, mask in zip(names, parameters, masks))
            return BucketPlan(names, flat.nonzero().squeeze(1), None, kept, numel, dense_bytes, segments)
        return BucketPlan(names, None, ~flat, kept, numel, dense_bytes)
