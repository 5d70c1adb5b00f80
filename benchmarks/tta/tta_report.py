"""The time-to-accuracy report from the record of ``tta.py``: one table and one plot per cell.

Targets, per cell: dense fp16's final metric less 0.5 pp of accuracy (or 3 % more perplexity; a part
without an fp16 run takes fp16's final from another part's record, ``tta --reference``), and a
lower one that every method which did all its steps reaches (the worst final metric of those runs, if
below the first; a run a wall-clock budget stopped does not set it). *At
budget*: each method's metric at the training time of the fastest run, the same wall clock for
all (dense has done fewer steps by then). Training time excludes evaluation. *x bound* is a run's
throughput over the concurrent compute bound; *last third* the same from the median step time of
its last third of steps (PacTrain's masks are final by then).
"""

from __future__ import annotations

import statistics
from pathlib import Path

from benchmarks.common.methods import parse_method

PEER_KINDS = ("fp16", "topk", "dgc", "randomk", "powersgd")  # at any density or rank; on DDP: torch's own fp16 and PowerSGD hooks


def is_peer(method: str) -> bool:
    return parse_method(method).kind in PEER_KINDS


def is_pactrain(method: str) -> bool:
    return parse_method(method).kind == "pactrain"  # on Horovod or on DDP


def run_bound(run: dict, cell: dict) -> dict | None:
    """The bound measured in the run's own part of the cell (older records: the cell's one)."""
    return run.get("bound") or cell.get("bound")


def higher_is_better(metric: str) -> bool:
    return metric != "val_perplexity"


def loosen(value: float, metric: str) -> float:
    """The first target from fp16's final value: 0.5 pp below in accuracy, 3 % above in perplexity."""
    return value - 0.005 if higher_is_better(metric) else value * 1.03


def reaches(value: float, target: float, metric: str) -> bool:
    return value >= target if higher_is_better(metric) else value <= target


def time_to(curve: list[list[float]], target: float, metric: str) -> float | None:
    """Training seconds at the first evaluation that meets ``target`` (None: never)."""
    return next((seconds for seconds, _, value, _ in curve if reaches(value, target, metric)), None)


def at_budget(curve: list[list[float]], budget_s: float) -> float | None:
    """The metric of the last evaluation within ``budget_s`` of training."""
    within = [value for seconds, _, value, _ in curve if seconds <= budget_s * 1.0001]
    return within[-1] if within else None


REFERENCES = ("fp16", "ddp-fp16", "tf-fp16", "dense", "ddp", "tf-dense")  # the first in a cell sets its target


def completed(run: dict, cell: dict) -> bool:
    """Whether a run did the cell's steps (a wall-clock budget can stop it earlier)."""
    return run["steps"] >= cell.get("steps", run["steps"])


def own_reference(cell: dict) -> str | None:
    """The cell's first fp16 (else DDP fp16, dense) run that did all the cell's steps."""
    return next((m for m in REFERENCES if m in cell["runs"] and completed(cell["runs"][m], cell)), None)


def reference_final(cell: dict) -> tuple[float, str]:
    """The final metric the first target loosens, and whose it is: the cell's own fp16 run (else DDP's fp16,
    dense) if it did all the steps; else one adopted from another record of the same steps (``tta --reference``:
    a final metric does not depend on the link or the machine's load, only its times do; an unconstrained
    loopback run serves every link); else the cell's first run."""
    runs = cell["runs"]
    own = own_reference(cell)
    if own is not None:
        return runs[own]["curve"][-1][2], f"{own}'s final"
    if "reference" in cell:
        adopted = cell["reference"]
        return adopted["final"], f"{adopted['method']}'s final in {adopted['record']}"
    first = next(iter(runs))
    return runs[first]["curve"][-1][2], f"{first}'s final (no fp16 run)"


def worker_batches(cell: dict) -> list[int]:
    """The per-worker batches the cell's runs recorded, each once."""
    return sorted({run["batch_size"] for run in cell.get("runs", {}).values() if "batch_size" in run})


