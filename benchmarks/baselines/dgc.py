"""Deep Gradient Compression (Lin et al., ICLR 2018) at its paper's best, over Horovod allgather.

Top-k of the locally accumulated gradient, with DGC's four corrections: momentum correction (the
momentum of SGD runs on each worker before selection, the optimizer then steps without it), momentum-factor
masking (a sent coordinate's velocity is cleared with its accumulation), sparsity warm-up (the density falls
exponentially to its target over the first steps) and, where the workload clips, clipping of each worker's
gradient before accumulation (to the clip norm times ``size ** -0.5``). Values travel as fp16 and indices in
the narrowest integer type that holds the tensor's size.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import horovod.torch as hvd
import torch
from horovod.torch.mpi_ops import allgather_async, allreduce_async, synchronize

from benchmarks.baselines.optimizer import WrappedOptimizer
from benchmarks.baselines.topk import TopKCompressor
from benchmarks.common.timing import PhaseClock
from pactrain_hvd.core.plan import DEFAULT_MIN_NUMEL

WARMUP_DENSITIES = (0.25, 0.0625, 0.015625, 0.004)  # DGC's four warm-up stages (75 % ... 99.6 % sparse)
WARMUP_FRACTION = 0.03  # of the run: DGC warms up over 4 of 90-164 epochs


def index_dtype(numel: int) -> torch.dtype:
    """The narrowest signed integer type Horovod moves that holds every flat index of a tensor."""
    return torch.int16 if numel <= 2**15 else torch.int32


def warmup_density(density: float, step: int, warmup_steps: int) -> float:
    """DGC's exponential warm-up: ``WARMUP_DENSITIES`` in equal stages over ``warmup_steps``, never under ``density``."""
    if step >= warmup_steps:
        return density
    return max(density, WARMUP_DENSITIES[step * len(WARMUP_DENSITIES) // warmup_steps])


class DGCDistributedOptimizer(WrappedOptimizer):
    """DGC over Horovod: an SGD optimizer's momentum and weight decay move into the compressor.

    With an optimizer that has no ``momentum`` (Adam), accumulation is plain error feedback.

    Example::

        >>> opt = DGCDistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        ...                               model.named_parameters(), density=0.001, total_steps=600)
        >>> loss.backward(); opt.step()
    """

    def __init__(self, optimizer: torch.optim.Optimizer, named_parameters: Iterable[tuple[str, torch.Tensor]],
                 density: float, total_steps: int, clip_norm: float = 0.0,
                 min_compress_numel: int = DEFAULT_MIN_NUMEL, clock: PhaseClock | None = None) -> None:
        super().__init__(optimizer, named_parameters, clock)
        self.compressor = TopKCompressor(density)
        self.density = density
        self.warmup_steps = max(1, math.ceil(WARMUP_FRACTION * total_steps))
        self.local_clip = clip_norm / math.sqrt(hvd.size()) if clip_norm else 0.0
        group_of = {p: group for group in optimizer.param_groups for p in group["params"]}
        self.momentum = {name: group_of[p].get("momentum", 0.0) for name, p in self.trainable()}
        self.weight_decay = {name: group_of[p].get("weight_decay", 0.0) if "momentum" in group_of[p] else 0.0
                             for name, p in self.trainable()}
        for group in optimizer.param_groups:
            if "momentum" in group:  # applied before selection instead (momentum correction)
                group["momentum"], group["weight_decay"] = 0.0, 0.0
        self.compressed = {name for name, p in self.trainable() if p.numel() >= min_compress_numel}
        self.velocity: dict[str, torch.Tensor] = {}
        self.accumulated: dict[str, torch.Tensor] = {}
        self.steps = 0
        self._handles: dict[torch.Tensor, object] = {}
        for _, p in self.trainable():
            p.register_post_accumulate_grad_hook(self._start)

    def _velocity(self, name: str, p: torch.Tensor) -> torch.Tensor:
        """``u = momentum * u + g + weight_decay * w``: torch SGD's momentum buffer, kept before communication."""
        grad = p.grad.reshape(-1)
        if self.local_clip:
            grad = grad * min(1.0, self.local_clip / (grad.norm().item() + 1e-12))
        if self.weight_decay[name]:
            grad = grad.add(p.detach().reshape(-1), alpha=self.weight_decay[name])
        u = self.velocity.get(name)
        if u is None or not self.momentum[name]:
            u = self.velocity[name] = grad.clone()
        else:
            u.mul_(self.momentum[name]).add_(grad)
        return u

    def _start(self, p: torch.Tensor) -> None:
        name = self.names[p]
        with self.clock.measure():
            u = self._velocity(name, p)
            if name not in self.compressed:
                self._handles[p] = allreduce_async(u, name=f"dgc.dense.{name}", op=hvd.Average)
                return
            v = self.accumulated.setdefault(name, torch.zeros_like(u)).add_(u)
            self.compressor.density = warmup_density(self.density, self.steps, self.warmup_steps)
            indices = self.compressor.select(v)
            values = v.index_select(0, indices).half()
            v.index_fill_(0, indices, 0)
            u.index_fill_(0, indices, 0)  # momentum-factor masking
        self._handles[p] = (allgather_async(values, name=f"dgc.values.{name}"),
                            allgather_async(indices.to(index_dtype(p.numel())), name=f"dgc.indices.{name}"))

    def synchronize(self) -> None:
        self.start_missing(self._handles, self._start)
        size = hvd.size()
        for p, handle in self._handles.items():
            if self.names[p] not in self.compressed:
                p.grad.copy_(synchronize(handle).view_as(p.grad))
                continue
            values, indices = synchronize(handle[0]), synchronize(handle[1])
            with self.clock.measure():
                self.compressor.decompress(values.float().div_(size), indices, p.numel(), out=p.grad.view(-1))
        self._handles.clear()
        self.steps += 1

    def payload(self) -> dict[str, int]:
        """Bytes this rank hands to Horovod per step after the warm-up."""
        gathered = sum(self.compressor.k(self.parameters[name].numel())
                       * (2 + index_dtype(self.parameters[name].numel()).itemsize) for name in self.compressed)
        dense = sum(p.numel() * p.element_size() for name, p in self.trainable() if name not in self.compressed)
        return {"allreduce_bytes": dense, "allgather_bytes": gathered}
