"""PowerSGD (Vogels et al., NeurIPS 2019; torch's ``powerSGD_hook``): the compressor, and the optimizer
that moves every P in one fused all-reduce, then every Q.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from benchmarks.baselines.communicator import FusedAllreduceCommunicator
from benchmarks.baselines.memory import ResidualMemory
from benchmarks.baselines.optimizer import WrappedOptimizer
from benchmarks.common.timing import PhaseClock
from pactrain_hvd.core.plan import DEFAULT_MIN_NUMEL


class PowerSGDCompressor:
    """Rank-``rank`` power iteration on gradients viewed as ``(shape[0], -1)`` matrices.

    One step, per matrix M with warm-started Q: P = M Q, all-reduce P, orthonormalise P,
    Q = M^T P, all-reduce Q; the approximation is P Q^T (Vogels et al. 2019, Algorithm 1).
    Q is kept transposed (``rank x cols``) so that both products read M row by row
    (``P^T M`` is ~2.5x faster than ``M^T P`` on one CPU thread).
    """

    def __init__(self, rank: int = 4, min_compress_numel: int = DEFAULT_MIN_NUMEL) -> None:
        if rank < 1:
            raise ValueError(f"rank must be >= 1, got {rank}")
        self.rank = rank
        self.min_compress_numel = min_compress_numel

    @staticmethod
    def matrix_shape(shape: torch.Size) -> tuple[int, int]:
        rows = shape[0] if len(shape) else 1
        return rows, math.prod(shape) // max(rows, 1)

    def compressible(self, shape: torch.Size) -> bool:
        """Worth it: big enough and at least 2x smaller as factors (torch's ``min_compression_rate``)."""
        rows, cols = self.matrix_shape(shape)
        return (len(shape) >= 2 and rows * cols >= self.min_compress_numel
                and 2 * self.rank * (rows + cols) <= rows * cols)

    def initial_q_t(self, cols: int, generator: torch.Generator) -> torch.Tensor:
        """Random start Q^T, identical on every rank when ``generator`` is seeded identically."""
        return torch.randn(self.rank, cols, generator=generator)

    @staticmethod
    def orthonormalize_(p: torch.Tensor) -> torch.Tensor:
        p.copy_(torch.linalg.qr(p).Q)
        return p

    @staticmethod
    def project_p(matrices: list[torch.Tensor], q_ts: list[torch.Tensor], out: torch.Tensor) -> list[torch.Tensor]:
        """P = M Q of every matrix, written into consecutive slices of ``out``; returns the views."""
        views = _split(out, [(m.shape[0], q_t.shape[0]) for m, q_t in zip(matrices, q_ts)])
        for matrix, q_t, p in zip(matrices, q_ts, views):
            torch.matmul(matrix, q_t.t(), out=p)
        return views

    @staticmethod
    def project_q(matrices: list[torch.Tensor], ps: list[torch.Tensor], out: torch.Tensor) -> list[torch.Tensor]:
        """Q^T = P^T M of every matrix, written into consecutive slices of ``out``; returns the views."""
        views = _split(out, [(p.shape[1], m.shape[1]) for m, p in zip(matrices, ps)])
        for matrix, p, q_t in zip(matrices, ps, views):
            torch.matmul(p.t(), matrix, out=q_t)
        return views


@dataclass
class PowerSGDState:
    """What persists between PowerSGD steps: warm-start Q^T per matrix, and the error-feedback memory."""

    q_ts: dict[str, torch.Tensor]
    memory: ResidualMemory = field(default_factory=ResidualMemory)
    step: int = 0


class PowerSGDDistributedOptimizer(WrappedOptimizer):
    """PowerSGD (rank r, error feedback, warm start) over Horovod all-reduce.

    Runs when all gradients exist (``synchronize``), like torch's DDP hook on one bucket: three
    all-reduces per step (dense tensors, all P's, all Q's) whatever the number of tensors.

    Example::

        >>> opt = PowerSGDDistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
        ...                                    model.named_parameters(), rank=4)
        >>> loss.backward(); opt.step()
    """

    def __init__(self, optimizer: torch.optim.Optimizer, named_parameters: Iterable[tuple[str, torch.Tensor]],
                 rank: int = 4, min_compress_numel: int = DEFAULT_MIN_NUMEL, seed: int = 0,
                 clock: PhaseClock | None = None) -> None:
        super().__init__(optimizer, named_parameters, clock)
        self.compressor = PowerSGDCompressor(rank, min_compress_numel)
        self.communicator = FusedAllreduceCommunicator()
        self.compressed = [name for name, p in self.trainable() if self.compressor.compressible(p.shape)]
        self.dense = [name for name, p in self.trainable() if name not in set(self.compressed)]
        generator = torch.Generator().manual_seed(seed)
        shapes = {name: self.compressor.matrix_shape(self.parameters[name].shape) for name in self.compressed}
        self.shapes = shapes
        self.state = PowerSGDState(q_ts={name: self.compressor.initial_q_t(shapes[name][1], generator)
                                         for name in self.compressed})

    def _gradient(self, name: str) -> torch.Tensor:
        p = self.parameters[name]
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        return p.grad

    def _start_dense(self) -> tuple[int, torch.Tensor] | None:
        if not self.dense:
            return None
        flat = torch.cat([self._gradient(name).reshape(-1) for name in self.dense])
        return self.communicator.start("powersgd.dense", flat), flat

    def _finish_dense(self, started: tuple[int, torch.Tensor] | None) -> None:
        if started is None:
            return
        flat = self.communicator.wait(started[0])
        offset = 0
        for name in self.dense:
            grad = self._gradient(name)
            grad.copy_(flat[offset:offset + grad.numel()].view_as(grad))
            offset += grad.numel()

    def synchronize(self) -> None:
        dense = self._start_dense()
        rank, names, state, compressor = self.compressor.rank, self.compressed, self.state, self.compressor
        with self.clock.measure():
            matrices = [state.memory.compensate(name, self._gradient(name)).view(self.shapes[name]) for name in names]
            flat_p = torch.empty(sum(self.shapes[name][0] * rank for name in names))
            ps = compressor.project_p(matrices, [state.q_ts[name] for name in names], flat_p)
        self.communicator.wait(self.communicator.start("powersgd.p", flat_p))  # in place: ps see the average
        with self.clock.measure():
            for p in ps:
                compressor.orthonormalize_(p)
            flat_q = torch.empty(sum(self.shapes[name][1] * rank for name in names))
            q_ts = compressor.project_q(matrices, ps, flat_q)
        self.communicator.wait(self.communicator.start("powersgd.q", flat_q))
        with self.clock.measure():
            for name, matrix, p, q_t in zip(names, matrices, ps, q_ts):
                grad = self._gradient(name)
                torch.matmul(p, q_t, out=grad.view(matrix.shape))
                state.memory.subtract(name, grad)
                state.q_ts[name] = q_t
        self._finish_dense(dense)
        state.step += 1

    def payload(self) -> dict[str, int]:
        factors = sum((rows + cols) * self.compressor.rank for rows, cols in self.shapes.values())
        dense = sum(self.parameters[name].numel() for name in self.dense)
        return {"allreduce_bytes": 4 * (factors + dense), "allgather_bytes": 0}


def _split(flat: torch.Tensor, shapes: list[tuple[int, int]]) -> list[torch.Tensor]:
    views, offset = [], 0
    for rows, cols in shapes:
        views.append(flat[offset:offset + rows * cols].view(rows, cols))
        offset += rows * cols
    return views
