"""The baselines PacTrain is measured against, over the same Horovod: Top-k and PowerSGD.

Both follow GRACE's split (Xu et al., "GRACE: A Compressed Communication Framework for
Distributed Machine Learning", ICDCS 2021): **what to send** (a compressor), **what to
remember** (error-feedback memory), **how to move it** (a communicator). Both are written to be
competitive: one vectorised pass per tensor, no per-element Python, Horovod's tensor fusion
as configured for every method, in-place buffers.

- ``TopKDistributedOptimizer``: each gradient (plus its residual) keeps its ``k = density *
  numel`` largest magnitudes (DGC, Lin et al. 2018; GRACE ``topk``). Ranks keep different
  coordinates, so values and int32 indices are **allgathered**, started from the gradient hook
  as soon as the gradient exists (overlapping backward, as Horovod does for all-reduce).
- ``PowerSGDDistributedOptimizer``: rank-r power iteration with warm start and error feedback
  (Vogels et al., NeurIPS 2019; torch's ``powerSGD_hook``). Every matrix's P travels in one
  fused all-reduce, then every Q in another; small tensors go dense in a third, started first.

Tensors under ``min_compress_numel`` (biases, norms) travel dense for both, as in DGC, and
with PacTrain's default plan threshold, so all methods treat small tensors alike.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import horovod.torch as hvd
import torch
from horovod.torch.mpi_ops import allgather_async, allreduce_async_, synchronize

from benchmarks.common.timing import PhaseClock
from pactrain_hvd.core.plan import DEFAULT_MIN_NUMEL

# -- what to send ------------------------------------------------------------------------------


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


# -- what to remember ------------------------------------------------------------------------


@dataclass
class ResidualMemory:
    """Error feedback: what a step did not send is added to the next step's gradient.

    ``compensate`` adds the gradient into the residual buffer in place and returns it; the
    caller then removes what it sent (``forget_at`` for Top-k, ``subtract`` for PowerSGD), so
    the buffer *becomes* the next residual with no copy.
    """

    residuals: dict[str, torch.Tensor] = field(default_factory=dict)

    def compensate(self, name: str, grad: torch.Tensor) -> torch.Tensor:
        residual = self.residuals.get(name)
        if residual is None:
            residual = self.residuals[name] = grad.detach().reshape(-1).clone()
        else:
            residual.add_(grad.reshape(-1))
        return residual

    def forget_at(self, name: str, indices: torch.Tensor) -> None:
        self.residuals[name].index_fill_(0, indices.long(), 0)

    def subtract(self, name: str, sent: torch.Tensor) -> None:
        self.residuals[name].sub_(sent.reshape(-1))


# -- how to move it --------------------------------------------------------------------------


class AllgatherCommunicator:
    """Top-k's transport: index sets differ across ranks, so nothing can be summed in flight."""

    @staticmethod
    def start(name: str, values: torch.Tensor, indices: torch.Tensor) -> tuple[int, int]:
        return (allgather_async(values, name=f"topk.values.{name}"), allgather_async(indices, name=f"topk.indices.{name}"))

    @staticmethod
    def wait(handles: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        return synchronize(handles[0]), synchronize(handles[1])


class FusedAllreduceCommunicator:
    """Many tensors, one averaging all-reduce: callers write into one flat buffer."""

    @staticmethod
    def start(name: str, flat: torch.Tensor) -> int:
        return allreduce_async_(flat, name=name, op=hvd.Average)

    @staticmethod
    def wait(handle: int) -> torch.Tensor:
        return synchronize(handle)


# -- the optimizers ----------------------------------------------------------------------------


class _WrappedOptimizer:
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

    def synchronize(self) -> None:
        raise NotImplementedError

    def step(self) -> None:
        if self._should_synchronize:
            self.synchronize()
        self.optimizer.step()


class TopKDistributedOptimizer(_WrappedOptimizer):
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
        for _, p in self.trainable():
            if p not in self._handles:  # no gradient this step on this rank: contribute zeros, as Horovod does
                p.grad = torch.zeros_like(p)
                self._start(p)
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


@dataclass
class PowerSGDState:
    """What persists between PowerSGD steps: warm-start Q^T per matrix, and the error-feedback memory."""

    q_ts: dict[str, torch.Tensor]
    memory: ResidualMemory = field(default_factory=ResidualMemory)
    step: int = 0


class PowerSGDDistributedOptimizer(_WrappedOptimizer):
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
