"""One rank of one time-to-accuracy run: real training of a representative workload with one method.

    ip netns exec ptb-<pid>-w0 env HOROVOD_RANK=0 ... python -m benchmarks.tta.tta_worker \\
        --workload image --method pactrain-0.9-fp16 --steps 400 --eval-every 50 --out rank0.json

The workloads are the accuracy report's (``benchmarks/accuracy/accuracy.py``): the models, data and evaluation
of ``examples/pytorch_fashion_mnist.py --model vgg`` and of the 5 M-parameter char-GPT of
``examples/pytorch_char_lm.py``, imported from those files so that there is one definition of each.
Every method gets the same seed, data order, optimizer and cosine learning rate over ``--steps``;
PacTrain prunes with ``total_steps=--steps``. Evaluation every ``--eval-every`` steps is excluded
from the training clock; ``--budget-s`` ends a run at the first evaluation past that much training
time (a slow method on a slow link then does fewer steps of the same schedule). ``ddp-`` methods
train in torch DDP (``ddp_methods.py``); Horovod still evaluates. ``--compute-only``: one process,
no Horovod, the plain optimizer (the bound). Rank 0 writes the curve: (training seconds, step,
metric, this rank's NIC bytes sent).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import horovod.torch as hvd
import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from benchmarks.common import ddp_methods
from benchmarks.common.examples import example
from benchmarks.common.methods import parse_method
from benchmarks.common.nic import tx_counter
from benchmarks.common.timing import PhaseClock
from benchmarks.throughput.worker import make_distributed_optimizer, train_step
from benchmarks.tta.worker_arguments import parse_args
from example_support.data import (
    CharVocab,
    load_bible_text,
    load_fashion_mnist,
    random_windows,
    split_tokens,
)

GPT_SIZE = {"embed_dim": 320, "layers": 4, "heads": 4, "block_size": 128}  # benchmarks/accuracy/accuracy.py's language task


@dataclass
class Workload:
    model: torch.nn.Module
    make_optimizer: Callable[[torch.nn.Module, int], torch.optim.Optimizer]  # (model, world size)
    next_batch: Callable[[], tuple[torch.Tensor, torch.Tensor]]  # this rank's next training batch
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    evaluate: Callable[[str], float]  # the held-out metric over all ranks (a Horovod collective)
    metric: str
    samples_per_step: int  # per worker
    lr_factor: Callable[[int], Callable[[int], float]] = lambda steps: (  # steps -> LambdaLR factor; default cosine to 0
        lambda step: 0.5 * (1 + math.cos(math.pi * step / steps)))
    clip_norm: float = 0.0  # clip the averaged gradient's norm (0: off)
    global_batch: Callable[[], tuple[torch.Tensor, torch.Tensor]] | None = None  # the same on every rank


def image(batch_size: int, eval_samples: int, rank: int, size: int, data_seed: int = 0) -> Workload:
    fashion = example("pytorch_fashion_mnist")
    images, labels = load_fashion_mnist("train")
    train = TensorDataset(torch.from_numpy(images).unsqueeze(1), torch.from_numpy(labels))
    sampler = DistributedSampler(train, num_replicas=size, rank=rank, shuffle=True, seed=data_seed)
    loader = DataLoader(train, batch_size=batch_size, sampler=sampler, drop_last=True)
    images, labels = load_fashion_mnist("test")
    test = TensorDataset(torch.from_numpy(images[:eval_samples]).unsqueeze(1), torch.from_numpy(labels[:eval_samples]))
    test_loader = DataLoader(test, batch_size=500, sampler=DistributedSampler(test, size, rank, shuffle=False))
    state = {"epoch": 0, "batches": iter(())}
    model = fashion.FashionVGG()
    # Every rank draws the same global batches (batch_size x size) from its own seeded generator.
    same_everywhere = iter(DataLoader(train, batch_size=batch_size * size, shuffle=True, drop_last=True,
                                      generator=torch.Generator().manual_seed(data_seed + 1)))

    def next_batch() -> tuple[torch.Tensor, torch.Tensor]:
        batch = next(state["batches"], None)
        if batch is None:
            state["epoch"] += 1
            sampler.set_epoch(state["epoch"])
            state["batches"] = iter(loader)
            batch = next(state["batches"])
        return fashion.to_device(*batch, torch.device("cpu"))

    def evaluate(name: str) -> float:
        return fashion.evaluate(model, test_loader, torch.device("cpu"), name)[1]

    lr = 0.05 * batch_size / 64  # per worker: 0.1 for the global batch of 2 x 64
    return Workload(model, lambda m, n: torch.optim.SGD(m.parameters(), lr=lr * n, momentum=0.9, weight_decay=5e-4),
                    next_batch, torch.nn.functional.cross_entropy, evaluate, "test_accuracy", batch_size,
                    global_batch=lambda: fashion.to_device(*next(same_everywhere), torch.device("cpu")))


def language_model(vocabulary: int | None = None) -> torch.nn.Module:
    """The language workload's char-GPT (5.0 M parameters); with no argument sized to the text's vocabulary,
    as ``python -m pactrain_hvd.planner --model benchmarks/tta/tta_worker.py:language_model`` builds it."""
    if vocabulary is None:
        vocabulary = CharVocab.from_text(load_bible_text()).size
    return example("pytorch_char_lm").CharGPT(vocabulary, GPT_SIZE["block_size"], GPT_SIZE["embed_dim"],
                                              GPT_SIZE["layers"], GPT_SIZE["heads"])


def language(batch_size: int, eval_batches: int, rank: int, size: int, seed: int) -> Workload:
    lm = example("pytorch_char_lm")
    text = load_bible_text()
    vocab = CharVocab.from_text(text)
    train_ids, val_ids = split_tokens(vocab.encode(text), val_fraction=0.1)
    rng = np.random.default_rng([seed, rank])
    block = GPT_SIZE["block_size"]
    model = language_model(vocab.size)

    def next_batch() -> tuple[torch.Tensor, torch.Tensor]:
        inputs, targets = random_windows(train_ids, batch_size, block, rng)
        return torch.from_numpy(inputs), torch.from_numpy(targets)

    def evaluate(name: str) -> float:
        settings = SimpleNamespace(batch_size=batch_size, block_size=block, val_batches=eval_batches)
        return lm.evaluate(model, val_ids, settings, torch.device("cpu"), name)[1]

    defaults = lm.parse_args([])  # the example's recipe: optimizer, warm-up then cosine, clipping
    return Workload(model, lambda m, n: lm.make_optimizer(m, defaults.lr, defaults.weight_decay), next_batch,
                    lm.next_token_loss, evaluate, "val_perplexity", batch_size,
                    lambda steps: lm.warmup_cosine(steps, lm.default_warmup(steps)), defaults.clip_norm)


def build_workload(args: argparse.Namespace, rank: int, size: int) -> Workload:
    if args.workload == "image":
        return image(args.batch_size or 64, args.eval_samples, rank, size, args.data_seed)
    return language(args.batch_size or 16, args.eval_batches, rank, size, args.seed)


def past_budget(train_s: float, budget_s: float) -> bool:
    """Rank 0's verdict, so that every rank stops after the same step (a broadcast per evaluation, off the clock)."""
    verdict = torch.tensor([float(train_s >= budget_s)])
    return bool(hvd.broadcast(verdict, root_rank=0, name="tta.budget")[0])


