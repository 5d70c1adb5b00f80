"""Virtual workers: each method's per-worker arithmetic on ``N`` workers' gradients, in one process.

A curve measured with Top-k or quantized (ternary, int3) values holds for the number of workers it was measured on
(``Method.curve_portable``): each worker keeps its own error memory, picks its own top-k set, and rounds with
its own noise. To get the curve for ``N`` workers without ``N`` machines, split each global batch into ``N``
micro-batches, compute one gradient per micro-batch, and hand them to ``VirtualWorkers.reduce``: it applies
what each worker would do and returns the averaged gradient every worker would receive. numpy only; call it
from any training loop (gradients as arrays)::

    virtual = VirtualWorkers(parse_method("topk"), workers=8)
    for name, param in model.named_parameters():
        param.grad = torch.from_numpy(virtual.reduce(name, [g[name] for g in micro_batch_grads]))

The arithmetic is the library's where it has one: masks are the caller's (``mask=``), quantized codes come from
``pactrain_hvd.core.lanes`` (``local_scale``, ``stochastic_codes``, ``pack_codes``, summed int32 words,
``unpack_lanes``, ``decode_sums``) sent as ``pactrain_hvd.core.quantized`` says, held at the MAX of the previous
step's local scales. Rounding noise is numpy's draw for (rank, tensor, step) by default
(``core.quantized.uniform_noise``), so a virtual run equals the real one in distribution; given the library's own
draws (``noise=``: torch's generator seeded with ``core.quantized.noise_seed``) it equals it bit for bit. Top-k follows the repository's baseline
(``k = ceil(density numel)`` of ``|gradient + memory|``, tensors under 4,096 elements averaged whole).
``tests/parallel/torch/test_virtual_workers.py`` holds PacTrain with fp32 and ternary values and Top-k against a
real 2-rank Horovod run: the same weights, bit for bit, after the same steps.

PowerSGD (rank ``r``, error feedback, warm start, the repository's baseline) reduces linearly given the shared
factors: every worker projects its own ``M_i = gradient + memory`` on the shared ``Q`` (``P = mean M_i Q``), the
orthonormalised ``P`` gives ``Q = mean M_i^T P``, every worker receives ``P Q^T`` and keeps ``M_i - P Q^T``. The
matrices are those the baseline compresses (``rows x cols`` with ``rows cols >= 4096`` and ``2 r (rows + cols) <=
rows cols``; the rest averaged whole); the first ``Q`` comes from ``initial_q`` (numpy's normal draws by default;
the baseline draws torch's, seeded 0, in parameter order). numpy's matrix products and QR round differently from
torch's, so a virtual PowerSGD run follows a real one to float32 rounding, not bit for bit (the same test holds
its weights after 4 steps to 1e-5 relative).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from pactrain_hvd.core.lanes import decode_sums, pack_codes, quantized_layout, unpack_lanes
from pactrain_hvd.core.plan import DEFAULT_MIN_NUMEL
from pactrain_hvd.core.quantized import QuantizedSender, next_scale, uniform_noise
from pactrain_hvd.planner.methods import Method

Noise = Callable[[int, str, int, int], np.ndarray]  # (rank, tensor name, step, count) -> uniform [0, 1) noise
InitialQ = Callable[[str, int, int], np.ndarray]  # (tensor name, rank, cols) -> PowerSGD's first Q^T (rank x cols)


class VirtualWorkers:
    """``workers`` workers' reduction of one method, with every worker's state (error memory, held scales).

    Args:
        method: the method whose per-worker arithmetic to apply.
        workers: number of virtual workers (an int >= 1).
        noise: ``(rank, tensor name, step, count) -> count`` uniform [0, 1) float32 draws, the rounding noise of
            quantized values (None: numpy's, ``core.quantized.uniform_noise``).
        initial_q: ``(tensor name, PowerSGD rank r, cols) -> r x cols`` array, PowerSGD's first ``Q^T`` of a
            tensor (None: numpy's normal draws, seeded 0).
    """

    def __init__(self, method: Method, workers: int, noise: Noise | None = None,
                 initial_q: InitialQ | None = None) -> None:
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers must be an int >= 1, got {workers!r}")
        self.method = method
        self.workers = workers
        self.memory: list[dict[str, np.ndarray]] = [{} for _ in range(workers)]
        self.senders = [QuantizedSender(rank, method.levels, self.memory[rank]) for rank in range(workers)]
        self.scales: dict[str, float] = {}
        self.steps: dict[str, int] = {}  # per quantized tensor, its sends so far: the step its noise is drawn for
        self.noise = noise or uniform_noise
        start = np.random.default_rng(0)
        self.initial_q = initial_q or (lambda name, rank, cols: start.standard_normal((rank, cols), dtype=np.float32))
        self.q_ts: dict[str, np.ndarray] = {}  # PowerSGD's warm start, shared by every worker

    def reduce(self, name: str, grads: Sequence[np.ndarray], mask: np.ndarray | None = None) -> np.ndarray:
        """The averaged gradient of tensor ``name`` that every worker receives, from each worker's own ``grads``.

        Args:
            name: the tensor's name, which keys each worker's state.
            grads: one gradient per worker, all of the tensor's shape.
            mask: PacTrain's mask (bool, the tensor's shape; None: the tensor is not pruned and travels whole).

        Returns:
            The averaged gradient, float32, of the tensor's shape.
        """
        if len(grads) != self.workers:
            raise ValueError(f"reduce({name!r}) needs one gradient per worker: {self.workers}, got {len(grads)}")
        grads = [np.asarray(g, dtype=np.float32) for g in grads]
        shape = grads[0].shape
        kind = self.method.kind
        if kind == "dense" or (kind == "pactrain" and mask is None and self.method.values == "fp32"):
            return _mean(grads)
        if kind == "fp16" or (kind == "pactrain" and mask is None):
            return _mean([g.astype(np.float16) for g in grads], np.float16).astype(np.float32)
        if kind == "topk":
            return self._topk(name, grads).reshape(shape)
        if kind == "powersgd":
            return self._powersgd(name, grads)
        mask = np.asarray(mask, dtype=bool).reshape(shape)
        survivors = [g[mask] for g in grads]
        out = np.zeros(shape, dtype=np.float32)
        if self.method.levels and quantized_layout(self.workers, self.method.levels) is not None:
            out[mask] = self._quantized(name, survivors)
        elif self.method.values == "fp32":
            out[mask] = _mean(survivors)
        else:  # fp16, bf16 (rounded as fp16 here), quantized values where lanes do not fit
            out[mask] = _mean([s.astype(np.float16) for s in survivors], np.float16).astype(np.float32)
        return out

    def _topk(self, name: str, grads: list[np.ndarray]) -> np.ndarray:
        flat = [g.reshape(-1) for g in grads]
        if flat[0].size < DEFAULT_MIN_NUMEL:
            return _mean(flat)
        k = max(1, math.ceil(self.method.density * flat[0].size))
        total = np.zeros(flat[0].size, dtype=np.float32)
        for rank, g in enumerate(flat):
            acc = g + self.memory[rank].get(name, 0.0)
            index = np.argpartition(-np.abs(acc), k - 1)[:k]
            sent = np.zeros_like(acc)
            sent[index] = acc[index]
            self.memory[rank][name] = acc - sent
            total += sent  # an allgather: every worker adds the same pairs in rank order
        return total / np.float32(self.workers)

    def _powersgd(self, name: str, grads: list[np.ndarray]) -> np.ndarray:
        shape, r = grads[0].shape, self.method.rank
        rows = shape[0] if shape else 1
        cols = grads[0].size // max(rows, 1)
        if len(shape) < 2 or rows * cols < DEFAULT_MIN_NUMEL or 2 * r * (rows + cols) > rows * cols:
            return _mean(grads)
        if name not in self.q_ts:
            self.q_ts[name] = np.asarray(self.initial_q(name, r, cols), dtype=np.float32)
        matrices = [(g.reshape(-1) + self.memory[rank].get(name, np.float32(0))).reshape(rows, cols)
                    for rank, g in enumerate(grads)]
        p = _mean([m @ self.q_ts[name].T for m in matrices])
        p = np.linalg.qr(p)[0].astype(np.float32)
        q_t = _mean([p.T @ m for m in matrices])
        approximation = p @ q_t
        for rank, m in enumerate(matrices):
            self.memory[rank][name] = (m - approximation).reshape(-1)
        self.q_ts[name] = q_t
        return approximation.reshape(shape)

    def _quantized(self, name: str, survivors: list[np.ndarray]) -> np.ndarray:
        layout = quantized_layout(self.workers, self.method.levels)
        proposed = [sender.propose(name, s) for sender, s in zip(self.senders, survivors)]
        step_max = max(local for _, local in proposed)  # the MAX all-reduce
        scale = self.scales.get(name, step_max)  # held from the previous step; the first step waits for its MAX
        step = self.steps.get(name, 0)
        words = np.zeros(layout.words(survivors[0].size), dtype=np.int64)
        for sender, (values, _) in zip(self.senders, proposed):
            codes = sender.round(name, values, scale, self.noise(sender.rank, name, step, values.size))
            words += pack_codes(codes.astype(np.int64) + layout.offset, layout)  # the SUM all-reduce of int32 words
        self.scales[name], self.steps[name] = next_scale(step_max, self.scales.get(name)), step + 1
        summed = decode_sums(unpack_lanes(words.astype(np.int32), layout, survivors[0].size), layout)
        return summed.astype(np.float32) * np.float32(scale) / (np.float32(self.workers) * np.float32(self.method.levels))


def _mean(arrays: list[np.ndarray], dtype=np.float32) -> np.ndarray:
    """Sum in ``dtype`` in rank order (the ring's order differs; the rounding is of the same size), then average."""
    total = arrays[0].astype(dtype, copy=True)
    for array in arrays[1:]:
        total += array.astype(dtype)
    return (total.astype(np.float32) / np.float32(len(arrays))).astype(np.float32)
