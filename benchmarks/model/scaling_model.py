"""Scaling on paper: bytes each worker sends per step, 2 to 1024 workers.

    python -m benchmarks.model.scaling_model                                   # sizes computed from the models
    python -m benchmarks.model.scaling_model --results bench/results/latest.json  # sizes a benchmark run measured
    python -m benchmarks.model.scaling_model --models vgg16 --rate-mbit 100 --markdown

Every method hands Horovod, per worker and step, ``B`` bytes to all-reduce and ``G`` bytes to
allgather. Over a ring, each worker then sends ``2 (n-1)/n B + (n-1) G`` bytes (and receives as
much): all-reduced bytes stay under ``2 B`` however many workers join, allgathered bytes grow
with ``n``. That is the whole argument for a mask shared by every rank: PacTrain's packed
values (``B`` = surviving values + the tensors its plan keeps dense) are all-reduced, while
Top-k's per-rank index sets force an allgather.

Sizes come from ``benchmarks.common.models`` and the same rules the benchmark uses (per-layer
magnitude masks keep ``round((1 - s) numel)``, ``should_pack``, Top-k's ``k``, PowerSGD's
compressible matrices), or from a results JSON (``payload`` of each cell, as the workers
accounted it).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks.baselines.baselines import PowerSGDCompressor, TopKCompressor
from benchmarks.common.methods import parse_method
from benchmarks.common.models import build
from pactrain_hvd.core import num_to_keep, ring_allreduce_bytes, should_pack
from pactrain_hvd.core.plan import DEFAULT_MIN_NUMEL

WORLD_SIZES = tuple(2**i for i in range(1, 11))  # 2 .. 1024
METHODS = ("dense", "fp16", "pactrain-0.9", "pactrain-0.9-fp16", "topk", "powersgd")


@dataclass(frozen=True)
class Payload:
    """Bytes one worker hands Horovod per step."""

    allreduce_bytes: int
    allgather_bytes: int = 0

    def per_worker_bytes(self, world_size: int) -> float:
        """Bytes one worker sends per step over a ring (all-reduce, then allgather)."""
        return ring_allreduce_bytes(self.allreduce_bytes, world_size) + (world_size - 1) * self.allgather_bytes


def parameter_shapes(model_name: str) -> dict[str, torch.Size]:
    return {name: p.shape for name, p in build(model_name).named_parameters() if p.requires_grad}


def computed_payload(method: str, shapes: dict[str, torch.Size]) -> Payload:
    """What ``method`` hands Horovod for parameters of these shapes (no run needed)."""
    spec = parse_method(method)
    numels = {name: math.prod(shape) for name, shape in shapes.items()}
    if spec.kind in ("dense", "fp16"):
        return Payload((2 if spec.fp16_values else 4) * sum(numels.values()))
    if spec.kind == "pactrain":
        element = 2 if spec.fp16_values else 4
        sent = 0
        for name, shape in shapes.items():
            numel = numels[name]
            prunable = len(shape) >= 2  # pactrain_hvd.torch.pruning.default_prunable
            kept = num_to_keep(numel, spec.sparsity) if prunable else numel
            sent += kept if prunable and should_pack(numel, kept) else numel
        return Payload(element * sent)
    if spec.kind == "topk":
        compressor = TopKCompressor(spec.density)
        gathered = sum(8 * compressor.k(n) for n in numels.values() if n >= DEFAULT_MIN_NUMEL)
        return Payload(4 * sum(n for n in numels.values() if n < DEFAULT_MIN_NUMEL), gathered)
    if spec.kind == "powersgd":
        compressor = PowerSGDCompressor(spec.rank)
        floats = 0
        for name, shape in shapes.items():
            if compressor.compressible(shape):
                rows, cols = compressor.matrix_shape(shape)
                floats += spec.rank * (rows + cols)
            else:
                floats += numels[name]
        return Payload(4 * floats)
    raise ValueError(f"no payload model for method {method!r}")


def measured_payloads(results: dict, model: str) -> dict[str, Payload]:
    """``payload`` of each method's first successful cell for ``model`` in a results document."""
    payloads: dict[str, Payload] = {}
    for cell in results["cells"]:
        if cell["model"] == model and "error" not in cell and cell["method"] not in payloads:
            payloads[cell["method"]] = Payload(cell["payload"]["allreduce_bytes"], cell["payload"]["allgather_bytes"])
    return payloads


def crossover(cheap_at_scale: Payload, cheap_at_two: Payload, world_sizes=range(2, 1 << 20)) -> int | None:
    """Smallest world size at which ``cheap_at_scale`` sends fewer bytes per worker than ``cheap_at_two``."""
    for n in world_sizes:
        if cheap_at_scale.per_worker_bytes(n) < cheap_at_two.per_worker_bytes(n):
            return n
    return None


def table(model: str, payloads: dict[str, Payload], world_sizes=WORLD_SIZES, rate_mbit: float | None = None) -> str:
    """Markdown: MB per worker per step (and, with ``rate_mbit``, the seconds that takes)."""
    methods = list(payloads)
    unit = f"MB per worker per step{f' (seconds at {rate_mbit:g} Mbit/s)' if rate_mbit else ''}"
    lines = [f"**{model}**: {unit}", "", "| workers | " + " | ".join(methods) + " |",
             "|---:|" + "---:|" * len(methods)]
    for n in world_sizes:
        cells = []
        for method in methods:
            sent = payloads[method].per_worker_bytes(n)
            cells.append(f"{sent / 1e6:.2f}" + (f" ({sent * 8 / (rate_mbit * 1e6):.3f})" if rate_mbit else ""))
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="resnet18,vgg16,gpt")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--results", type=Path, default=None, help="use the payloads a benchmark run measured")
    parser.add_argument("--rate-mbit", type=float, default=None, help="also give the wire time at this link rate")
    args = parser.parse_args(argv)
    results = json.loads(args.results.read_text()) if args.results else None
    methods = [m for m in args.methods.split(",") if m]
    for model in [m for m in args.models.split(",") if m]:
        if results is not None:
            measured = measured_payloads(results, model)
            payloads = {m: measured[m] for m in methods if m in measured}
            source = f"measured ({args.results})"
        else:
            shapes = parameter_shapes(model)
            payloads = {m: computed_payload(m, shapes) for m in methods}
            source = "computed from the model's shapes"
        if not payloads:
            print(f"**{model}**: no payloads in {args.results}\n")
            continue
        print(table(model, payloads, rate_mbit=args.rate_mbit))
        notes = [f"Sizes {source}. All-reduced bytes (B) and allgathered bytes (G) per worker: "
                 + ", ".join(f"{m} B={p.allreduce_bytes / 1e6:.3f} MB G={p.allgather_bytes / 1e6:.3f} MB"
                             for m, p in payloads.items()) + "."]
        for packed in ("pactrain-0.9-fp16", "pactrain-0.9"):
            if packed in payloads and "topk" in payloads:
                n = crossover(payloads[packed], payloads["topk"])
                notes.append(f"{packed} sends fewer bytes per worker than topk from {n} workers on.")
        print("\n" + "\n".join(notes) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
