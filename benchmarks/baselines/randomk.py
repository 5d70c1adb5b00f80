"""Random-k on an index set every rank shares: the control for PacTrain's learned mask.

Each step every rank draws the same coordinates (each kept with probability ``density``) from a generator
seeded alike on every rank, so their values are all-reduced as a short dense buffer with no indices, as
PacTrain's survivors are (Stich et al. 2018 with error feedback; SPARTA's shared random subsets). What it
shares with PacTrain is the wire format; what it lacks is a mask chosen by pruning.
"""

from __future__ import annotations

from collections.abc import Iterable

import horovod.torch as hvd
import torch
from horovod.torch.mpi_ops import allreduce_async, synchronize

from benchmarks.baselines.memory import ResidualMemory
from benchmarks.baselines.optimizer import WrappedOptimizer
from benchmarks.common.timing import PhaseClock
from pactrain_hvd.core.plan import DEFAULT_MIN_NUMEL


class RandomKDistributedOptimizer(WrappedOptimizer):
    """Shared Random-k with error feedback, fp16 values, over Horovod all-reduce.

    Example::

        >>> opt = RandomKDistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
        ...                                   model.named_parameters(), density=0.1)
        >>> loss.backward(); opt.step()
    """

    def __init__(self, optimizer: torch.optim.Optimizer, named_parameters: Iterable[tuple[str, torch.Tensor]],
                 density: float, seed: int = 0, min_compress_numel: int = DEFAULT_MIN_NUMEL,
                 clock: PhaseClock | None = None) -> None:
        super().__init__(optimizer, named_parameters, clock)
        if not 0 < density <= 1:
            raise ValueError(f"density must be in (0, 1], got {density}")
        self.density = density
        self.memory = ResidualMemory()
        self.compressed = {name for name, p in self.trainable() if p.numel() >= min_compress_numel}
        # One generator per tensor, seeded by its position: the draws do not depend on the order hooks fire in.
        self.generators = {name: torch.Generator().manual_seed(seed * 100_003 + position)
                           for position, name in enumerate(sorted(self.compressed))}
        self._handles: dict[torch.Tensor, tuple[object, torch.Tensor | None]] = {}
        for _, p in self.trainable():
            p.register_post_accumulate_grad_hook(self._start)

    def draw(self, name: str) -> torch.Tensor:
        """This step's flat indices of tensor ``name``: the same on every rank."""
        numel = self.parameters[name].numel()
        return (torch.rand(numel, generator=self.generators[name]) < self.density).nonzero().squeeze(1)

    def _start(self, p: torch.Tensor) -> None:
        name = self.names[p]
        if name not in self.compressed:
            self._handles[p] = (allreduce_async(p.grad, name=f"randomk.dense.{name}", op=hvd.Average), None)
            return
        with self.clock.measure():
            compensated = self.memory.compensate(name, p.grad)
            indices = self.draw(name)
            values = compensated.index_select(0, indices).half()
            self.memory.forget_at(name, indices)
        self._handles[p] = (allreduce_async(values, name=f"randomk.values.{name}", op=hvd.Average), indices)

    def synchronize(self) -> None:
        self.start_missing(self._handles, self._start)
        for p, (handle, indices) in self._handles.items():
            reduced = synchronize(handle)
            with self.clock.measure():
                if indices is None:
                    p.grad.copy_(reduced.view_as(p.grad))
                else:
                    p.grad.zero_().view(-1).index_copy_(0, indices, reduced.float())
        self._handles.clear()

    def payload(self) -> dict[str, int]:
        """Expected bytes this rank hands to Horovod per step (the count drawn varies around it)."""
        values = sum(round(self.density * self.parameters[name].numel()) * 2 for name in self.compressed)
        dense = sum(p.numel() * p.element_size() for name, p in self.trainable() if name not in self.compressed)
        return {"allreduce_bytes": values + dense, "allgather_bytes": 0}