def train_alike(workload: Workload, optimizer: torch.optim.Optimizer, steps: int) -> float:
    """``steps`` uncommunicated steps that every rank takes alike, on the same global batches: the weights
    stay identical across ranks (deterministic kernels), so masks ranked afterwards come from trained weights
    at no cost on the link. Returns the seconds it took (part of the training clock)."""
    if workload.global_batch is None:
        raise ValueError("--method ...-localSTEPS: this workload has no global batches; use the image workload")
    started = time.perf_counter()
    for _ in range(steps):
        inputs, targets = workload.global_batch()
        optimizer.zero_grad()
        workload.loss(workload.model(inputs), targets).backward()
        optimizer.step()
    optimizer.zero_grad()
    return time.perf_counter() - started


def broadcast_unless_identical(model: torch.nn.Module) -> bool:
    """Horovod's start-up broadcast, skipped when every rank's seeded initialisation is already identical.

    Gloo broadcasts from rank 0 to every other rank; at 2 Mbit/s and 8 workers the 17 MB of FashionVGG
    hold rank 0's NIC for minutes. A digest of each rank's weights proves the broadcast would change nothing.
    """
    digest = hashlib.sha256(b"".join(t.detach().cpu().numpy().tobytes() for t in model.state_dict().values()))
    differ = len(set(hvd.allgather_object(digest.hexdigest()))) > 1
    if differ:
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    return differ


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    args = parse_args(argv, doc=__doc__)
    torch.set_num_threads(args.threads)
    if not args.compute_only:
        hvd.init()
    rank, size = (hvd.rank(), hvd.size()) if not args.compute_only else (0, 1)
    torch.manual_seed(args.seed)
    workload = build_workload(args, rank, size)
    model = workload.model
    optimizer = workload.make_optimizer(model, size)
    # The same schedule for every method over the step budget (set on the plain optimizer, whose param groups
    # every wrapper shares).
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, workload.lr_factor(args.steps))
    spec = parse_method(args.method)
    trainer, forward, reporter = optimizer, model, None  # reporter: what has PacTrain's stats()
    local_s, broadcast = 0.0, False
    clock = PhaseClock()
    if spec.frontend == "ddp" and not args.compute_only:  # Horovod still evaluates; DDP trains
        ddp_methods.join(rank, size)
        forward, reporter = ddp_methods.wrap(spec, model, optimizer, args.steps)
        trainer = ddp_methods.trainer(spec, optimizer)
    elif not args.compute_only:
        local_s = train_alike(workload, optimizer, spec.local_steps) if spec.local_steps else 0.0
        trainer = reporter = make_distributed_optimizer(spec, optimizer, model, clock, total_steps=args.steps,
                                                        clip_norm=workload.clip_norm)
        broadcast = broadcast_unless_identical(model)
    tx = tx_counter(args.device)
    tx_start, train_s, curve, step_s, losses = tx(), local_s, [], [], []
    handed, packed = [], []  # per step, PacTrain only
    eval_elapsed_s, eval_s = [], []  # seconds since this process started at the end of each evaluation; its cost
    phases: dict[str, list[float]] = {name: [] for name in ("compute", "compress", "comm_wait", "update")}  # per step
    synchronizes = hasattr(trainer, "synchronize")  # Horovod's optimizer: synchronize(), then step
    clip = ((lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), workload.clip_norm))
            if workload.clip_norm and spec.kind != "dgc" else None)  # DGC clips each worker's gradient instead

    def compute_loss() -> torch.Tensor:
        inputs, targets = workload.next_batch()
        return workload.loss(forward(inputs), targets)

    for step in range(1, args.steps + 1):
        times, loss, _ = train_step(compute_loss, trainer, clock, synchronizes, before_update=clip)
        scheduler.step()
        if hasattr(reporter, "stats"):  # PacTrain: what this step handed to the collective, and how many tensors packed
            step_stats = reporter.stats()
            handed.append(int(step_stats["sent_bytes"]))
            packed.append(sum(1 for t in step_stats["tensors"].values() if t["packed"]))
        step_s.append(times.total)
        train_s += step_s[-1]
        losses.append(loss)
        for name, series in phases.items():
            series.append(getattr(times, name))
        if not args.compute_only and (step % args.eval_every == 0 or step == args.steps):
            evaluated = time.perf_counter()
            metric = workload.evaluate(f"tta.eval.{step}")
            model.train()
            eval_s.append(time.perf_counter() - evaluated)
            curve.append([train_s, step, metric, tx() - tx_start])
            eval_elapsed_s.append(time.perf_counter() - started)
            if rank == 0:
                print(f"step {step}: {workload.metric} {metric:.4f} after {train_s:.1f} s of training", flush=True)
            if args.budget_s and past_budget(train_s, args.budget_s):
                break
    stats = reporter.stats() if hasattr(reporter, "stats") else None
    record = {"workload": args.workload, "method": args.method, "metric": workload.metric, "rank": rank, "size": size,
              "steps": len(step_s), "planned_steps": args.steps, "budget_s": args.budget_s,
              "batch_size": workload.samples_per_step, "seed": args.seed, "curve": curve,
              "step_s": step_s, "phases_s": phases, "train_s": train_s, "losses": losses[:: max(1, len(losses) // 50)],
              "parameters": sum(p.numel() for p in model.parameters()),
              "sparsity": stats["sparsity"] if stats else 0.0, "compute_only": args.compute_only,
              "handed_bytes": handed, "packed_tensors": packed, "local_steps": spec.local_steps, "local_s": local_s,
              "broadcast": broadcast, "data_seed": args.data_seed, "eval_elapsed_s": eval_elapsed_s, "eval_s": eval_s,
              "elapsed_s": time.perf_counter() - started}
    Path(args.out).write_text(json.dumps(record) + "\n")
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