def global_batch(cell: dict) -> int | None:
    """Samples a step over all workers (the recipe's learning rate follows it, not the number of workers)."""
    batches = worker_batches(cell)
    recorded = all("batch_size" in run for run in cell.get("runs", {}).values())
    return cell.get("workers", 0) * batches[0] if len(batches) == 1 and recorded else None


def adopt_reference(record: dict, other: dict, name: str) -> None:
    """Give each cell of ``record`` without a complete fp16 (or DDP fp16, dense) run the final metric of that
    run in ``other``'s same cell (or, failing that, in a loopback cell of ``other`` with the same workload,
    global batch and steps), so that a part re-running only some methods, or one whose fp16 a wall-clock budget
    stopped, is judged on the target of an unconstrained run of the same steps. The reference's curve is kept:
    it bounds a budget-stopped fp16's time to the target from below."""
    for key, cell in record["cells"].items():
        if own_reference(cell) is not None:
            continue
        candidates = [other["cells"].get(key, {})] + [
            c for c in other["cells"].values() if str(c.get("where", "")).startswith("loopback")
            and (c.get("workload"), global_batch(c), c.get("steps")) == (cell.get("workload"), global_batch(cell),
                                                                         cell.get("steps"))]
        for candidate in candidates:
            method = next((m for m in REFERENCES if m in candidate.get("runs", {})
                           and completed(candidate["runs"][m], candidate)), None)
            if method is not None:
                reference = candidate["runs"][method]
                cell["reference"] = {"method": method, "final": reference["curve"][-1][2], "record": name,
                                     "where": candidate.get("where", ""), "curve": reference["curve"]}
                break


def steps_bound(row_run: dict, cell: dict, target: float, metric: str) -> float | None:
    """A budget-stopped run's time to ``target``, bounded from below: the steps the unconstrained reference run of
    the same method needed to reach it, at this run's median step time (evaluation excluded)."""
    reference = cell.get("reference")
    if reference is None or "curve" not in reference or not row_run.get("step_s"):
        return None
    if parse_method(reference["method"]).kind != parse_method(row_run.get("method", reference["method"])).kind:
        return None
    step = next((s for _, s, value, _ in reference["curve"] if reaches(value, target, metric)), None)
    return None if step is None else step * statistics.median(row_run["step_s"])


def targets(cell: dict, reference: float) -> tuple[float, float]:
    """The first target (the final metric ``reference_final`` chose, loosened) and the lower one."""
    runs, metric = cell["runs"], next(iter(cell["runs"].values()))["metric"]
    # a run a wall-clock budget stopped does not set the lower target (its final is where the budget cut it)
    finals = [run["curve"][-1][2] for run in runs.values() if completed(run, cell)] or [
        run["curve"][-1][2] for run in runs.values()]
    first = loosen(reference, metric)
    # every complete run reaches the lower one; never above the first
    return first, (min(*finals, first) if higher_is_better(metric) else max(*finals, first))


