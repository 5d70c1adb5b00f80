"""``pactrain_hook``: what DDP's comm hook sends of each bucket (its state: ``state.py``).

A bucket the plan keeps dense travels whole, pruned coordinates zeroed; a packed one sends its
surviving coordinates only (cast as ``packed_values`` says, or as quantized codes in int32 lanes with
error feedback), through one asynchronous ``dist.all_reduce``, and scatters the result back.
"""

# No ``from __future__ import annotations``: DDP checks the hook's annotations as objects.
import torch
import torch.distributed as dist

from pactrain_hvd.torch.ddp.buckets import BucketPlan
from pactrain_hvd.torch.ddp.state import PacTrainHookState
from pactrain_hvd.torch.lanes import dequantize, encode, local_scale, stochastic_codes
from pactrain_hvd.torch.scatter import put_survivors_


def _quantized_allreduce(state: PacTrainHookState, plan: BucketPlan, buffer: torch.Tensor,
                       group: dist.ProcessGroup) -> torch.futures.Future[torch.Tensor]:
    """Each parameter's survivors + error memory, one MAX all-reduce of their ``local_scale`` (a scale per
    parameter, as in the Horovod frontend, so nothing depends on how DDP groups parameters into
    buckets), then their stochastic codes (ternary, int3) summed in int32 lanes.

    The MAX is waited for here, in the hook: a collective started from a future's callback would race
    with the next bucket's, and ranks could then issue them in different orders.
    """
    names, counts = zip(*plan.segments)
    parts = [state.memory.add(name, part) for name, part in
             zip(names, torch.take(buffer, plan.surviving).float().split(counts))]
    levels = state.lanes.levels
    scales = torch.stack([local_scale(part, levels) for part in parts])
    dist.all_reduce(scales, op=dist.ReduceOp.MAX, group=group)
    values = torch.cat(parts)
    per_value = torch.repeat_interleave(scales, torch.tensor(counts, device=scales.device))
    noise = torch.cat([state.noise.uniform(name, state.step_count, count, values.device)
                       for name, count in plan.segments])
    codes = stochastic_codes(values, per_value, noise, levels)
    words = encode(codes, state.lanes)
    for name, value, sent in zip(names, parts, codes.mul_(per_value / levels).split(counts)):
        state.memory.store(name, value, sent)
    world_size = group.size()

    def scatter(fut: torch.futures.Future) -> torch.Tensor:
        averaged = dequantize(fut.value()[0], state.lanes, values.numel(), per_value, world_size)
        put_survivors_(buffer.zero_(), plan.surviving, averaged.to(buffer.dtype))
        return buffer

    return dist.all_reduce(words, group=group, async_op=True).get_future().then(scatter)


def pactrain_hook(state: PacTrainHookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: all-reduce the bucket's surviving gradient values only, averaged like DDP's default.

    Args:
        state: the ``PacTrainHookState`` made for the DDP model (masks, packing plans, process group).
        bucket: the gradient bucket DDP hands the hook.

    Returns:
        A future of the bucket's buffer holding the averaged gradients (pruned coordinates 0).

    Example::

        >>> state = PacTrainHookState(ddp_model, optimizer, sparsity=0.9)
        >>> ddp_model.register_comm_hook(state, pactrain_hook)
    """
    state.begin_bucket(bucket.index())
    group = state.process_group if state.process_group is not None else dist.group.WORLD
    world_size = group.size()
    buffer = bucket.buffer()
    plan = state.plan(bucket)
    if plan.surviving is None:
        if plan.pruned is not None:
            buffer.masked_fill_(plan.pruned, 0)
        state.record(bucket, plan, buffer.numel() * buffer.element_size())
        buffer.div_(world_size)  # as DDP's default hook: divide first (fp16 overflow)
        return dist.all_reduce(buffer, group=group, async_op=True).get_future().then(lambda fut: fut.value()[0])
    if state.lanes is not None:
        # int32 words and one fp32 scale per parameter
        state.record(bucket, plan, 4 * (state.lanes.words(plan.kept) + len(plan.segments)))
        return _quantized_allreduce(state, plan, buffer, group)
    values = torch.take(buffer, plan.surviving).to(state.packed_dtype or buffer.dtype).div_(world_size)
    state.record(bucket, plan, values.numel() * values.element_size())

    def scatter(fut: torch.futures.Future) -> torch.Tensor:
        put_survivors_(buffer.zero_(), plan.surviving, fut.value()[0].to(buffer.dtype))
        return buffer

    return dist.all_reduce(values, group=group, async_op=True).get_future().then(scatter)
