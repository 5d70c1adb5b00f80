"""Step time on paper, validated against the throughput benchmark, then extrapolated to GPU clusters.

    python -m benchmarks.model.step_time_model profile     # measure on this machine -> reports/step_model/profile.json
    python -m benchmarks.model.step_time_model validate       # the throughput cells (RESULTS)
    python -m benchmarks.model.step_time_model validate-tta   # the time-to-accuracy runs (TTA_RECORDS, TTA_LOOPBACK)
    python -m benchmarks.model.step_time_model predict     # 8..1024 workers at 1/10/25/100 Gbit/s, GPU-class compute

The model is ``pactrain_hvd.planner.step_model`` (alpha-beta ring collectives, Horovod's cycle and
fusion, overlap with backward). Each method becomes a ``StepPlan`` here: which tensors its hooks
hand Horovod and when (the measured gradient-ready fractions), what runs after backward, and
the CPU costs around them.

``validate`` predicts every cell of the results files twice:
- **A (cell's CPU phases)**: compute, compression and update are the cell's own medians; the
  model supplies the communication, its overlap with backward and the cycle waits.
- **B (independent)**: compute is the compute-only bound measured before the model's cells on
  that link; compression and update are the method's medians over that model's cells on all
  links; nothing of the cell itself enters.

``predict`` scales CPU compute to GPU class by FLOPs: a published ResNet-18 step time
(``GPU_REFERENCE``) gives an effective FLOP rate, applied to each model's counted FLOPs; the
method's CPU costs (compression, update) are divided by the same CPU/GPU ratio.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from dataclasses import replace
from pathlib import Path

from benchmarks.common.methods import parse_method
from pactrain_hvd.core import num_to_keep, should_pack
from pactrain_hvd.core.lanes import SCALE_BYTES, quantized_layout
from pactrain_hvd.core.plan import DEFAULT_MIN_NUMEL
from pactrain_hvd.planner.step_model import (
    ALLGATHER,
    ALLREDUCE,
    HorovodConfig,
    Link,
    Stage,
    StepPlan,
    Transfer,
    expected_step,
)

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ROOT / "reports" / "step_model" / "profile.json"
PNG = ROOT / "reports" / "step_model" / "scaling.png"
METHODS = ("dense", "fp16", "topk", "powersgd", "pactrain-0.9", "pactrain-0.9-fp16", "pactrain-0.9-ternary")
WORLD_SIZES = (8, 16, 32, 64, 128, 256, 512, 1024)
RATES_GBIT = (1, 10, 25, 100)
# Validation links: latency per message hop on the benchmark's veth + TCP + Gloo path (assumed, not measured).
BENCH_LATENCY_S = 50e-6
# The time-to-accuracy harness leaves Horovod's cycle time at its default (1 ms in 0.28.1).
TTA_CYCLE_TIME_S = 0.001
TTA_RECORDS = [ROOT / "bench" / "results" / "tta" / "record.json",
               ROOT / "bench" / "results" / "tta" / "part-20261204" / "record.json"]
TTA_LOOPBACK = ROOT / "reports" / "step_model" / "tta-loopback" / "record.json"
# GPU clusters (assumptions): per-hop latency of a TCP/RoCE data-centre network, TCP goodput
# over the nominal rate (the benchmark's 1gbit probe: 954.0 of 1000 Mbit/s), collectives in device
# memory (no host copy), per-worker batch.
GPU_LATENCY_S = 10e-6
GOODPUT = 0.954
GPU_BATCH = {"resnet18": 128, "vgg16": 128, "gpt": 16}
# Published GPU step time: ImageNet ResNet-18, batch 128, PyTorch, NVIDIA TITAN RTX, AVERAGE-BATCH-TIME
# 1.28 ms/image (github.com/cgnorthcutt/cnn-gpu-benchmarks, README, "AVERAGE-BATCH-TIME (ImageNet)").
GPU_REFERENCE = {"model": "imagenet-resnet18", "s_per_sample": 1.28e-3,
                 "source": "cgnorthcutt/cnn-gpu-benchmarks README: ImageNet ResNet-18, batch 128, TITAN RTX, 1.28 ms/image"}
TOPK_DENSITY, POWERSGD_RANK = 0.01, 4
RESULTS = [ROOT / "bench" / "results" / name for name in
           ("20261201-050029.json", "ternary-overlap/20261201-221511.json", "ternary-overlap/20261201-230902.json")]
# Cells measuring a design since replaced: ternary before its all-reduces started from the gradient hooks
# (then: a blocking MAX of the scales, then the codes, after backward); ternary-overlap/ measures today's.
SUPERSEDED = {"20261201-050029": ("pactrain-0.9-ternary",)}


# -- the methods as plans ---------------------------------------------------------------------


def numel(shape: list[int]) -> int:
    return math.prod(shape)


def powersgd_matrix(shape: list[int], rank: int = POWERSGD_RANK) -> tuple[int, int] | None:
    """(rows, cols) when PowerSGD compresses the tensor (baselines.PowerSGDCompressor.compressible)."""
    rows = shape[0] if shape else 1
    cols = numel(shape) // max(rows, 1)
    if len(shape) >= 2 and rows * cols >= DEFAULT_MIN_NUMEL and 2 * rank * (rows + cols) <= rows * cols:
        return rows, cols
    return None


def topk_k(count: int, density: float = TOPK_DENSITY) -> int:
    return max(1, math.ceil(density * count))


def payload_bytes(plan: StepPlan) -> int:
    """Bytes handed to Horovod per step (all-reduce + allgather contributions), for checking against results."""
    return sum(t.nbytes for t in plan.hooked) + sum(b for s in plan.stages for b, _, _ in s.transfers)


def build_plan(method: str, tensors: list[dict], world_size: int, forward_s: float, backward_s: float,
               compress_s: float, update_s: float, splits: dict) -> StepPlan:
    """``method``'s step: what its hooks send and when, what runs after backward, its CPU costs.

    ``compress_s`` is the method's compression + decompression at 2 workers; ``splits`` holds
    the measured proportions of Top-k's and PowerSGD's phases (``profile``).
    """
    spec = parse_method(method)
    plan = StepPlan(forward_s=forward_s, backward_s=backward_s, update_s=update_s)
    if spec.kind in ("dense", "fp16"):
        element, dtype = (2, "float16") if spec.fp16_values else (4, "float32")
        hooked = [Transfer(t["ready_fraction"], element * numel(t["shape"]), ALLREDUCE, dtype) for t in tensors]
        half = compress_s / 2  # fp16: one cast in the hook, one back after the all-reduce
        return replace(plan, hooked=hooked, hook_cpu_s=half, finish_s=half)
    if spec.kind == "topk":
        hooked = []
        for t in tensors:
            count = numel(t["shape"])
            if count < DEFAULT_MIN_NUMEL:
                hooked.append(Transfer(t["ready_fraction"], 4 * count))
            else:
                k = topk_k(count, spec.density)
                hooked += [Transfer(t["ready_fraction"], 4 * k, ALLGATHER, "float32"),
                           Transfer(t["ready_fraction"], 4 * k, ALLGATHER, "int32")]
        split = splits["topk"]
        unit = compress_s / (split["select_s"] + split["zero_s"] + 2 * split["scatter_per_worker_s"])
        finish = unit * (split["zero_s"] + world_size * split["scatter_per_worker_s"])  # one index_add per worker's pairs
        return replace(plan, hooked=hooked, hook_cpu_s=unit * split["select_s"], finish_s=finish)
    if spec.kind == "powersgd":
        p_bytes = q_bytes = dense = 0
        for t in tensors:
            matrix = powersgd_matrix(t["shape"], spec.rank)
            if matrix:
                p_bytes += 4 * spec.rank * matrix[0]
                q_bytes += 4 * spec.rank * matrix[1]
            else:
                dense += 4 * numel(t["shape"])
        split = splits["powersgd"]
        unit = compress_s / (split["project_p_s"] + split["project_q_s"] + split["reconstruct_s"])
        stages = [Stage(unit * split["project_p_s"], ((p_bytes + dense, ALLREDUCE, "float32"),)),
                  Stage(unit * split["project_q_s"], ((q_bytes, ALLREDUCE, "float32"),))]
        return replace(plan, stages=stages, finish_s=unit * split["reconstruct_s"])
    if spec.kind == "pactrain":
        layout = quantized_layout(world_size, spec.levels) if spec.quantized_values else None
        packed_element = 2 if (spec.fp16_values or (spec.quantized_values and layout is None)) else 4
        dense_element = 2 if spec.fp16_values else 4  # as the benchmark's runs handed them to Horovod (their payload check)
        hooked = []
        for t in tensors:
            count, ready = numel(t["shape"]), t["ready_fraction"]
            kept = num_to_keep(count, spec.sparsity) if len(t["shape"]) >= 2 else count
            packed = len(t["shape"]) >= 2 and should_pack(count, kept)
            if packed and layout is not None:  # from the hook: the codes' SUM and next step's scale (a MAX)
                hooked += [Transfer(ready, 4 * layout.words(kept), ALLREDUCE, "int32"),
                           Transfer(ready, SCALE_BYTES, ALLREDUCE, "float32-max")]
            elif packed:
                hooked.append(Transfer(ready, packed_element * kept, ALLREDUCE,
                                       "float16" if packed_element == 2 else "float32"))
            else:
                hooked.append(Transfer(ready, dense_element * count, ALLREDUCE,
                                       "float16" if dense_element == 2 else "float32"))
        # pack (or round to ternary) in the hook, unpack after the all-reduce
        return replace(plan, hooked=hooked, hook_cpu_s=compress_s / 2, finish_s=compress_s / 2)
    raise ValueError(f"no step plan for method {method!r}")


# -- profile ---------------------------------------------------------------------------------


def profile(out: Path) -> dict:
    import torch

    from benchmarks.micro import step_profile
    from benchmarks.runner.config import BATCH_SIZES

    torch.set_num_threads(1)  # as the benchmark's workers
    result = {"threads": 1, "models": {}, "copy_bytes_per_s": step_profile.copy_bytes_per_s(),
              "gpu_reference": dict(GPU_REFERENCE, flops_per_sample=step_profile.training_flops_per_sample(
                  GPU_REFERENCE["model"]))}
    for model in ("resnet18", "vgg16", "gpt"):
        entry = result["models"][model] = step_profile.bench_model_profile(model, BATCH_SIZES[model])
        print(f"{model}: forward {entry['forward_s'] * 1e3:.0f} ms, backward {entry['backward_s'] * 1e3:.0f} ms, "
              f"{entry['flops_per_sample'] / 1e9:.2f} GFLOP/sample, top-k {entry['topk']}, powersgd {entry['powersgd']}")
    result["workloads"] = {}
    for workload in ("image", "language"):
        entry = result["workloads"][workload] = step_profile.workload_profile(workload)
        print(f"time-to-accuracy {workload}: {entry['parameters'] / 1e6:.1f} M parameters, forward "
              f"{entry['forward_s'] * 1e3:.0f} ms, backward {entry['backward_s'] * 1e3:.0f} ms")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"copy {result['copy_bytes_per_s'] / 1e9:.2f} GB/s; wrote {out}")
    return result


# -- validate --------------------------------------------------------------------------------


def load_results(paths: list[Path]) -> list[tuple[str, dict]]:
    """(name, results) per file, without failed cells and cells of a design the model no longer describes."""
    loaded = []
    for path in paths:
        results = json.loads(path.read_text())
        gone = SUPERSEDED.get(path.stem, ())
        results["cells"] = [c for c in results["cells"] if "error" not in c and c["method"] not in gone]
        loaded.append((path.stem, results))
    return loaded


def validation_rows(results: dict, prof: dict, config: HorovodConfig) -> list[dict]:
    bounds = {(b["model"], b["link"]): b for b in results["bounds"]}
    cells = results["cells"]
    rows = []
    for cell in cells:
        model, link_label, method = cell["model"], cell["link"], cell["method"]
        entry = prof["models"][model]
        forward_share = entry["forward_s"] / (entry["forward_s"] + entry["backward_s"])
        link = Link(results["links"][link_label]["mbit_per_s"] * 1e6 / 8, BENCH_LATENCY_S, prof["copy_bytes_per_s"])
        size = results["meta"]["config"]["world_size"]
        same = [c for c in cells if c["model"] == model and c["method"] == method]
        phases = cell["phases_s"]
        bound = bounds[(model, link_label)]
        per_worker = bound["step_s_per_worker"]
        straggler = max(per_worker) - statistics.mean(per_worker)
        inputs = {
            "A": (phases["compute"], phases["compress"], phases["update"]),
            "B": (bound["compute_s"], statistics.median(c["phases_s"]["compress"] for c in same),
                  statistics.median(c["phases_s"]["update"] for c in same)),
        }
        row = {"model": model, "link": link_label, "method": method, "measured_s": cell["step_s"],
               "measured_wait_s": phases["comm_wait"]}
        for mode, (compute, compress, update) in inputs.items():
            plan = build_plan(method, entry["tensors"], size, compute * forward_share, compute * (1 - forward_share),
                              compress, update, entry)
            plan = replace(plan, straggler_s=straggler)
            if mode == "A":
                handed = cell["payload"]["allreduce_bytes"] + cell["payload"]["allgather_bytes"]
                if abs(payload_bytes(plan) - handed) > 0.001 * handed + 64:
                    raise AssertionError(f"{model}/{method}: plan hands {payload_bytes(plan)} B, the run {handed} B")
            prediction = expected_step(plan, size, link, config)
            row[f"pred_{mode}_s"] = prediction.step_s
            row[f"wait_{mode}_s"] = prediction.comm_wait_s
        rows.append(row)
    return rows


def validation_table(rows: list[dict]) -> str:
    lines = ["| run | model | link | method | measured step ms | A: predicted ms | A: error | B: predicted ms | B: error "
             "| measured comm wait ms | A: predicted wait ms |",
             "|---|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        error_a = r["pred_A_s"] / r["measured_s"] - 1
        error_b = r["pred_B_s"] / r["measured_s"] - 1
        lines.append(f"| {r['run']} | {r['model']} | {r['link']} | {r['method']} | {r['measured_s'] * 1e3:.0f} | "
                     f"{r['pred_A_s'] * 1e3:.0f} | {error_a:+.1%} | {r['pred_B_s'] * 1e3:.0f} | {error_b:+.1%} | "
                     f"{r['measured_wait_s'] * 1e3:.0f} | {r['wait_A_s'] * 1e3:.0f} |")
    return "\n".join(lines)


def validation_summary(rows: list[dict], tolerance: float = 0.15) -> str:
    out = []
    for mode in ("A", "B"):
        errors = [(abs(r[f"pred_{mode}_s"] / r["measured_s"] - 1), r) for r in rows if f"pred_{mode}_s" in r]
        if not errors:
            continue
        within = sum(e <= tolerance for e, _ in errors)
        worst, row = max(errors, key=lambda pair: pair[0])
        where = row.get("cell") or f"{row['model']}/{row['link']}"
        out.append(f"{mode}: {within}/{len(errors)} cells within {tolerance:.0%}; median |error| "
                   f"{statistics.median(e for e, _ in errors):.1%}; worst {worst:.1%} ({where}/{row['method']})")
    return "\n".join(out)


def last_third(series: list[float]) -> float:
    """Median of a run's last third of steps: PacTrain's masks are final there."""
    return statistics.median(series[len(series) - max(1, len(series) // 3):])


def tta_rows(record: dict, loopback: dict, prof: dict) -> list[dict]:
    """Predicted against measured step time for every Horovod run of a time-to-accuracy record.

    - **A** (where the run recorded its phases): compute, compression and update are the run's own
      medians over its last third; the model supplies the communication.
    - **B**: compute is the cell's concurrent bound (all workers training at once, no communication);
      compression and update come from ``loopback``, a short run of the same workload, method and
      workers on loopback (``tta --loopback``); nothing of the run itself enters.
    """
    config = HorovodConfig(cycle_time_s=TTA_CYCLE_TIME_S)
    loops = {(c["workload"], c["workers"]): c for c in loopback["cells"].values()}
    rows = []
    for key, cell in record["cells"].items():
        entry = prof["workloads"][cell["workload"]]
        forward_share = entry["forward_s"] / (entry["forward_s"] + entry["backward_s"])
        link = Link(cell["probed_mbit_per_s"] * 1e6 / 8, BENCH_LATENCY_S, prof["copy_bytes_per_s"])
        size, bound = cell["workers"], cell["bound"]
        loop = loops.get((cell["workload"], size))
        for method, run in cell["runs"].items():
            if parse_method(method).frontend != "horovod":
                continue  # DDP's buckets and comm hooks are not modelled
            inputs = {}
            if "phases_s" in run:
                inputs["A"] = tuple(last_third(run["phases_s"][p]) for p in ("compute", "compress", "update"))
            if loop and method in loop["runs"]:
                phases = loop["runs"][method]["phases_s"]
                # the bound's own split where it recorded one, else the loopback bound's
                split = bound if "compute_s" in bound else loop["bound"]
                compute = bound["step_s"] * split["compute_s"] / split["step_s"]
                inputs["B"] = (compute, last_third(phases["compress"]), last_third(phases["update"]))
            row = {"cell": key, "method": method, "measured_s": last_third(run["step_s"])}
            for mode, (compute, compress, update) in inputs.items():
                plan = build_plan(method, entry["tensors"], size, compute * forward_share, compute * (1 - forward_share),
                                  compress, update, entry)
                row[f"pred_{mode}_s"] = expected_step(plan, size, link, config).step_s
            rows.append(row)
    return rows


def tta_table(rows: list[dict]) -> str:
    def cell(row: dict, mode: str) -> str:
        predicted = row.get(f"pred_{mode}_s")
        return "- | -" if predicted is None else f"{predicted * 1e3:.0f} | {predicted / row['measured_s'] - 1:+.1%}"

    lines = ["| cell | method | measured step ms (last third) | A: predicted ms | A: error | B: predicted ms | B: error |",
             "|---|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['cell']} | {r['method']} | {r['measured_s'] * 1e3:.0f} | {cell(r, 'A')} | {cell(r, 'B')} |"
              for r in rows]
    return "\n".join(lines)


# -- predict ---------------------------------------------------------------------------------


def gpu_rows(results: dict, prof: dict, config: HorovodConfig, models: list[str], methods: list[str]) -> list[dict]:
    reference = prof["gpu_reference"]
    gpu_flops_per_s = reference["flops_per_sample"] / reference["s_per_sample"]
    cells = [c for c in results["cells"] if "error" not in c]
    rows = []
    for model in models:
        entry = prof["models"][model]
        # the cells' CPU costs were measured under the benchmark's load: compare them with its bounds
        cpu_per_sample = statistics.median(b["compute_s"] for b in results["bounds"] if b["model"] == model) \
            / entry["batch_size"]
        gpu_per_sample = entry["flops_per_sample"] / gpu_flops_per_s
        factor = cpu_per_sample / gpu_per_sample
        batch = GPU_BATCH[model]
        forward_share = entry["forward_s"] / (entry["forward_s"] + entry["backward_s"])
        compute = gpu_per_sample * batch
        for method in methods:
            same = [c for c in cells if c["model"] == model and c["method"] == method]
            compress = statistics.median(c["phases_s"]["compress"] for c in same) / factor
            update = statistics.median(c["phases_s"]["update"] for c in same) / factor
            for rate in RATES_GBIT:
                link = Link.gbit(rate * GOODPUT, GPU_LATENCY_S)
                for n in WORLD_SIZES:
                    plan = build_plan(method, entry["tensors"], n, compute * forward_share, compute * (1 - forward_share),
                                      compress, update, entry)
                    prediction = expected_step(plan, n, link, config)
                    rows.append({"model": model, "method": method, "gbit": rate, "workers": n, "factor": factor,
                                 "batch": batch, "compute_s": compute, "step_s": prediction.step_s,
                                 "samples_per_s": n * batch / prediction.step_s,
                                 "efficiency": compute / prediction.step_s})
    return rows


def prediction_tables(rows: list[dict], models: list[str], methods: list[str]) -> str:
    out = []
    index = {(r["model"], r["method"], r["gbit"], r["workers"]): r for r in rows}
    for model in models:
        sample = next(r for r in rows if r["model"] == model)
        out.append(f"**{model}**, batch {sample['batch']} per worker, GPU compute {sample['compute_s'] * 1e3:.1f} ms/step "
                   f"(CPU/GPU factor {sample['factor']:.0f}x): samples/s over all workers (scaling efficiency = compute / step)")
        out.append("")
        out.append("| Gbit/s | workers | " + " | ".join(methods) + " | pactrain best / topk | pactrain best / powersgd |")
        out.append("|---:|---:|" + "---:|" * (len(methods) + 2))
        for rate in RATES_GBIT:
            for n in WORLD_SIZES:
                cells = [index[(model, m, rate, n)] for m in methods]
                best = max((c for c in cells if c["method"].startswith("pactrain")), key=lambda c: c["samples_per_s"])
                by = {c["method"]: c for c in cells}
                ratios = [f"{best['samples_per_s'] / by[m]['samples_per_s']:.2f} ({best['method'][len('pactrain-'):]})"
                          if m in by else "-" for m in ("topk", "powersgd")]
                out.append(f"| {rate} | {n} | " + " | ".join(f"{c['samples_per_s']:.0f} ({c['efficiency']:.0%})" for c in cells)
                           + " | " + " | ".join(ratios) + " |")
        out.append("")
    return "\n".join(out)


def plot(rows: list[dict], models: list[str], methods: list[str], png: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(models), len(RATES_GBIT), figsize=(4 * len(RATES_GBIT), 3.4 * len(models)),
                             sharex=True, squeeze=False)
    for i, model in enumerate(models):
        for j, rate in enumerate(RATES_GBIT):
            ax = axes[i][j]
            for method in methods:
                points = sorted((r["workers"], r["efficiency"]) for r in rows
                                if r["model"] == model and r["method"] == method and r["gbit"] == rate)
                ax.plot(*zip(*points), marker="o", markersize=3, label=method)
            ax.set_xscale("log", base=2)
            ax.set_ylim(0, 1)
            ax.set_title(f"{model}, {rate} Gbit/s", fontsize=9)
            ax.grid(True, which="both", alpha=0.3)
            if j == 0:
                ax.set_ylabel("throughput / compute-only bound")
            if i == len(models) - 1:
                ax.set_xlabel("workers")
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Step-time model: predicted throughput, GPU-class compute (benchmarks/model/step_time_model.py predict)", fontsize=10)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", nargs="?", default="all",
                        choices=("profile", "validate", "validate-tta", "predict", "all"))
    parser.add_argument("--results", type=Path, nargs="+", default=RESULTS,
                        help="throughput results; the first one's compute bounds scale predict to GPU class")
    parser.add_argument("--profile", type=Path, default=PROFILE)
    parser.add_argument("--tta-records", type=Path, nargs="+", default=TTA_RECORDS)
    parser.add_argument("--tta-loopback", type=Path, default=TTA_LOOPBACK,
                        help="the same workloads and methods on loopback (CPU phases for B)")
    parser.add_argument("--png", type=Path, default=PNG)
    parser.add_argument("--models", default="resnet18,vgg16", help="models for predict")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--cycle-ms", type=float, default=None, help="Horovod cycle time (default: the results')")
    args = parser.parse_args(argv)
    if args.command == "profile":
        profile(args.profile)
        return 0
    prof = json.loads(args.profile.read_text())
    runs = load_results(args.results)
    cycles_ms = {args.cycle_ms if args.cycle_ms is not None else r["meta"]["config"]["cycle_time_ms"] for _, r in runs}
    if len(cycles_ms) > 1:
        raise SystemExit(f"--results ran at different cycle times {sorted(cycles_ms)} ms: pass --cycle-ms")
    cycle_ms = cycles_ms.pop()
    config = HorovodConfig(cycle_time_s=cycle_ms / 1e3)
    methods = [m for m in args.methods.split(",") if m]
    if args.command in ("validate", "all"):
        rows = [dict(row, run=name) for name, results in runs for row in validation_rows(results, prof, config)]
        print(f"Validation against {', '.join(name for name, _ in runs)} ({len(rows)} cells, cycle {cycle_ms:g} ms, "
              f"latency {BENCH_LATENCY_S * 1e6:.0f} us/hop, host copy {prof['copy_bytes_per_s'] / 1e9:.1f} GB/s)\n")
        print(validation_table(rows))
        print("\n" + validation_summary(rows) + "\n")
    if args.command in ("validate-tta", "all"):
        loopback = json.loads(args.tta_loopback.read_text())
        rows = [dict(row, cell=f"{path.parent.name}: {row['cell']}") for path in args.tta_records
                for row in tta_rows(json.loads(path.read_text()), loopback, prof)]
        print(f"Validation against the time-to-accuracy records {', '.join(str(p.relative_to(ROOT) if p.is_relative_to(ROOT) else p) for p in args.tta_records)} "
              f"({len(rows)} runs, cycle {TTA_CYCLE_TIME_S * 1e3:g} ms, CPU phases for B from {args.tta_loopback.parent.name})\n")
        print(tta_table(rows))
        print("\n" + validation_summary(rows) + "\n")
    if args.command in ("predict", "all"):
        models = [m for m in args.models.split(",") if m]
        primary = runs[0][1]
        results = dict(primary, cells=[c for _, r in runs for c in r["cells"]])  # the first one's bounds
        rows = gpu_rows(results, prof, config, models, methods)
        reference = prof["gpu_reference"]
        print(f"GPU-class compute: {reference['source']}; {reference['flops_per_sample'] / 1e9:.2f} GFLOP/sample "
              f"-> {reference['flops_per_sample'] / reference['s_per_sample'] / 1e12:.1f} TFLOP/s effective. "
              f"Latency {GPU_LATENCY_S * 1e6:.0f} us/hop, goodput {GOODPUT:.3f} of the rate, cycle {cycle_ms:g} ms.\n")
        print(prediction_tables(rows, models, methods))
        plot(rows, models, methods, args.png)
        print(f"wrote {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
