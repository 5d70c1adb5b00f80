"""The benchmark's DDP methods: torch DistributedDataParallel with its own comm hooks, and PacTrain's.

``ddp`` is DDP's default all-reduce (fp32); ``ddp-fp16`` torch's ``fp16_compress_hook``;
``ddp-powersgd`` torch's ``powerSGD_hook`` (rank 4, error feedback, warm start; one bucket, see
``one_bucket_mb``); ``ddp-pactrain-...`` ``pt.ddp.pactrain_hook`` with the same pruning schedule as
the Horovod methods, its fp16 and ternary variants under torch's ``fp16_compress_wrapper`` (dense
buckets in fp16, as the Horovod methods' ``Compression.fp16`` sends dense tensors); ``ddp-average-hH``
torch's local SGD: no gradient communication (``noop_hook``) and ``PeriodicModelAverager`` averaging the
parameters every H steps after the update (``PostLocalSGDOptimizer``, ``trainer``). Every worker joins
``torch.distributed`` (Gloo) from the harness's ``MASTER_ADDR`` / ``MASTER_PORT``.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.distributed.algorithms.ddp_comm_hooks.debugging_hooks import noop_hook
from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
from torch.distributed.optim import PostLocalSGDOptimizer
from torch.nn.parallel import DistributedDataParallel

import pactrain_hvd.torch as pt
from benchmarks.common.methods import MethodSpec, pruning_schedule

# torch's guidance: run vanilla all-reduce for the learning rate's warm-up. These schedules have none,
# so PowerSGD starts as soon as DDP allows with error feedback and warm start (after two iterations).
POWERSGD_START_ITER = 2
POWERSGD_MIN_COMPRESSION_RATE = 2  # torch's default: a matrix is compressed where that saves 2x or more


def settle_steps(spec: MethodSpec) -> int:
    """Steps before ``spec``'s hook runs as it will from then on (PowerSGD: vanilla all-reduce first)."""
    return POWERSGD_START_ITER if spec.kind == "powersgd" else 0


def one_bucket_mb(model: torch.nn.Module) -> float:
    """A bucket cap (MiB) that holds every gradient of ``model``: DDP then builds exactly one bucket.

    torch's ``powerSGD_hook`` issues its P and Q all-reduces from future callbacks, so with several
    buckets they can race the next bucket's all-reduce issued by backward; on Gloo, which matches
    collectives by issue order, ranks then pair up different tensors (what a 4-worker run with DDP's
    default buckets died of: ``gloo::EnforceNotMet``, a size mismatch). One bucket leaves nothing to race.
    """
    return sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20 + 1


def powersgd_bytes(model: torch.nn.Module, rank: int) -> int:
    """What ``powerSGD_hook`` hands ``all_reduce`` per step once compressing, in its one bucket: each gradient
    viewed as a (rows, rest) matrix is sent as P and Q (fp32) where torch's own rule finds that worth it
    (``_should_compress``, private but the hook's own), else whole, as are vectors."""
    total = 0
    for p in model.parameters():
        if p.dim() <= 1:
            total += p.numel() * 4
            continue
        rows = p.shape[0]
        compress, whole, low_rank = powerSGD_hook._should_compress(rows, p.numel() // rows, rank,
                                                                   POWERSGD_MIN_COMPRESSION_RATE)
        total += (low_rank if compress else whole) * 4
    return total


def join(rank: int, size: int) -> None:
    """This worker into torch.distributed's Gloo group (the harness sets the address and port)."""
    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
                                rank=rank, world_size=size)


def wrap(spec: MethodSpec, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
         total_steps: int) -> tuple[DistributedDataParallel, pt.ddp.PacTrainHookState | None]:
    """``model`` in DDP with ``spec``'s comm hook; PacTrain's hook state (its ``stats()``), else None."""
    one_bucket = {"bucket_cap_mb": one_bucket_mb(model)} if spec.kind == "powersgd" else {}
    ddp = DistributedDataParallel(model, **one_bucket)
    if spec.kind == "dense":
        return ddp, None
    if spec.kind == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
        return ddp, None
    if spec.kind == "average":  # gradients stay local; ``trainer`` averages the parameters
        ddp.register_comm_hook(None, noop_hook)
        return ddp, None
    if spec.kind == "powersgd":
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=spec.rank,
                                            start_powerSGD_iter=POWERSGD_START_ITER,
                                            min_compression_rate=POWERSGD_MIN_COMPRESSION_RATE)
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        return ddp, None
    if spec.kind == "pactrain":
        values = "fp16" if spec.fp16_values else spec.packed_values
        state = pt.ddp.PacTrainHookState(ddp, optimizer, sparsity=spec.sparsity, packed_values=values,
                                         **pruning_schedule(spec, total_steps))
        # fp16 and ternary: dense buckets in fp16 too, as the Horovod methods' Compression.fp16 sends dense tensors
        hook = pt.ddp.pactrain_hook if values == "inherit" else default_hooks.fp16_compress_wrapper(pt.ddp.pactrain_hook)
        ddp.register_comm_hook(state, hook)
        return ddp, state
    raise ValueError(f"no DDP method of kind {spec.kind!r}")


def trainer(spec: MethodSpec, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """What steps ``spec``'s DDP model: ``optimizer``, or for model averaging torch's optimizer that averages the
    parameters every ``spec.sync_every`` steps after the update."""
    if spec.kind != "average":
        return optimizer
    return PostLocalSGDOptimizer(optimizer, PeriodicModelAverager(period=spec.sync_every, warmup_steps=0))