def late_x_bound(run: dict, bound: dict | None) -> float | None:
    """Throughput over the last third of the steps (masks final, for PacTrain) against the bound: medians."""
    step_s = run.get("step_s", [])
    late = step_s[-(len(step_s) // 3):]
    return bound["step_s"] / statistics.median(late) if bound and late else None


def summarize(cell: dict) -> dict:
    """Per method: final metric, times to both targets, metric at the budget, throughput, bytes."""
    runs = cell["runs"]
    metric = next(iter(runs.values()))["metric"]
    reference, source = reference_final(cell)
    first, second = targets(cell, reference)
    budget = min(run["train_s"] for run in runs.values())
    rows = {}
    for method, run in runs.items():
        bound = run_bound(run, cell)
        samples = run["size"] * run["batch_size"] * run["steps"] / run["train_s"]
        nic = run.get("nic_tx_bytes")
        rows[method] = {
            "final": run["curve"][-1][2], "time_to_target": time_to(run["curve"], first, metric),
            "time_to_lower": time_to(run["curve"], second, metric), "at_budget": at_budget(run["curve"], budget),
            "steps": run["steps"], "train_s": run["train_s"], "samples_per_s": samples,
            "x_bound": samples / bound["samples_per_s"] if bound else None,
            "x_bound_late": late_x_bound(run, bound),
            "nic_mb": sum(nic) / len(nic) / 1e6 if nic else None, "sparsity": run.get("sparsity", 0.0),
        }
        if rows[method]["time_to_target"] is None and not completed(run, cell):
            rows[method]["time_to_target_at_least"] = steps_bound(dict(run, method=method), cell, first, metric)
    return {"metric": metric, "target": first, "target_source": source, "lower_target": second, "budget_s": budget, "rows": rows,
            "verdict": verdict(rows)}


def verdict(rows: dict) -> dict:
    """PacTrain's best setting against the best peer and against fp16, on time to the first target."""
    def best(names):
        timed = [(rows[n]["time_to_target"], n) for n in names if rows[n]["time_to_target"] is not None]
        return min(timed) if timed else (None, None)

    ours = best([name for name in rows if is_pactrain(name)])
    peer = best([name for name in rows if is_peer(name)])
    result = {"pactrain": ours[1], "pactrain_s": ours[0], "peer": peer[1], "peer_s": peer[0]}
    if ours[0] is not None and peer[0] is not None:
        result["speedup_over_best_peer"] = peer[0] / ours[0]
    fp16_row = rows.get("fp16") or rows.get("tf-fp16") or {}  # torch's, else TensorFlow's
    fp16 = fp16_row.get("time_to_target")
    if fp16 is not None and ours[0] is not None:
        result["speedup_over_fp16"] = fp16 / ours[0]
    fp16_at_least = fp16_row.get("time_to_target_at_least")
    if fp16 is None and fp16_at_least is not None and ours[0] is not None:
        result["speedup_over_fp16_at_least"] = fp16_at_least / ours[0]
    return result


def seconds(value: float | None, at_least: float | None = None) -> str:
    if value is None and at_least is not None:
        return f">= {at_least:.0f} s (stopped; steps to target x step time)"
    return "not reached" if value is None else f"{value:.0f} s"


def capped(cell: dict) -> str:
    budget = cell.get("budget_s", 0.0)
    return f" or until the first evaluation past {budget:.0f} s of training" if budget else ""


def bounds(cell: dict) -> str:
    """The bound (each part of a cell measures its own, beside the runs it bounds)."""
    measured = sorted({round(run_bound(run, cell)["samples_per_s"], 1) for run in cell["runs"].values()})
    return " / ".join(f"{value:.1f}" for value in measured) + (" (per part)" if len(measured) > 1 else "")


def loads(cell: dict) -> str:
    """The machine's 1-minute load as each run ended (a cell that ran in parts met different loads); a record
    older than per-run loads has the load at its start only."""
    ended = [run["load"][0] for run in cell["runs"].values() if run.get("load")]
    if not ended:
        return "load " + " ".join(f"{x:.1f}" for x in cell.get("load", []))
    return f"load as each run ended {min(ended):.1f}" + (f"-{max(ended):.1f}" if max(ended) - min(ended) >= 0.05 else "")


def cycle_time_ms(cell: dict) -> float:
    """The cell's HOROVOD_CYCLE_TIME; cells recorded before it was a setting ran at Horovod's default, 1 ms."""
    return float(cell.get("cycle_time_ms") or 1)


def horovod_settings(cell: dict) -> str:
    """The per-worker batch its runs took and the cell's HOROVOD_CYCLE_TIME."""
    batches = worker_batches(cell)
    batch = f"per-worker batch {'/'.join(map(str, batches))}, " if batches else ""
    return f"{batch}HOROVOD_CYCLE_TIME {cycle_time_ms(cell):g} ms"


def cell_markdown(key: str, cell: dict, summary: dict) -> str:
    metric = summary["metric"]
    lines = [f"### {key}: {cell.get('where', '')}", "",
             f"{cell['steps']} steps per method{capped(cell)}, evaluation every {cell['eval_every']} (excluded from "
             f"the clock); {horovod_settings(cell)}; "
             f"concurrent compute bound {bounds(cell)} samples/s; {loads(cell)}. Target {summary['target']:.4f} "
             f"({summary['target_source']}, loosened), lower target {summary['lower_target']:.4f}; budget {summary['budget_s']:.0f} s.", "",
             f"| method | final {metric} | to target | to lower target | at budget | steps | training s | samples/s | "
             "x bound | x bound, last third | NIC MB/worker |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for method, row in summary["rows"].items():
        run = cell["runs"][method]  # a part of the cell may evaluate more often, or stop at a budget
        if "eval_every" in run and (run["eval_every"], run["budget_s"]) != (cell["eval_every"], cell.get("budget_s", 0.0)):
            method += f" (evaluation every {run['eval_every']}, budget {run['budget_s']:.0f} s)"
        budget = "n/a" if row["at_budget"] is None else f"{row['at_budget']:.4f}"
        x_bound = "n/a" if row["x_bound"] is None else f"{row['x_bound']:.2f}"
        late = "n/a" if row["x_bound_late"] is None else f"{row['x_bound_late']:.2f}"
        nic = "n/a" if row["nic_mb"] is None else f"{row['nic_mb']:.0f}"
        lines.append(f"| {method} | {row['final']:.4f} | {seconds(row['time_to_target'], row.get('time_to_target_at_least'))} | "
                     f"{seconds(row['time_to_lower'])} | {budget} | {row['steps']} | {row['train_s']:.0f} | "
                     f"{row['samples_per_s']:.1f} | {x_bound} | {late} | {nic} |")
    v = summary["verdict"]
    if "speedup_over_best_peer" in v:
        lines += ["", f"PacTrain's best ({v['pactrain']}) reaches the target in {v['pactrain_s']:.0f} s: "
                      f"{v['speedup_over_best_peer']:.2f}x sooner than the best peer ({v['peer']}, {v['peer_s']:.0f} s)"
                      + (f", {v['speedup_over_fp16']:.2f}x sooner than fp16." if "speedup_over_fp16" in v else
                         f", at least {v['speedup_over_fp16_at_least']:.2f}x sooner than fp16 (stopped by the budget)."
                         if "speedup_over_fp16_at_least" in v else ".")]
    else:
        lines += ["", f"No comparison on the target: PacTrain best {v['pactrain']}, best peer {v['peer']}."
                      + (f" PacTrain's best reaches it in {v['pactrain_s']:.0f} s, at least {v['speedup_over_fp16_at_least']:.1f}x "
                         "sooner than fp16 (stopped by the budget)." if "speedup_over_fp16_at_least" in v else "")]
    return "\n".join(lines)


def plot_cell(key: str, cell: dict, summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6.4, 4.0))
    for method, run in cell["runs"].items():
        xs, _, ys, _ = zip(*run["curve"])
        axis.plot(xs, ys, marker="o", markersize=3, label=method, linewidth=2.2 if is_pactrain(method) else 1.2)
    axis.axhline(summary["target"], color="grey", linestyle="--", linewidth=0.8)
    axis.set_xlabel("training time, s (evaluation excluded)")
    axis.set_ylabel(summary["metric"])
    axis.set_xlim(left=0)
    axis.grid(alpha=0.3)
    axis.set_title(f"{key}: {cell.get('where', '')}", fontsize=8)
    axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def write_report(record: dict, out: Path) -> str:
    """``results.md`` (and a PNG per cell) under ``out``; returns the markdown."""
    out.mkdir(parents=True, exist_ok=True)
    parts = ["# Time to accuracy on emulated links", "", __doc__.split("\n\n", 1)[1].strip(), ""]
    for key, cell in record["cells"].items():
        if not cell["runs"] or "bound" not in cell:
            continue
        summary = summarize(cell)
        cell["summary"] = summary
        picture = out / (key.replace("/", "-") + ".png")
        plot_cell(key, cell, summary, picture)
        parts += [cell_markdown(key, cell, summary), "", f"![{key}]({picture.name})", ""]
    markdown = "\n".join(parts)
    (out / "results.md").write_text(markdown)
    return markdown
