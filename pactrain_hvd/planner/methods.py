"""The methods the planner compares, by name, and what their names mean.

Names follow the repository's benchmark (so that its records' curves match them):

- ``dense``: fp32 gradients, Horovod's ring all-reduce.
- ``fp16``: the same in fp16 (``hvd.Compression.fp16``).
- ``topk`` (1 %) or ``topk-0.001`` (0.1 %): each worker's largest ``k`` coordinates with error feedback,
  values (fp32) and indices (int32) allgathered; tensors under 4,096 elements all-reduced whole.
- ``powersgd`` (rank 4) or ``powersgd-r8``: a rank-``r`` factorisation ``P Q^T`` of every matrix-shaped
  gradient (rows = first dimension), all-reduced in two rounds (``P``, then ``Q``), error feedback.
- ``pactrain-0.9`` (fp32 packed values), ``pactrain-0.9-fp16``, ``pactrain-0.9-bf16``,
  ``pactrain-0.9-ternary``, ``pactrain-0.9-int3``: PacTrain at sparsity 0.9; the suffix is the value encoding
  (``packed_values``, ``pactrain_hvd.core.encodings``). Tensors the plan keeps dense travel fp32 with fp32
  values and fp16 otherwise (``compression=hvd.Compression.fp16``), as the repository's benchmark runs them.
- ``pactrain-0.9-int3-sync25``: the same with local steps (``sync_every=25``): one sync of the survivors every
  25 steps, after the update (nothing overlaps it). ``diloco-h25-fp16`` (or ``-fp32``): DiLoCo, local steps
  with nothing pruned, every coordinate sent at each sync.

Accuracy per step, and so a measured accuracy curve, does not depend on the number of workers where the
method reduces a linear function of the summed gradient at a fixed global batch: ``dense``, ``fp16`` (up
to rounding), PacTrain with fp32/fp16/bf16 values (the mask is shared, so the packed sum is the sum of
the packed gradients), and PowerSGD approximately (its ``P`` and ``Q`` are computed from the summed
gradient's projections, but the error memory is per worker). Top-k and quantized (ternary, int3) values carry per-worker
state (each worker's own top-k set and error memory; each worker's rounding noise), so a curve measured
on ``m`` workers holds for ``m`` workers only: ``Method.curve_portable`` says which. With local steps each
worker's steps between syncs follow its own batches, so their curves hold for the measured workers only too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pactrain_hvd.core.encodings import ENCODINGS

KINDS = ("dense", "fp16", "topk", "powersgd", "pactrain")
VALUES = ("fp32", "fp16", "bf16", "ternary", "int3")
DEFAULT_TOPK_DENSITY = 0.01
DEFAULT_POWERSGD_RANK = 4
DEFAULT_METHODS = ("dense", "fp16", "topk", "topk-0.001", "powersgd", "pactrain-0.9", "pactrain-0.9-fp16",
                   "pactrain-0.95-fp16", "pactrain-0.9-int3", "pactrain-0.95-ternary", "pactrain-0.98-ternary")
# the planner's value names -> the library's packed_values= (fp32 values: "inherit" with no compression)
PACKED_VALUES = {"fp32": "inherit", "fp16": "fp16", "bf16": "bf16", "ternary": "ternary", "int3": "int3"}


@dataclass(frozen=True)
class Method:
    """One way to reduce gradients (``parse_method`` builds it from a name).

    Attributes:
        name: the canonical name, e.g. ``"pactrain-0.9-fp16"`` (a record's window and rescaling suffixes dropped).
        kind: one of ``dense``, ``fp16``, ``topk``, ``powersgd``, ``pactrain`` (DiLoCo: ``dense`` or ``fp16``).
        sparsity: PacTrain's fraction of each prunable tensor pruned, in [0, 1).
        values: how PacTrain's packed values travel: ``fp32``, ``fp16``, ``bf16``, ``ternary`` or ``int3``.
        density: Top-k's fraction of each tensor's elements sent, in (0, 1].
        rank: PowerSGD's rank.
        sync_every: local steps: one sync of the weights every this many steps (1: every step).
        window: PacTrain's pruning window as fractions of the run (``-w0-0.3``); None: the default window.
        ramp: PacTrain: a short ramp from step 0 over this many steps (``-ramp50``).
        local_steps: PacTrain: steps every rank trains alike before the masks (``-local40``).
        rescale_survivors: PacTrain: step 0's survivors take their tensor's norm (``-rescale``).

    The last four are what a benchmark record's name says of the pruning schedule; the planner's own methods
    leave them at their defaults (they change when masks arrive, not the steady state's bytes).
    """

    name: str
    kind: str
    sparsity: float = 0.0
    values: str = "fp32"
    density: float = DEFAULT_TOPK_DENSITY
    rank: int = DEFAULT_POWERSGD_RANK
    sync_every: int = 1
    window: tuple[float, float] | None = None
    ramp: int | None = None
    local_steps: int = 0
    rescale_survivors: bool = False

    @property
    def packed_values(self) -> str:
        """The ``packed_values=`` argument of ``pt.DistributedOptimizer`` this method stands for."""
        encoding = PACKED_VALUES[self.values]
        assert encoding in ENCODINGS, encoding
        return encoding

    @property
    def levels(self) -> int:
        """Code levels each side of 0 of PacTrain's quantized values (``core.encodings``); 0: not quantized."""
        return ENCODINGS[self.packed_values].levels if self.kind == "pactrain" else 0

    @property
    def curve_portable(self) -> bool:
        """Whether a curve measured on some number of workers holds on another (module docstring)."""
        if self.sync_every > 1:
            return False
        return self.kind in ("dense", "fp16", "powersgd") or (self.kind == "pactrain" and not self.levels)

    def describe(self) -> str:
        """A short description for the planner's table, e.g. ``"PacTrain 0.9, fp16 values"``."""
        if self.sync_every > 1:
            what = f"PacTrain {self.sparsity:g}, {self.values} values" if self.kind == "pactrain" else (
                f"DiLoCo, {'fp16' if self.kind == 'fp16' else 'fp32'} values")
            return f"{what}, a sync every {self.sync_every} steps"
        if self.kind == "dense":
            return "fp32 all-reduce"
        if self.kind == "fp16":
            return "fp16 all-reduce"
        if self.kind == "topk":
            return f"Top-k {self.density:.3g} (allgather)"
        if self.kind == "powersgd":
            return f"PowerSGD rank {self.rank}"
        return f"PacTrain {self.sparsity:g}, {self.values} values"


_PACTRAIN = re.compile(rf"pactrain-(\d*\.?\d+)(?:-({'|'.join(VALUES)}))?(?:-w(\d*\.?\d+)-(\d*\.?\d+)|-ramp(\d+))?"
                       r"(?:-local(\d+))?(-rescale)?(?:-sync(\d+))?")


def read_name(name: str, grammar: str) -> Method:
    """Read a method name into everything it says, its numbers checked: the one grammar the planner and the
    repository's benchmark share (``dense``, ``fp16``, ``topk[-DENSITY]``, ``dgc-DENSITY``, ``randomk-DENSITY``,
    ``powersgd[-rRANK]``, ``diloco-hH-fp16|fp32``,
    ``pactrain-SPARSITY[-VALUES][-wBEGIN-END|-rampSTEPS][-localSTEPS][-rescale][-syncH]``).

    Args:
        name: the method's name (kept as ``Method.name``).
        grammar: the forms the caller takes, for the message when the name is unknown.

    Returns:
        The method; DGC, Random-k and DiLoCo have their own kinds, ``dgc``, ``randomk`` and ``diloco``.

    Raises:
        TypeError: ``name`` is not a string.
        ValueError: the name is unknown or a number is out of range; the message says which.
    """
    if not isinstance(name, str):
        raise TypeError(f"a method name must be a string, got {type(name).__name__}")
    if name in ("dense", "fp16"):
        return Method(name, name)
    if match := re.fullmatch(r"(topk|dgc|randomk)(?:-(\d*\.?\d+))?", name):
        kind, density = match.group(1), float(match.group(2) or DEFAULT_TOPK_DENSITY)
        if kind != "topk" and not match.group(2):
            raise ValueError(f"method {name!r}: {kind} needs its density, e.g. {kind}-0.01")
        whole = kind == "topk"
        if not (0 < density <= 1 if whole else 0 < density < 1):
            raise ValueError(f"method {name!r}: the density must be in (0, {'1]' if whole else '1)'}")
        return Method(name, kind, density=density)
    if match := re.fullmatch(r"powersgd(?:-r(\d+))?", name):
        rank = int(match.group(1) or DEFAULT_POWERSGD_RANK)
        if rank < 1:
            raise ValueError(f"method {name!r}: PowerSGD rank must be >= 1")
        return Method(name, "powersgd", rank=rank)
    if match := re.fullmatch(r"diloco-h(\d+)-(fp16|fp32)", name):
        return Method(name, "diloco", values=match.group(2), sync_every=sync_interval(name, match.group(1)))
    if match := _PACTRAIN.fullmatch(name):
        sparsity = float(match.group(1))
        if not 0 <= sparsity < 1:
            raise ValueError(f"method {name!r}: sparsity must be in [0, 1)")
        window = (float(match.group(3)), float(match.group(4))) if match.group(3) else None
        if window is not None and not 0 <= window[0] <= window[1] <= 1:
            raise ValueError(f"method {name!r}: the pruning window must be 0 <= begin <= end <= 1")
        return Method(name, "pactrain", sparsity=sparsity, values=match.group(2) or "fp32", window=window,
                          ramp=int(match.group(5)) if match.group(5) else None, local_steps=int(match.group(6) or 0),
                          rescale_survivors=bool(match.group(7)),
                          sync_every=sync_interval(name, match.group(8)) if match.group(8) else 1)
    raise ValueError(f"unknown method {name!r}: use {grammar}")


def parse_method(name: str) -> Method:
    """Parse a method name: ``"pactrain-0.9-fp16"`` -> ``Method(kind="pactrain", sparsity=0.9, values="fp16")``.

    A benchmark record's pruning-window, train-alike and rescaling suffixes (``-w0-0.3``, ``-ramp50``, ``-local40``,
    ``-rescale``) are ignored: they change when the masks arrive and what the survivors start from, not the bytes of
    the steady state the planner predicts.

    Args:
        name: a method name as the module's docstring lists them, e.g. ``topk-0.001`` or ``pactrain-0.9-int3-sync25``.

    Returns:
        The parsed method, its ``name`` canonical.

    Raises:
        TypeError: ``name`` is not a string.
        ValueError: the name is unknown, names a method the planner has no traffic model for (``dgc``, ``randomk``),
            or its numbers are out of range; the message says which.
    """
    parts = read_name(name, f"dense, fp16, topk[-DENSITY], powersgd[-rRANK], pactrain-SPARSITY[-{'|-'.join(VALUES[1:])}]"
                            "[-syncH] or diloco-hH-fp16|fp32")
    sync = f"-sync{parts.sync_every}" if parts.sync_every > 1 else ""
    if parts.kind in ("dgc", "randomk"):
        raise ValueError(f"method {name!r}: the planner has no traffic model for {parts.kind}; it compares dense, fp16, "
                         "topk, powersgd, pactrain and diloco methods")
    if parts.kind == "diloco":
        return Method(name, "fp16" if parts.values == "fp16" else "dense", sync_every=parts.sync_every)
    if parts.kind == "pactrain":
        canonical = f"pactrain-{name.split('-')[1]}" + (f"-{parts.values}" if parts.values != "fp32" else "") + sync
        return Method(canonical, "pactrain", sparsity=parts.sparsity, values=parts.values, sync_every=parts.sync_every)
    return parts


def sync_interval(name: str, digits: str) -> int:
    """The interval of a method name's local steps (``-sync25``, ``-h25``): at least 2 (1 is every step)."""
    if int(digits) < 2:
        raise ValueError(f"method {name!r}: the interval between syncs must be >= 2 steps")
    return int(digits)
