"""Is a workload communication-bound? One worker's step time against its dense gradient's wire time.

Times forward + backward + optimizer step of the examples' models on one CPU thread (real input
shapes, random data: the time does not depend on the values) and sets it against the time a ring
all-reduce of the fp32 gradient takes on a per-worker link: each worker sends ``2 (N - 1) / N`` of
the gradient's bytes (payload only, no protocol overhead: a lower bound on the wire time)::

    .venv/bin/python -m benchmarks.model.workload_ratios                      # the image and language workloads
    .venv/bin/python -m benchmarks.model.workload_ratios --links 100 25 --workers 2 4 --repeats 7
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from benchmarks.micro.micro_pack import median_seconds
from example_support.data import CharVocab, load_bible_text

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from pytorch_char_lm import CharGPT, next_token_loss  # noqa: E402
from pytorch_fashion_mnist import FashionResNet, FashionVGG  # noqa: E402

KJV_VOCABULARY = CharVocab.from_text(load_bible_text()).size


def image_step(model: torch.nn.Module, batch: int):
    images, labels = torch.randn(batch, 1, 28, 28), torch.randint(0, 10, (batch,))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    return optimizer, lambda: torch.nn.functional.cross_entropy(model(images), labels)


def lm_step(model: torch.nn.Module, batch: int, context: int):
    tokens = torch.randint(0, KJV_VOCABULARY, (batch, context + 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    return optimizer, lambda: next_token_loss(model(tokens[:, :-1]), tokens[:, 1:])


WORKLOADS = {
    "image: FashionVGG, batch 64": lambda: image_step(FashionVGG(), 64),
    "image (small): FashionResNet, batch 64": lambda: image_step(FashionResNet(), 64),
    "language: CharGPT 320 x 4, context 128, batch 16": lambda: lm_step(CharGPT(KJV_VOCABULARY, 128, 320, 4, 4), 16, 128),
}


def median_step_seconds(make, repeats: int) -> tuple[float, int]:
    """Median step time (the first step, which allocates optimizer state, untimed) and the parameter count."""
    optimizer, loss_fn = make()

    def step() -> None:
        optimizer.zero_grad()
        loss_fn().backward()
        optimizer.step()

    parameters = sum(p.numel() for group in optimizer.param_groups for p in group["params"])
    return median_seconds(step, repeats), parameters


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--links", type=float, nargs="+", default=[100.0, 25.0], help="Mbit/s per worker")
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--repeats", type=int, default=7, help="timed steps per workload (median)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    print(f"one CPU thread, median of {args.repeats} steps; wire = ring all-reduce of the fp32 gradient")
    print("| workload | parameters | step (s) | " + " | ".join(
        f"wire / step, {n} workers @ {mbit:g} Mbit/s" for mbit in args.links for n in args.workers) + " |")
    print("|---|---:|---:|" + "---:|" * (len(args.links) * len(args.workers)))
    for name, make in WORKLOADS.items():
        step, parameters = median_step_seconds(make, args.repeats)
        ratios = [2 * (n - 1) / n * parameters * 4 * 8 / (mbit * 1e6) / step for mbit in args.links for n in args.workers]
        print(f"| {name} | {parameters / 1e6:.2f} M | {step:.3f} | " + " | ".join(f"{r:.1f}" for r in ratios) + " |",
              flush=True)


if __name__ == "__main__":
    main()
