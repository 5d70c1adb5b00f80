"""The regime map on paper: where PacTrain's best setting steps faster than each peer, GPU-class compute.

    python -m benchmarks.model.regime_map     # -> bench/results/planner/regime-map.md, regime-map.png

For ResNet-18, ResNet-50, VGG-16 and GPT-2 small (``reference_models``), 2 to 1,024 workers and links of 0.1 to
100 Gbit/s, the planner (``pactrain_hvd.planner.predict``) predicts each method's step. Compute per step comes
from a published GPU step time: ImageNet ResNet-18 at 1.28 ms an image on a TITAN RTX
(``benchmarks.model.step_time_model.GPU_REFERENCE``) gives an effective rate of multiply-adds, applied to each
model's published multiply-adds (``reference_models``) and its per-worker batch. Links run at the benchmark's
measured goodput (0.954 of the rate) with 10 us a hop (``step_time_model.GOODPUT``, ``GPU_LATENCY_S``); Horovod's
default 1 ms cycle; compression is free (on a GPU it costs a few percent of the step, so this favours the
methods with costly compression: Top-k's selection, PowerSGD's products).

A cell compares step times only, not accuracy per step: PacTrain's best of 0.9 and 0.95 with fp16 values and
0.95 and 0.98 with ternary values against each peer; *win* where its step is at least 10 % shorter, *lose* where
at least 10 % longer. Time to accuracy multiplies these steps by the steps each method needs
(``docs/planner.md``): a step win is a time-to-accuracy win only where the accuracy per step is close.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from benchmarks.model.reference_models import MODELS
from benchmarks.model.step_time_model import GOODPUT, GPU_LATENCY_S, GPU_REFERENCE
from pactrain_hvd.planner import Costs, Link, parse_method, predict

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "bench" / "results" / "planner"
WORKERS = tuple(2**i for i in range(1, 11))
RATES_GBIT = (0.1, 0.3, 1, 3, 10, 30, 100)
PEERS = ("fp16", "powersgd", "topk", "topk-0.001")
PACTRAIN = ("pactrain-0.9-fp16", "pactrain-0.95-fp16", "pactrain-0.95-ternary", "pactrain-0.98-ternary")
REFERENCE_MACS = 1.8e9  # ResNet-18 forward multiply-adds a 224x224 image (He et al. 2016, Table 1)
TIE = 0.10


def compute_s(macs: float, batch: int) -> float:
    """Forward + backward of ``batch`` samples at the reference's effective rate (the same three passes)."""
    return GPU_REFERENCE["s_per_sample"] * macs / REFERENCE_MACS * batch


def grid(model: str) -> dict[tuple[float, int], dict[str, float]]:
    build, macs, batch, _ = MODELS[model]
    tensors = build()
    costs = Costs(compute_s=compute_s(macs, batch))
    out = {}
    for rate in RATES_GBIT:
        link = Link.gbit(rate * GOODPUT, GPU_LATENCY_S)
        for n in WORKERS:
            out[(rate, n)] = {m: predict(parse_method(m), tensors, n, link, costs).step_s for m in PEERS + PACTRAIN}
    return out


def verdict(ratio: float) -> str:
    return "win" if ratio <= 1 - TIE else "lose" if ratio >= 1 + TIE else "tie"


def summary(model: str, steps: dict) -> list[str]:
    lines = []
    for peer in PEERS:
        ratios = {key: min(s[m] for m in PACTRAIN) / s[peer] for key, s in steps.items()}
        counts = {v: sum(verdict(r) == v for r in ratios.values()) for v in ("win", "tie", "lose")}
        wins = sorted(key for key, r in ratios.items() if verdict(r) == "win")
        where = "; ".join(f"{rate:g} Gbit/s from {min(n for r, n in wins if r == rate)} workers"
                          for rate in RATES_GBIT if any(r == rate for r, _ in wins))
        lines.append(f"| {model} | {peer} | {counts['win']} | {counts['tie']} | {counts['lose']} | {where or '-'} |")
    return lines


def plot(results: dict, png: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm

    fig, axes = plt.subplots(len(results), len(PEERS), figsize=(3.2 * len(PEERS), 2.6 * len(results)), squeeze=False,
                             gridspec_kw={"hspace": 0.5})
    image = None
    for i, (model, steps) in enumerate(results.items()):
        for j, peer in enumerate(PEERS):
            ax = axes[i][j]
            matrix = [[min(steps[(rate, n)][m] for m in PACTRAIN) / steps[(rate, n)][peer] for n in WORKERS]
                      for rate in RATES_GBIT]
            image = ax.imshow(matrix, origin="lower", aspect="auto", cmap="RdYlGn_r", norm=LogNorm(0.1, 10))
            ax.set_xticks(range(len(WORKERS)), [str(n) if k % 2 == 0 else "" for k, n in enumerate(WORKERS)], fontsize=6)
            ax.set_yticks(range(len(RATES_GBIT)), [f"{r:g}" for r in RATES_GBIT], fontsize=6)
            ax.set_title(f"{model} vs {peer}", fontsize=8)
            if j == 0:
                ax.set_ylabel("Gbit/s", fontsize=7)
            if i == len(results) - 1:
                ax.set_xlabel("workers", fontsize=7)
    fig.colorbar(image, ax=axes, shrink=0.6, label="PacTrain best step / peer step (green: PacTrain faster)")
    fig.suptitle("Regime map on paper (benchmarks/model/regime_map.py): step time, GPU-class compute", fontsize=9)
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--models", default=",".join(MODELS))
    args = parser.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    results = {model: grid(model) for model in models}
    head = [f"Step time of PacTrain's best setting ({', '.join(PACTRAIN)}) against each peer, {len(WORKERS)} worker "
            f"counts ({WORKERS[0]}-{WORKERS[-1]}) x {len(RATES_GBIT)} link rates ({RATES_GBIT[0]:g}-{RATES_GBIT[-1]:g} "
            f"Gbit/s): grid points where PacTrain wins (step >= {TIE:.0%} shorter), ties, loses. Written by "
            "`python -m benchmarks.model.regime_map`; compute from "
            f"{GPU_REFERENCE['source']}, scaled by multiply-adds (benchmarks/model/reference_models.py).", "",
            "| model | compute ms a step (batch) | parameters |", "|---|---:|---:|"]
    for model in models:
        build, macs, batch, sample = MODELS[model]
        head.append(f"| {model} | {compute_s(macs, batch) * 1e3:.0f} ({batch} x {sample}) | "
                    f"{sum(t.numel for t in build()) / 1e6:.1f} M |")
    table = ["| model | peer | win | tie | lose | PacTrain wins at |", "|---|---|---:|---:|---:|---|"]
    for model, steps in results.items():
        table += summary(model, steps)
    args.out.mkdir(parents=True, exist_ok=True)
    text = "\n".join(head) + "\n\n" + "\n".join(table) + "\n"
    (args.out / "regime-map.md").write_text(text)
    plot(results, args.out / "regime-map.png")
    print(text)
    return 0 if all(math.isfinite(v) for s in results.values() for p in s.values() for v in p.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
