"""What both baselines' optimizers share: the wrapped optimizer, its trainable parameters, the
``synchronize`` / ``skip_synchronize`` protocol of ``hvd.DistributedOptimizer``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import torch

from benchmarks.common.timing import PhaseClock


class WrappedOptimizer:
    """What the benchmark loop needs of a distributed optimizer; composes, never subclasses, Horovod's."""

    def __init__(self, optimizer: torch.optim.Optimizer, named_parameters: Iterable[tuple[str, torch.Tensor]],
                 clock: PhaseClock | None) -> None:
        self.optimizer = optimizer
        self.parameters = dict(sorted(named_parameters, key=lambda pair: pair[0]))  # same order on every rank
        self.names = {p: name for name, p in self.parameters.items()}
        self.clock = clock or PhaseClock()
        self._should_synchronize = True

    @property
    def param_groups(self) -> list[dict]:
        return self.optimizer.param_groups

    def trainable(self) -> Iterator[tuple[str, torch.Tensor]]:
        return ((name, p) for name, p in self.parameters.items() if p.requires_grad)

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    @contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def start_missing(self, started: dict, start: Callable[[torch.Tensor], None]) -> None:
        """``start`` every trainable parameter not in ``started``: with no gradient this step on this rank it
        contributes zeros, as Horovod does."""
        for _, p in self.trainable():
            if p not in started:
                p.grad = torch.zeros_like(p)
                start(p)

    def synchronize(self) -> None:
        raise NotImplementedError

    def step(self) -> None:
        if self._should_synchronize:
            self.synchronize()
        self.optimizer.step()
