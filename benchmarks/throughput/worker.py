"""One rank of one benchmark cell; the harness starts it inside the rank's network namespace.

    ip netns exec ptb-<pid>-w0 env HOROVOD_RANK=0 ... python -m benchmarks.throughput.worker \\
        --model resnet18 --method pactrain-0.9-fp16 --batch-size 16 --out rank0.json

Or, with ``--compute-only``, the compute bound: one process, no Horovod, the plain torch
optimizer. Every rank writes its own JSON: per-step phase times, the NIC's kernel byte
counters over the timed steps, and the bytes it handed to Horovod per step. ``ddp-`` methods
train through torch DDP and its comm hooks (``ddp_methods.py``), whose all-reduces DDP waits
for inside ``backward()``: their comm wait is part of the compute phase (``comm_in_backward``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

import horovod.torch as hvd
import torch
from horovod.torch.compression import FP16Compressor

import pactrain_hvd.torch as pt
from benchmarks.baselines.baselines import (
    DGCDistributedOptimizer,
    PowerSGDDistributedOptimizer,
    RandomKDistributedOptimizer,
    TopKDistributedOptimizer,
)
from benchmarks.common import ddp_methods
from benchmarks.common.methods import MethodSpec, parse_method, pruning_schedule
from benchmarks.common.models import build, loss_fn, synthetic_batch
from benchmarks.common.nic import counter_delta, nic_counters, tx_bytes
from benchmarks.common.timing import PhaseClock, StepTimes, instrument
from benchmarks.throughput.arguments import worker_arguments
from pactrain_hvd.torch.compression import PacTrainCompressor

LEARNING_RATE = 0.01
MOMENTUM = 0.9


def make_distributed_optimizer(spec: MethodSpec, optimizer: torch.optim.Optimizer, model: torch.nn.Module,
                               clock: PhaseClock, total_steps: int | None = None, clip_norm: float = 0.0):
    """The method's distributed optimizer, with its compression code timed by ``clock``.

    Every method is built with Horovod's defaults (fusion threshold, cycle time) unchanged. PacTrain
    prunes once at step 0 (the throughput benchmark measures the steady state), or with
    ``total_steps`` gradually over the run, as a user would (``total_steps=``).
    """
    if spec.frontend != "horovod":
        raise ValueError(f"method {spec.name!r} runs on DDP: ddp_methods.wrap builds it")
    named = list(model.named_parameters())
    if spec.kind == "dense":
        return hvd.DistributedOptimizer(optimizer, named_parameters=named, compression=hvd.Compression.none)
    if spec.kind == "fp16":
        instrument(FP16Compressor, ("compress", "decompress"), clock)
        return hvd.DistributedOptimizer(optimizer, named_parameters=named, compression=hvd.Compression.fp16)
    if spec.kind == "topk":
        return TopKDistributedOptimizer(optimizer, named, density=spec.density, clock=clock)
    if spec.kind == "dgc":
        return DGCDistributedOptimizer(optimizer, named, density=spec.density, total_steps=total_steps or 1,
                                       clip_norm=clip_norm, clock=clock)
    if spec.kind == "randomk":
        return RandomKDistributedOptimizer(optimizer, named, density=spec.density, clock=clock)
    if spec.kind == "powersgd":
        return PowerSGDDistributedOptimizer(optimizer, named, rank=spec.rank, clock=clock)
    if spec.kind == "pactrain":
        instrument(PacTrainCompressor, ("compress", "decompress"), clock)
        # Ternary's dense-plan tensors (and its dense start) travel as fp16: the cheapest honest setting.
        compression = hvd.Compression.fp16 if spec.fp16_values or spec.quantized_values else hvd.Compression.none
        return pt.DistributedOptimizer(optimizer, named_parameters=named, compression=compression,
                                       sparsity=spec.sparsity, packed_values=spec.packed_values,
                                       sync_every=spec.sync_every, **pruning_schedule(spec, total_steps))
    if spec.kind == "diloco":  # nothing pruned: every coordinate of the outer gradient travels
        return pt.DistributedOptimizer(optimizer, named_parameters=named, sparsity=0.0, sync_every=spec.sync_every,
                                       compression=hvd.Compression.fp16 if spec.fp16_values else hvd.Compression.none)
    raise ValueError(f"no distributed optimizer for method kind {spec.kind!r}")


def payload_bytes(spec: MethodSpec, distributed, model: torch.nn.Module) -> dict[str, int]:
    """Bytes this rank hands to Horovod (DDP methods: to ``dist.all_reduce``) per step, as the method accounts them."""
    if spec.frontend == "ddp" and spec.kind == "powersgd":
        return {"allreduce_bytes": ddp_methods.powersgd_bytes(model, spec.rank), "allgather_bytes": 0}
    if spec.kind in ("dense", "fp16"):
        element = 2 if spec.fp16_values else 4
        return {"allreduce_bytes": sum(p.numel() * element for p in model.parameters() if p.requires_grad),
                "allgather_bytes": 0}
    if spec.kind in ("pactrain", "diloco"):
        return {"allreduce_bytes": int(distributed.stats()["sent_bytes"]), "allgather_bytes": 0}
    return distributed.payload()


def train_step(compute_loss: Callable[[], torch.Tensor], optimizer, clock: PhaseClock, distributed: bool,
               device: str = "", before_update: Callable[[], None] | None = None
               ) -> tuple[StepTimes, float, dict | None]:
    """Forward (``compute_loss``), backward, (synchronize), ``before_update`` (e.g. clipping), update, timed.

    With ``device``, also the bytes the NIC sent during the forward pass: no method has a
    tensor in flight then, so that is Horovod's control traffic (its background loop
    coordinates every cycle, 1 ms by default) under the step's own CPU load.
    """
    clock.take()
    start = time.perf_counter()
    tx_start = tx_bytes(device) if device else 0
    optimizer.zero_grad()
    loss = compute_loss()
    forward_window = {"seconds": time.perf_counter() - start, "tx_bytes": tx_bytes(device) - tx_start} if device else None
    loss.backward()
    backward_done = time.perf_counter()
    compress_in_backward = clock.take()
    if distributed:
        optimizer.synchronize()
        synchronized = time.perf_counter()
        compress_in_synchronize = clock.take()
    else:
        synchronized, compress_in_synchronize = backward_done, 0.0
    if before_update:
        before_update()
    with optimizer.skip_synchronize() if distributed else contextlib.nullcontext():
        optimizer.step()
    updated = time.perf_counter()
    times = StepTimes.from_marks(start, backward_done, synchronized, updated, compress_in_backward, compress_in_synchronize)
    return times, float(loss.detach()), forward_window


def run(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    spec = None if args.compute_only else parse_method(args.method)
    rank, size = 0, 1
    if spec is not None:
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
    torch.manual_seed(args.seed)
    model = build(args.model)
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE, momentum=MOMENTUM)
    clock = PhaseClock()
    on_ddp = spec is not None and spec.frontend == "ddp"  # then comm ends inside backward(), no synchronize()
    distributed, forward = None, model  # distributed: Horovod's optimizer, or DDP's hook state (PacTrain's) or None
    if on_ddp:  # DDP broadcasts rank 0's parameters itself
        ddp_methods.join(rank, size)
        forward, distributed = ddp_methods.wrap(spec, model, optimizer, total_steps=None)
    elif spec is not None:
        distributed = make_distributed_optimizer(spec, optimizer, model, clock)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    generator = torch.Generator().manual_seed(args.seed * 1000 + rank)
    inputs, targets = synthetic_batch(args.model, args.batch_size, generator)
    synchronizes = spec is not None and not on_ddp
    compute_loss = lambda: loss_fn(args.model, forward(inputs), targets)  # noqa: E731
    step_optimizer = distributed if synchronizes else optimizer

    def fence() -> None:
        if spec is not None:
            hvd.allreduce(torch.zeros(1), name="bench.fence")

    device = args.device if spec is not None else ""
    losses, steps, forward_windows = [], [], []
    warmup = max(args.warmup, ddp_methods.settle_steps(spec)) if on_ddp else args.warmup  # time the steady state
    for _ in range(warmup):
        losses.append(train_step(compute_loss, step_optimizer, clock, synchronizes)[1])
    fence()
    before = nic_counters(args.device) if device else None
    for _ in range(args.steps):
        times, loss, window = train_step(compute_loss, step_optimizer, clock, synchronizes, device)
        steps.append(times.__dict__)
        losses.append(loss)
        forward_windows.append(window)
    fence()
    after = nic_counters(args.device) if device else None

    record = {
        "rank": rank, "size": size, "model": args.model, "method": args.method if spec else "compute-only",
        "comm_in_backward": on_ddp,
        "batch_size": args.batch_size, "threads": torch.get_num_threads(), "warmup": warmup,
        "parameters": sum(p.numel() for p in model.parameters()),
        "steps": steps, "losses": losses,
        "nic": {"device": args.device, **counter_delta(before, after)} if before else None,
        "control_tx_bytes_per_s": (sum(w["tx_bytes"] for w in forward_windows) / sum(w["seconds"] for w in forward_windows)
                                   if device else None),
        "payload": payload_bytes(spec, distributed, model) if spec else None,
        "python": platform.python_version(), "torch": torch.__version__,
        "horovod_env": {k: v for k, v in os.environ.items() if k.startswith("HOROVOD_")},
    }
    if spec is not None and spec.kind == "pactrain" and spec.frontend == "horovod" and rank == 0:
        record["pactrain_stats"] = distributed.stats()
    return record


def main(argv: list[str] | None = None) -> None:
    args = worker_arguments(__doc__, "dense", argv)
    record = run(args)
    Path(args.out).write_text(json.dumps(record))
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    if record["size"] > 1:
        hvd.shutdown()


if __name__ == "__main__":
    sys.exit(main())
