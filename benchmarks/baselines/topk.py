"""Top-k (DGC, Lin et al. 2018; GRACE ``topk``): the compressor, and the optimizer that allgathers its
values and indices from the gradient hook.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import horovod.torch as hvd
import torch
from horovod.torch.mpi_ops import allreduce_async_, synchronize

from benchmarks.baselines.communicator import AllgatherCommunicator
from benchmarks.baselines.memory import ResidualMemory
from benchmarks.baselines.optimizer import WrappedOptimizer
from benchmarks.common.timing import PhaseClock
from pactrain_hvd.core.plan import DEFAULT_MIN_NUMEL


class TopKCompressor:
    """Keep the ``k = ceil(density * numel)`` largest magnitudes: values and int32 flat indices.

    The set is exactly ``torch.topk``'s, found the way DGC does it (Lin et al. 2018, sec. 3.1):
    a threshold estimated on a random sample (at twice the density, so that at least k
    coordinates pass it in all but vanishing cases) selects a few k candidates, and the exact
    top-k is taken among those. On one CPU thread that is ~5x faster than ``torch.topk`` on
    the whole tensor; if fewer than k pass, the full ``torch.topk`` runs instead.

    Example::

        >>> values, indices = TopKCompressor(0.01).compress(flat_gradient)
        >>> dense = TopKCompressor.decompress(values, indices, flat_gradient.numel())
    """

    SAMPLE_FRACTION = 0.01
    MIN_SAMPLED_NUMEL = 100_000  # below this a direct torch.topk is as fast

    def __init__(self, density: float = 0.01, seed: int = 0) -> None:
        if not 0 < density <= 1:
            raise ValueError(f"density must be in (0, 1], got {density}")
        self.density = density
        self.generator = torch.Generator().manual_seed(seed)

    def k(self, numel: int) -> int:
        return max(1, math.ceil(self.density * numel))

    def _candidates(self, magnitudes: torch.Tensor, k: int) -> torch.Tensor | None:
        """Indices of a superset of the top-k, or None when the sampled threshold let too few through."""
        numel = magnitudes.numel()
        sample = magnitudes[torch.randint(0, numel, (int(numel * self.SAMPLE_FRACTION),), generator=self.generator)]
        threshold = torch.topk(sample, min(sample.numel(), max(1, math.ceil(2 * k / numel * sample.numel()))),
                               sorted=False).values.min()
        candidates = (magnitudes >= threshold).nonzero().squeeze(1)
        return candidates if candidates.numel() >= k else None

    def select(self, flat: torch.Tensor) -> torch.Tensor:
        """Flat indices of the k largest magnitudes (int64, unordered)."""
        k = self.k(flat.numel())
        magnitudes = flat.abs()
        candidates = self._candidates(magnitudes, k) if flat.numel() >= self.MIN_SAMPLED_NUMEL and k < flat.numel() else None
        if candidates is None:
            return torch.topk(magnitudes, k, sorted=False).indices
        return candidates.index_select(0, torch.topk(magnitudes.index_select(0, candidates), k, sorted=False).indices)

    def compress(self, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        indices = self.select(flat)
        return flat.index_select(0, indices), indices.to(torch.int32)

    @staticmethod
    def decompress(values: torch.Tensor, indices: torch.Tensor, numel: int, out: torch.Tensor | None = None) -> torch.Tensor:
        """Sum of the (possibly gathered, possibly overlapping) pairs as a dense flat tensor."""
        dense = torch.zeros(numel, dtype=values.dtype) if out is None else out.zero_()
        return dense.index_add_(0, indices.long(), values)


class TopKDistributedOptimizer(WrappedOptimizer):
    """Top-k sparsification with error feedback, exchanged by allgather (DGC / GRACE design).

    Example::

        >>> opt = TopKDistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
        ...                                model.named_parameters(), density=0.01)
        >>> loss.backward(); opt.step()
    """

    def __init__(self, optimizer: torch.optim.Optimizer, named_parameters: Iterable[tuple[str, torch.Tensor]],
                 density: float = 0.01, min_compress_numel: int = DEFAULT_MIN_NUMEL, clock: PhaseClock | None = None) -> None:
        super().__init__(optimizer, named_parameters, clock)
        self.compressor = TopKCompressor(density)
        self.memory = ResidualMemory()
        self.communicator = AllgatherCommunicator()
        self.compressed = {name for name, p in self.trainable() if p.numel() >= min_compress_numel}
        self._handles: dict[torch.Tensor, object] = {}
        for _, p in self.trainable():
            p.register_post_accumulate_grad_hook(self._start)

    def _start(self, p: torch.Tensor) -> None:
        name = self.names[p]
        if name not in self.compressed:
            self._handles[p] = allreduce_async_(p.grad, name=f"topk.dense.{name}", op=hvd.Average)
            return
        with self.clock.measure():
            compensated = self.memory.compensate(name, p.grad)
            values, indices = self.compressor.compress(compensated)
            self.memory.forget_at(name, indices)
        self._handles[p] = self.communicator.start(name, values, indices)

    def synchronize(self) -> None:
        self.start_missing(self._handles, self._start)
        size = hvd.size()
        for p, handle in self._handles.items():
            if self.names[p] not in self.compressed:
                synchronize(handle)
                continue
            values, indices = self.communicator.wait(handle)
            with self.clock.measure():
                self.compressor.decompress(values.div_(size), indices, p.numel(), out=p.grad.view(-1))
        self._handles.clear()

    def payload(self) -> dict[str, int]:
        """Bytes this rank hands to Horovod per step: all-reduced (dense tensors) and allgathered (pairs)."""
        gathered = sum(self.compressor.k(self.parameters[name].numel()) * 8 for name in self.compressed)
        dense = sum(p.numel() * p.element_size() for name, p in self.trainable() if name not in self.compressed)
        return {"allreduce_bytes": dense, "allgather_bytes": gathered}
