"""Measurements the step-time model needs, taken on this machine (one process, no Horovod).

    python -m benchmarks.model.step_time_model profile      # writes reports/step_model/profile.json

- **Gradient-ready times**: a real forward + backward of a benchmark model at its batch size
  (or of a time-to-accuracy workload: its model, a real batch, its loss and optimizer), with a ``register_post_accumulate_grad_hook`` timestamp on every parameter; each
  tensor's ready time is kept as the fraction of backward elapsed (median over steps).
- **How Top-k's and PowerSGD's compression splits** around their collectives (the results
  give only the total): Top-k's selection (in hooks) vs. its dense zeroing and its
  ``index_add`` of one worker's pairs (after the allgather: once per worker); PowerSGD's P
  projection, orthonormalisation + Q projection, and reconstruction.
- **FLOPs** per sample (``torch.utils.flop_counter``, forward + backward) of the models and of
  the ImageNet ResNet-18 whose published GPU step time scales compute to GPU class.
- **Host copy rate** (the fusion-buffer copies of a CPU all-reduce).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from benchmarks.baselines.baselines import PowerSGDCompressor, ResidualMemory, TopKCompressor
from benchmarks.common.models import BasicBlock, build, loss_fn, synthetic_batch
from benchmarks.micro.micro_pack import median_seconds
from pactrain_hvd.core.plan import DEFAULT_MIN_NUMEL


def gradient_ready_profile(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor,
                           loss_of: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                           optimizer: torch.optim.Optimizer, steps: int = 3, warmup: int = 1) -> dict:
    """Forward, backward and update seconds, and every parameter's ready time as a fraction of backward."""
    names = {p: name for name, p in model.named_parameters() if p.requires_grad}
    stamps: dict[str, float] = {}
    handles = [p.register_post_accumulate_grad_hook(lambda p: stamps.__setitem__(names[p], time.perf_counter()))
               for p in names]
    runs = []
    for step in range(warmup + steps):
        stamps.clear()
        optimizer.zero_grad(set_to_none=True)
        start = time.perf_counter()
        loss = loss_of(model(inputs), targets)
        backward_start = time.perf_counter()
        loss.backward()
        backward_end = time.perf_counter()
        optimizer.step()
        updated = time.perf_counter()
        if step >= warmup:
            span = backward_end - backward_start
            runs.append({"forward_s": backward_start - start, "backward_s": span, "update_s": updated - backward_end,
                         "fractions": {name: (stamps[name] - backward_start) / span for name in stamps}})
    for handle in handles:
        handle.remove()
    tensors = [{"name": name, "shape": list(p.shape),
                "ready_fraction": statistics.median(r["fractions"][name] for r in runs)}
               for p, name in names.items()]
    tensors.sort(key=lambda t: t["ready_fraction"])
    return {"batch_size": len(inputs), "threads": torch.get_num_threads(),
            **{key: statistics.median(r[key] for r in runs) for key in ("forward_s", "backward_s", "update_s")},
            "tensors": tensors}


def model_profile(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor,
                  loss_of: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], optimizer: torch.optim.Optimizer) -> dict:
    """What the step model needs of one model: gradient-ready times and Top-k's and PowerSGD's CPU splits."""
    return {**gradient_ready_profile(model, inputs, targets, loss_of, optimizer),
            "topk": topk_costs(model), "powersgd": powersgd_costs(model)}


def bench_model_profile(model_name: str, batch_size: int) -> dict:
    """A throughput-benchmark model: synthetic batch, SGD with momentum (as ``worker.py``)."""
    torch.manual_seed(0)
    model = build(model_name)
    inputs, targets = synthetic_batch(model_name, batch_size, torch.Generator().manual_seed(0))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    return {"model": model_name, "flops_per_sample": training_flops_per_sample(model_name),
            **model_profile(model, inputs, targets, lambda out, t: loss_fn(model_name, out, t), optimizer)}


def workload_profile(workload: str) -> dict:
    """A time-to-accuracy workload (``tta_worker.py``): its model, a real batch, its loss and optimizer."""
    from types import SimpleNamespace

    from benchmarks.tta import tta_worker

    torch.manual_seed(0)
    settings = SimpleNamespace(workload=workload, batch_size=None, eval_samples=500, eval_batches=1, seed=1)
    job = tta_worker.build_workload(settings, rank=0, size=1)
    inputs, targets = job.next_batch()
    return {"workload": workload, "parameters": sum(p.numel() for p in job.model.parameters()),
            **model_profile(job.model, inputs, targets, job.loss, job.make_optimizer(job.model, 1))}


