"""Bytes a worker hands the collectives per step, per method, from the model's parameter shapes.

The same rules the library and the repository's benchmark apply:

- **dense / fp16**: every gradient, 4 or 2 bytes an element, all-reduced.
- **Top-k** (``k = ceil(density * numel)``): values (fp32) and indices (int32) allgathered, ``8 k`` bytes
  from every worker; tensors under ``pactrain_hvd.core.plan.DEFAULT_MIN_NUMEL`` elements all-reduced whole.
- **PowerSGD rank r**: a tensor of >= 2 dimensions viewed as ``rows x cols`` (rows = first dimension)
  with ``rows cols >= DEFAULT_MIN_NUMEL`` and ``2 r (rows + cols) <= rows cols`` sends ``P`` (``r rows``) then
  ``Q`` (``r cols``) in fp32; the rest travels whole with ``P``.
- **PacTrain**: prunable tensors are those of >= 2 dimensions (the library's default), or those whose names
  match ``prunable`` glob patterns (``prunable=`` of the library, ``core.masks.prunable_predicate``); each keeps
  ``num_to_keep(numel, share)`` at its Erdős-Rényi-Kernel share of the sparsity (``core.masks.erk_sparsities``,
  the library's default ranking) or at the sparsity itself (``ranking="layer"``). ``core.plan.should_pack``
  decides whether a tensor travels packed; otherwise it goes whole. Packed fp32/fp16/bf16 values cost 4/2/2
  bytes each; ternary and int3 codes go ``core.lanes.quantized_layout(n, levels).lanes`` to an int32 word plus
  one fp32 scale per tensor (``core.lanes.SCALE_BYTES``, a MAX all-reduce), or fp16 where lanes do not fit
  (ternary from 645 workers, int3 from 215).
  Whole tensors travel fp32 with fp32 values, fp16 otherwise (``compression=hvd.Compression.fp16``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from pactrain_hvd.core.lanes import SCALE_BYTES, quantized_layout
from pactrain_hvd.core.masks import erk_sparsities, num_to_keep, prunable_predicate
from pactrain_hvd.core.plan import DEFAULT_MAX_DENSITY, DEFAULT_MIN_NUMEL, should_pack
from pactrain_hvd.planner.methods import Method
from pactrain_hvd.planner.step_model import ALLGATHER, ALLREDUCE, Transfer

ELEMENT_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
WIRE_DTYPE = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


@dataclass(frozen=True)
class Tensor:
    """One trainable parameter.

    Attributes:
        name: the parameter's name (matched by PacTrain's ``prunable`` patterns).
        shape: the parameter's dimensions.
        ready_fraction: fraction of backward done when its gradient is ready, in [0, 1]; None: estimated from the
            parameter order and sizes (``with_ready_fractions``).
    """

    name: str
    shape: tuple[int, ...]
    ready_fraction: float | None = None

    @property
    def numel(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)


def with_ready_fractions(tensors: Sequence[Tensor]) -> list[Tensor]:
    """Fill in missing ready fractions: backward reaches parameters in reverse order, at a pace proportional
    to their elements (an assumption; a measured backward, as the repository's profile takes, is better)."""
    total = sum(t.numel for t in tensors) or 1
    out, done = [], 0
    for tensor in reversed(list(tensors)):
        done += tensor.numel
        out.append(tensor if tensor.ready_fraction is not None else
                   Tensor(tensor.name, tuple(tensor.shape), done / total))
    return list(reversed(out))


@dataclass
class Traffic:
    """What a method hands the collectives in one step, per worker.

    Attributes:
        hooked: transfers started from the gradient hooks, as backward reaches them.
        rounds: blocking rounds after backward (PowerSGD's ``P`` then ``Q``), each a tuple of
            ``(nbytes, collective, dtype)`` transfers.
    """

    hooked: list[Transfer] = field(default_factory=list)
    rounds: list[tuple[tuple[int, str, str], ...]] = field(default_factory=list)

    def _all(self) -> list[tuple[int, str]]:
        return [(t.nbytes, t.kind) for t in self.hooked] + [(b, k) for r in self.rounds for b, k, _ in r]

    @property
    def allreduce_bytes(self) -> int:
        """Bytes handed to all-reduces per step."""
        return sum(b for b, kind in self._all() if kind == ALLREDUCE)

    @property
    def allgather_bytes(self) -> int:
        """Bytes handed to allgathers per step (this worker's own contribution)."""
        return sum(b for b, kind in self._all() if kind == ALLGATHER)

    @property
    def handed_bytes(self) -> int:
        """Bytes handed to Horovod per step (each worker's own contribution)."""
        return self.allreduce_bytes + self.allgather_bytes

    def sent_bytes(self, world_size: int) -> float:
        """Bytes one worker sends per step over rings of ``world_size`` workers.

        Args:
            world_size: workers in the rings.

        Returns:
            ``2 (n-1)/n`` of the all-reduced bytes (under twice the buffer however many join) plus ``n - 1``
            times the allgathered ones; 0.0 for one worker.
        """
        n = world_size
        return 0.0 if n <= 1 else 2 * (n - 1) / n * self.allreduce_bytes + (n - 1) * self.allgather_bytes


def default_prunable(name: str, tensor: Tensor) -> bool:
    """The library's default: weights of >= 2 dimensions; biases and norm scales stay dense."""
    return len(tensor.shape) >= 2


def prunable_names(tensors: Sequence[Tensor], prunable: Sequence[str] | None = None) -> list[str]:
    """Names PacTrain prunes: those ``prunable`` glob patterns match (as the library's ``prunable=``), else the
    default's."""
    predicate = prunable_predicate(None if prunable is None else list(prunable), default_prunable)
    return [t.name for t in tensors if predicate(t.name, t)]


def pactrain_kept(method: Method, tensors: Sequence[Tensor], ranking: str = "erk",
                  prunable: Sequence[str] | None = None) -> dict[str, int]:
    """Survivors per prunable tensor at the method's sparsity, as the library's masks keep."""
    chosen = set(prunable_names(tensors, prunable))
    shapes = {t.name: tuple(t.shape) for t in tensors if t.name in chosen}
    if ranking == "erk":
        shares = erk_sparsities(shapes, method.sparsity)
    elif ranking == "layer":
        shares = {name: method.sparsity for name in shapes}
    else:
        raise ValueError(f"ranking must be 'erk' or 'layer', got {ranking!r}")
    return {name: num_to_keep(math.prod(shape), shares[name]) for name, shape in shapes.items()}


def traffic(method: Method, tensors: Sequence[Tensor], world_size: int, ranking: str = "erk",
            min_numel: int = DEFAULT_MIN_NUMEL, max_density: float = DEFAULT_MAX_DENSITY,
            prunable: Sequence[str] | None = None) -> Traffic:
    """``method``'s transfers for one step of a model with these parameters on ``world_size`` workers.

    Args:
        method: the method whose traffic to count.
        tensors: the model's trainable parameters, in parameter order.
        world_size: number of workers (an int >= 1); sets whether quantized values fit in lanes.
        ranking: how PacTrain spreads its sparsity: ``"erk"`` (Erdős-Rényi-Kernel, the library's default) or
            ``"layer"`` (the same sparsity for every prunable tensor).
        min_numel: PacTrain packs only tensors of at least this many elements.
        max_density: PacTrain packs only tensors keeping at most this fraction of their elements.
        prunable: glob patterns of the tensor names PacTrain prunes (None: those of >= 2 dimensions).

    Returns:
        The transfers each worker hands Horovod per step.

    Raises:
        ValueError: ``world_size`` is not an int >= 1, PacTrain's ``ranking`` is unknown, or the method's kind has no
            traffic model.
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1, got {world_size!r}")
    tensors = with_ready_fractions(tensors)
    out = Traffic()
    if method.kind in ("dense", "fp16"):
        element = 2 if method.kind == "fp16" else 4
        dtype = "float16" if element == 2 else "float32"
        out.hooked = [Transfer(t.ready_fraction, element * t.numel, ALLREDUCE, dtype) for t in tensors]
    elif method.kind == "topk":
        for t in tensors:
            if t.numel < DEFAULT_MIN_NUMEL:
                out.hooked.append(Transfer(t.ready_fraction, 4 * t.numel))
            else:
                k = max(1, math.ceil(method.density * t.numel))
                out.hooked += [Transfer(t.ready_fraction, 4 * k, ALLGATHER, "float32"),
                               Transfer(t.ready_fraction, 4 * k, ALLGATHER, "int32")]
    elif method.kind == "powersgd":
        p = q = whole = 0
        for t in tensors:
            rows = t.shape[0] if t.shape else 1
            cols = t.numel // max(rows, 1)
            if len(t.shape) >= 2 and rows * cols >= DEFAULT_MIN_NUMEL and 2 * method.rank * (rows + cols) <= rows * cols:
                p, q = p + 4 * method.rank * rows, q + 4 * method.rank * cols
            else:
                whole += 4 * t.numel
        out.rounds = [((p + whole, ALLREDUCE, "float32"),), ((q, ALLREDUCE, "float32"),)]
    elif method.kind == "pactrain":
        out.hooked = [transfer for part in pactrain_parts(method, tensors, world_size, ranking, prunable, min_numel,
                                                          max_density) for transfer in part.transfers]
    else:
        raise ValueError(f"no traffic model for method kind {method.kind!r}")
    return out


@dataclass(frozen=True)
class TensorPart:
    """One tensor's share of PacTrain's step: its survivors (None: not pruned), whether it travels packed, and
    its transfers."""

    tensor: Tensor
    kept: int | None
    packed: bool
    transfers: tuple[Transfer, ...]

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.transfers)


def pactrain_parts(method: Method, tensors: Sequence[Tensor], world_size: int, ranking: str = "erk",
                   prunable: Sequence[str] | None = None, min_numel: int = DEFAULT_MIN_NUMEL,
                   max_density: float = DEFAULT_MAX_DENSITY) -> list[TensorPart]:
    """PacTrain's transfers per tensor, in parameter order."""
    tensors = with_ready_fractions(tensors)
    kept = pactrain_kept(method, tensors, ranking, prunable)
    layout = quantized_layout(world_size, method.levels) if method.levels else None
    packed_values = "fp16" if method.levels else method.values  # quantized without lanes: fp16
    whole_values = "fp32" if method.values == "fp32" else "fp16"
    parts = []
    for t in tensors:
        survivors = kept.get(t.name, t.numel)
        packed = t.name in kept and should_pack(t.numel, survivors, min_numel, max_density)
        if packed and layout is not None:  # the codes' SUM and the next step's scale (a MAX)
            moved = (Transfer(t.ready_fraction, 4 * layout.words(survivors), ALLREDUCE, "int32"),
                     Transfer(t.ready_fraction, SCALE_BYTES, ALLREDUCE, "float32-max"))
        elif packed:
            moved = (Transfer(t.ready_fraction, ELEMENT_BYTES[packed_values] * survivors, ALLREDUCE,
                              WIRE_DTYPE[packed_values]),)
        else:
            moved = (Transfer(t.ready_fraction, ELEMENT_BYTES[whole_values] * t.numel, ALLREDUCE,
                              WIRE_DTYPE[whole_values]),)
        parts.append(TensorPart(t, kept.get(t.name), packed, moved))
    return parts
