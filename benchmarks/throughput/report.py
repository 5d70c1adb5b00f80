"""Results document -> markdown tables, the expectations checked and PNG plots.

    python -m benchmarks --report-only bench/results/<timestamp>.json
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from benchmarks.common.methods import TF_FRONTENDS, parse_method
from pactrain_hvd.core.accounting import ring_allreduce_bytes

PEERS = ("dense", "fp16", "topk", "powersgd")
TARGET_METHOD = "pactrain-0.9-fp16"
TARGET_MODELS = ("resnet18", "vgg16")
TARGET_LINKS = ("100mbit", "1gbit")


def _cells(results: dict) -> list[dict]:
    return [cell for cell in results["cells"] if "error" not in cell]


def find(results: dict, model: str, link: str, method: str) -> dict | None:
    for cell in _cells(results):
        if (cell["model"], cell["link"], cell["method"]) == (model, link, method):
            return cell
    return None


def links_by_rate(results: dict) -> list[str]:
    """Link labels, slowest probed first."""
    return sorted(results["links"], key=lambda label: results["links"][label]["mbit_per_s"])


def minimum_payload_bytes(cell: dict) -> int | None:
    """PacTrain's floor: element size x (surviving values of packed tensors + every tensor sent dense).

    The plan keeps small prunable tensors dense on purpose (see ``core/plan.py``), so they are
    part of the minimum: the fewest bytes this plan can send; ``tensors`` come from ``opt.stats()``.
    """
    stats = cell.get("pactrain_stats")
    if not stats:
        return None
    element = 2 if parse_method(cell["method"]).fp16_values else 4
    return sum((t["kept"] if t["packed"] else t["numel"]) * element for t in stats["tensors"].values())


def _fmt(value: float | None, spec: str = ".2f") -> str:
    return "–" if value is None else format(value, spec)


def _rounds(cell: dict) -> str:
    rounds = cell.get("rounds") or []
    return f" ({', '.join(_fmt(r, '.1f') for r in rounds)})" if len(rounds) > 1 else ""


def dense_peer(method: str) -> str:
    """The dense method a cell's *x dense* compares with: its framework's (``tf-dense`` for ``tf-`` methods)."""
    frontend = parse_method(method).frontend
    return f"{frontend}-dense" if frontend in TF_FRONTENDS else "dense"


def over_dense(results: dict, cell: dict) -> float | None:
    dense = find(results, cell["model"], cell["link"], dense_peer(cell["method"]))
    return cell["samples_per_s"] / dense["samples_per_s"] if dense else None


def _phases(cell: dict) -> str:
    phases = cell["phases_s"]
    if cell.get("phases_in_graph"):  # TensorFlow: one graph per step, the rest after forward and backward
        return f"{_fmt(phases['compute'] * 1e3, '.0f')} / – / {_fmt(phases['comm_wait'] * 1e3, '.0f')} in graph / –"
    return " / ".join("in backward" if p == "comm_wait" and cell.get("comm_in_backward") else _fmt(phases[p] * 1e3, ".0f")
                      for p in ("compute", "compress", "comm_wait", "update"))


def cell_row(results: dict, cell: dict) -> str:
    vs_dense = over_dense(results, cell)
    return ("| " + " | ".join([
        cell["model"], cell["link"], cell["method"], _fmt(cell["samples_per_s"]) + _rounds(cell),
        _fmt(cell["ratio_to_bound"]),
        _fmt(vs_dense), _fmt(cell["step_s"] * 1e3, ".0f"), _phases(cell),
        _fmt(cell["ideal_ring_bytes_per_worker"] / 1e6, ".3f"), _fmt(cell["wire_tx_bytes_per_step"] / 1e6, ".3f"),
        f"{_fmt(cell['wire_over_ideal'], '.3f')} ({_fmt(cell.get('data_over_ideal'), '.3f')})",
        _fmt(cell["ideal_wire_s"] * 1e3, ".0f"),
    ]) + " |")


TABLE_HEADER = (
    "| model | link | method | samples/s | x bound | x dense | step ms | compute / compress / comm wait / update ms "
    "| ideal MB/worker | wire tx MB/worker | wire/ideal (less control) | ideal wire ms |\n"
    "|---|---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|"
)


def results_table(results: dict) -> str:
    order = {label: i for i, label in enumerate(links_by_rate(results))}
    methods = results["meta"]["config"]["methods"]
    cells = sorted(_cells(results), key=lambda c: (c["model"], order.get(c["link"], 99),
                                                   methods.index(c["method"]) if c["method"] in methods else 99))
    return "\n".join([TABLE_HEADER, *(cell_row(results, cell) for cell in cells)])


def evaluate_targets(results: dict) -> list[dict]:
    """Expectations of PacTrain (0.9, fp16 values) a reader may hold, each with the measured value and whether it holds."""
    verdicts = []

    def verdict(target: str, model: str, link: str, value: float | None, threshold: float, note: str = "") -> None:
        verdicts.append({"target": target, "model": model, "link": link, "value": value, "threshold": threshold,
                         "met": value is not None and value >= threshold, "note": note})

    for model in TARGET_MODELS:
        for link in TARGET_LINKS:
            cell = find(results, model, link, TARGET_METHOD)
            if cell is None:
                continue
            verdict(">= 0.9x concurrent compute bound", model, link, cell["ratio_to_bound"], 0.9)
            peers = {m: find(results, model, link, m) for m in PEERS}
            peers = {m: c for m, c in peers.items() if c}
            if peers:
                best = max(peers, key=lambda m: peers[m]["samples_per_s"])
                verdict("never slower than any peer", model, link, cell["samples_per_s"] / peers[best]["samples_per_s"],
                        1.0, f"fastest peer: {best}")
            if "topk" in peers:
                verdict(">= 1.25x Top-k", model, link, cell["samples_per_s"] / peers["topk"]["samples_per_s"], 1.25)
    cell, dense = find(results, "vgg16", "100mbit", TARGET_METHOD), find(results, "vgg16", "100mbit", "dense")
    if cell and dense:
        verdict(">= 8x dense", "vgg16", "100mbit", cell["samples_per_s"] / dense["samples_per_s"], 8.0)
    for cell in _cells(results):
        if cell["method"] != TARGET_METHOD or cell["link"] not in TARGET_LINKS:
            continue
        minimum = minimum_payload_bytes(cell)
        size = results["meta"]["config"]["world_size"]
        handed = cell["payload"]["allreduce_bytes"]
        verdict("payload within 2% of minimum (min / handed)", cell["model"], cell["link"], minimum / handed, 0.98,
                f"{handed} B handed to Horovod, minimum {minimum} B")
        ring_minimum = ring_allreduce_bytes(minimum, size)
        tx = cell["wire_tx_bytes_per_step"]
        verdict("NIC tx bytes within 2% of ring(minimum) (ring(min) / tx)", cell["model"], cell["link"],
                ring_minimum / tx, 0.98, "tx counts every frame: Ethernet/IP/TCP headers, ACKs, Horovod's control loop")
        if "control_tx_bytes_per_step" in cell:
            verdict("same, less control traffic (ring(min) / (tx - control))", cell["model"], cell["link"],
                    ring_minimum / (tx - cell["control_tx_bytes_per_step"]), 0.98,
                    f"control: {cell['control_tx_bytes_per_step'] / 1e6:.3f} MB per step")
    return verdicts


def targets_table(verdicts: list[dict]) -> str:
    lines = ["| expectation | model | link | measured | needed | holds | note |", "|---|---|---|---:|---:|---|---|"]
    for v in verdicts:
        lines.append(f"| {v['target']} | {v['model']} | {v['link']} | {_fmt(v['value'], '.3f')} | {v['threshold']:g} "
                     f"| {'yes' if v['met'] else '**no**'} | {v['note']} |")
    return "\n".join(lines)


def header(results: dict) -> str:
    meta, config = results["meta"], results["meta"]["config"]
    lines = [
        f"# PacTrain benchmark, {meta['started']}", "",
        f"{config['world_size']} workers, one network namespace and emulated NIC each (tbf both directions), "
        f"Horovod {meta['horovod']} over Gloo, torch {meta['torch']}, {config['threads']} thread(s) per worker, "
        f"{meta['cpu_count']} CPUs (load average at start {meta['loadavg_start'][0]:.2f}, end "
        f"{meta.get('loadavg_end', [float('nan')])[0]:.2f}). {config['warmup']} warm-up + {config['steps']} timed "
        f"steps per cell; figures are medians over the timed steps (a step ends when the slowest rank's does)"
        + (f"; {config['repeats']} interleaved rounds per model and link, each figure (bounds included) the best "
           "round's." if config.get("repeats", 1) > 1 else "."),
        "", f"Horovod cycle time: {config.get('cycle_time_ms') or 'default (1)'} ms, fusion threshold: "
        f"{meta.get('horovod_knobs', {}).get('HOROVOD_FUSION_THRESHOLD', 'default (128 MiB)')}, the same for every method.",
        "", "Batch sizes per worker: " + ", ".join(f"{m} {config['batch_sizes'][m]}" for m in config["models"]) + ".",
        "", "| link | probed Mbit/s (min over ranks) | per rank | qdisc |", "|---|---:|---|---|",
    ]
    for label in links_by_rate(results):
        link = results["links"][label]
        per_rank = ", ".join(f"{p['mbit_per_s']:.1f}" for p in link["probes"])
        lines.append(f"| {label} | {link['mbit_per_s']:.1f} | {per_rank} | `{link['qdisc'] or 'none'}` |")
    lines += ["", "Concurrent compute bound, measured before each model's cells on each link "
              "(the machine is shared, its load drifts):", "",
              "| model | framework | measured before link | bound samples/s | step s per worker |", "|---|---|---|---:|---:|"]
    for bound in results["bounds"]:
        lines.append(f"| {bound['model']} | {bound.get('framework', 'torch')} | {bound['link']} | "
                     f"{bound['samples_per_s']:.2f} | {bound['step_s']:.3f} |")
    return "\n".join(lines)


def failures(results: dict) -> str:
    failed = [c for c in results["cells"] if "error" in c and c["error"] != "skipped by --skip"]
    if not failed:
        return ""
    lines = ["", "## Cells that did not run", ""]
    for cell in failed:
        first = cell["error"].splitlines()[0] if cell["error"] else "?"
        lines.append(f"- {cell['model']} {cell['link']} {cell['method']}: {first}")
    return "\n".join(lines)


COLUMNS_NOTE = """Columns: *x bound* = samples/s over the concurrent compute bound (the same number of plain-torch
workers at once, no communication); *x dense* = over `dense` on the same model and link; phases are
per-rank medians (compress includes decompress; comm wait is time blocked in `synchronize`);
*ideal MB/worker* = bytes one worker must send per step for what the method hands Horovod
(ring all-reduce 2(n-1)/n B, ring allgather (n-1) B); *wire tx MB/worker* = the NIC's kernel tx
counter over the timed steps / steps (all frames: Ethernet/IP/TCP headers, ACKs, Horovod's
negotiation); *wire/ideal* = that over the ideal bytes, and in brackets the same after
subtracting the control traffic (the NIC's tx rate during forward passes, when no method has a
tensor in flight, times the step time: Horovod's 1 ms coordination loop); *ideal wire ms* = ideal
bytes at the probed link rate. TensorFlow cells (`tf-`: a `tf.function` tape loop, `keras-`: `model.fit`)
are against TensorFlow's own compute bound and dense method; a TensorFlow step is one graph, so its
phases are forward + backward (timed alone, on every rank at once) and the rest of the step *in graph*
(reduction, packing, update); its control traffic is not estimated (no separate forward window)."""


def framework_rows(results: dict) -> list[dict]:
    """Each method beside its TensorFlow runs on the same model and link: samples/s, x bound and x dense per
    framework, the TensorFlow speed-up over torch's (x dense over x dense), and the TensorFlow step's costs."""
    rows = []
    for cell in _cells(results):
        spec = parse_method(cell["method"])
        if spec.frontend not in TF_FRONTENDS:
            continue
        base = cell["method"].partition("-")[2]
        torch_cell = find(results, cell["model"], cell["link"], base)
        tf_over, torch_over = over_dense(results, cell), over_dense(results, torch_cell) if torch_cell else None
        rows.append({
            "model": cell["model"], "link": cell["link"], "method": cell["method"], "torch_method": base,
            "samples_per_s": cell["samples_per_s"], "ratio_to_bound": cell["ratio_to_bound"], "over_dense": tf_over,
            "torch_samples_per_s": torch_cell["samples_per_s"] if torch_cell else None,
            "torch_ratio_to_bound": torch_cell["ratio_to_bound"] if torch_cell else None, "torch_over_dense": torch_over,
            "speedup_vs_torch": tf_over / torch_over if tf_over and torch_over else None,
            "wire_tx_bytes_per_step": cell["wire_tx_bytes_per_step"],
            "torch_wire_tx_bytes_per_step": torch_cell["wire_tx_bytes_per_step"] if torch_cell else None,
            "compute_s": cell["phases_s"]["compute"], "rest_s": cell["phases_s"]["comm_wait"],
            "torch_comm_wait_s": torch_cell["phases_s"]["comm_wait"] if torch_cell else None,
            "pack_unpack_s": cell.get("pack_unpack_s"),
            "traces": (cell.get("traces_first_call"), cell.get("traces")),
        })
    return rows


def framework_table(results: dict) -> str:
    rows = framework_rows(results)
    if not rows:
        return ""
    lines = ["| model | link | TF method | samples/s | x bound | x dense | torch samples/s | torch x bound | torch x dense "
             "| TF x dense / torch x dense | wire tx MB TF / torch | TF compute / rest in graph ms | torch comm wait ms "
             "| pack+unpack ms | traces (first call, end) |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|---:|---:|---|"]
    for r in rows:
        traces = "–" if r["traces"][1] is None else f"{r['traces'][0]}, {r['traces'][1]}"
        lines.append("| " + " | ".join([
            r["model"], r["link"], r["method"], _fmt(r["samples_per_s"]), _fmt(r["ratio_to_bound"]), _fmt(r["over_dense"]),
            _fmt(r["torch_samples_per_s"]), _fmt(r["torch_ratio_to_bound"]), _fmt(r["torch_over_dense"]),
            _fmt(r["speedup_vs_torch"]),
            f"{_fmt(r['wire_tx_bytes_per_step'] / 1e6, '.3f')} / "
            f"{_fmt(r['torch_wire_tx_bytes_per_step'] and r['torch_wire_tx_bytes_per_step'] / 1e6, '.3f')}",
            f"{_fmt(r['compute_s'] * 1e3, '.0f')} / {_fmt(r['rest_s'] * 1e3, '.0f')}",
            _fmt(r["torch_comm_wait_s"] and r["torch_comm_wait_s"] * 1e3, ".0f"),
            _fmt(r["pack_unpack_s"] and r["pack_unpack_s"] * 1e3, ".1f"), traces]) + " |")
    return "\n".join(lines)


FRAMEWORK_NOTE = """Each TensorFlow method beside the torch method of the same name on the same model and link. *x bound*
and *x dense* are against each framework's own compute bound and dense method; *TF x dense / torch x dense*
compares the two speed-ups. *pack+unpack*: packing and unpacking every pruned gradient with the final masks,
no reduction between (fp16 packing's path; ternary encodes elsewhere). *traces*: the step function's
traces after its first call and at the end of the cell (equal: no retracing)."""


def markdown(results: dict, plots: list[str] | None = None) -> str:
    parts = [header(results), "", "## Results", "", results_table(results), "", COLUMNS_NOTE, "",
             "## Expectations checked (PacTrain 0.9, fp16 values)", "", targets_table(evaluate_targets(results))]
    if framework_rows(results):
        parts += ["", "## TensorFlow beside torch", "", framework_table(results), "", FRAMEWORK_NOTE]
    parts.append(failures(results))
    if plots:
        parts += ["", "## Plots", ""] + [f"![{Path(p).stem}]({Path(p).name})" for p in plots]
    return "\n".join(parts) + "\n"


def plot(results: dict, prefix: Path) -> list[Path]:
    """``<prefix>-throughput.png`` (samples/s vs link, per model) and ``<prefix>-bytes.png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = results["meta"]["config"]["models"]
    methods = results["meta"]["config"]["methods"]
    links = links_by_rate(results)
    paths = []
    figure, axes = plt.subplots(1, len(models), figsize=(5.5 * len(models), 4.2), squeeze=False)
    for axis, model in zip(axes[0], models):
        for method in methods:
            points = [(i, find(results, model, link, method)) for i, link in enumerate(links)]
            points = [(i, c["samples_per_s"]) for i, c in points if c]
            if points:
                axis.plot(*zip(*points), marker="o", label=method,
                          linewidth=2.5 if method.startswith("pactrain") else 1.2)
        bounds = [b["samples_per_s"] for b in results["bounds"] if b["model"] == model]
        if bounds:
            axis.axhline(max(bounds), color="black", linestyle="--", label="compute bound (best)")
        axis.set_xticks(range(len(links)), [f"{label}\n{results['links'][label]['mbit_per_s']:.0f} Mbit/s" for label in links])
        axis.set_title(model)
        axis.set_ylabel("samples/s (all workers)")
        axis.set_ylim(bottom=0)
    axes[0][-1].legend(fontsize=7, loc="best")
    figure.tight_layout()
    paths.append(prefix.with_name(prefix.name + "-throughput.png"))
    figure.savefig(paths[-1], dpi=110)
    plt.close(figure)

    figure, axes = plt.subplots(1, len(models), figsize=(5.5 * len(models), 4.2), squeeze=False)
    for axis, model in zip(axes[0], models):
        names, wire, ideal = [], [], []
        for method in methods:
            cell = next((find(results, model, link, method) for link in links if find(results, model, link, method)), None)
            if cell:
                names.append(method)
                wire.append(cell["wire_tx_bytes_per_step"] / 1e6)
                ideal.append(cell["ideal_ring_bytes_per_worker"] / 1e6)
        axis.bar(range(len(names)), wire, label="NIC tx counter")
        axis.scatter(range(len(names)), ideal, color="red", marker="_", s=200, label="ideal ring bytes", zorder=3)
        axis.set_xticks(range(len(names)), names, rotation=60, ha="right", fontsize=7)
        axis.set_yscale("log")
        axis.set_title(f"{model}: bytes sent per worker per step")
        axis.set_ylabel("MB")
    axes[0][-1].legend(fontsize=7)
    figure.tight_layout()
    paths.append(prefix.with_name(prefix.name + "-bytes.png"))
    figure.savefig(paths[-1], dpi=110)
    plt.close(figure)
    return paths


def write_outputs(results: dict, out_dir: Path, stamp: str) -> dict[str, Path]:
    """``<stamp>.json``, ``<stamp>.md``, ``latest.md``, ``latest.json`` and the plots under ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / f"{stamp}.json", "md": out_dir / f"{stamp}.md"}
    paths["json"].write_text(json.dumps(results, indent=1))
    plots = plot(results, out_dir / stamp) if _cells(results) else []
    paths["md"].write_text(markdown(results, [str(p) for p in plots]))
    shutil.copyfile(paths["md"], out_dir / "latest.md")
    shutil.copyfile(paths["json"], out_dir / "latest.json")
    paths.update({f"plot{i}": p for i, p in enumerate(plots)})
    return paths