def topk_costs(model: nn.Module, density: float = 0.01, repeats: int = 5) -> dict:
    """Top-k's selection (per step, in hooks), its dense zeroing, and one worker's ``index_add``."""
    compressor, memory = TopKCompressor(density), ResidualMemory()
    grads = {name: torch.randn(p.shape) for name, p in model.named_parameters()
             if p.numel() >= DEFAULT_MIN_NUMEL}
    picked = {name: compressor.compress(g.reshape(-1)) for name, g in grads.items()}
    outs = {name: torch.empty(g.numel()) for name, g in grads.items()}

    def select() -> None:
        for name, g in grads.items():
            values, indices = compressor.compress(memory.compensate(name, g))
            memory.forget_at(name, indices)

    def zero() -> None:
        for out in outs.values():
            out.zero_()

    def scatter_one_worker() -> None:
        for name, (values, indices) in picked.items():
            outs[name].index_add_(0, indices.long(), values)

    return {"select_s": median_seconds(select, repeats), "zero_s": median_seconds(zero, repeats),
            "scatter_per_worker_s": median_seconds(scatter_one_worker, repeats)}


def powersgd_costs(model: nn.Module, rank: int = 4, repeats: int = 5) -> dict:
    """PowerSGD's three CPU phases: P = M Q (with error feedback), orthonormalise + Q = M^T P, P Q^T."""
    compressor = PowerSGDCompressor(rank)
    shapes = {name: compressor.matrix_shape(p.shape) for name, p in model.named_parameters()
              if compressor.compressible(p.shape)}
    grads = {name: torch.randn(shape) for name, shape in shapes.items()}
    memory = ResidualMemory()
    generator = torch.Generator().manual_seed(0)
    q_ts = [compressor.initial_q_t(cols, generator) for _, cols in shapes.values()]
    flat_p = torch.empty(sum(rows * rank for rows, _ in shapes.values()))
    flat_q = torch.empty(sum(cols * rank for _, cols in shapes.values()))
    state: dict = {}

    def project_p() -> None:
        state["m"] = [memory.compensate(name, g).view(shapes[name]) for name, g in grads.items()]
        state["p"] = compressor.project_p(state["m"], q_ts, flat_p)

    def project_q() -> None:
        for p in state["p"]:
            compressor.orthonormalize_(p)
        state["q"] = compressor.project_q(state["m"], state["p"], flat_q)

    outs = {name: torch.empty(shape) for name, shape in shapes.items()}

    def reconstruct() -> None:
        for name, p, q_t in zip(grads, state["p"], state["q"]):
            torch.matmul(p, q_t, out=outs[name])
            memory.subtract(name, outs[name])

    project_p()
    project_q()
    return {"project_p_s": median_seconds(project_p, repeats), "project_q_s": median_seconds(project_q, repeats),
            "reconstruct_s": median_seconds(reconstruct, repeats)}


class ImageNetResNet18(nn.Module):
    """torchvision's ResNet-18 layout (7x7/2 stem, max-pool, 1000 classes) from our blocks: FLOPs only."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        layers, inplanes = [], 64
        for planes, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers += [BasicBlock(inplanes, planes, stride), BasicBlock(planes, planes)]
            inplanes = planes
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(512, 1000)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def training_flops_per_sample(model_name: str, batch_size: int = 2) -> float:
    """FLOPs of forward + backward per sample (a multiply-add counts 2)."""
    if model_name == "imagenet-resnet18":
        model, inputs = ImageNetResNet18(), torch.randn(batch_size, 3, 224, 224)
        targets = torch.randint(0, 1000, (batch_size,))
        loss_of = lambda out: nn.functional.cross_entropy(out, targets)  # noqa: E731
    else:
        model = build(model_name)
        inputs, targets = synthetic_batch(model_name, batch_size)
        loss_of = lambda out: loss_fn(model_name, out, targets)  # noqa: E731
    counter = FlopCounterMode(display=False)
    with counter:
        loss_of(model(inputs)).backward()
    return counter.get_total_flops() / batch_size


def copy_bytes_per_s(nbytes: int = 64 * 1024 * 1024, repeats: int = 5) -> float:
    """One pass of a large buffer copy, bytes per second."""
    source, target = torch.randn(nbytes // 4), torch.empty(nbytes // 4)
    return nbytes / median_seconds(lambda: target.copy_(source), repeats)
