"""The planner against every measured time-to-accuracy cell: predicted training time and time to target.

    python -m benchmarks.model.planner_validation        # -> bench/results/planner/validation.md, .json

For every Horovod run of every record under ``bench/results/tta/`` on an emulated link, the planner
(``pactrain_hvd.planner``) predicts each step's time from the bytes the method sends at that step (PacTrain's
sparsity follows the run's pruning schedule; before its masks arrive it sends whole tensors), the probed
link rate, and CPU costs, and sums them over the run's steps. Two sets of CPU costs:

- **A, the cell's phases**: compute, compression and update are the run's own means per step (records that
  kept no phases: the cell's concurrent compute bound for compute, and the compression and update of the same
  method in ``reports/step_model/tta-loopback/record.json``). The network wait is the model's.
- **B, nothing of the cell**: compute and update from ``reports/step_model/profile.json`` (one idle thread,
  times the workers per core where the runs had more workers than the machine's 2 cores), compression from the
  loopback record; only the link and the model come from the cell.

Both add the traffic Horovod sends besides the gradients, measured from the runs' NIC counters (``docs/planner.md``):
``FRAMING`` of the payload (TCP/IP headers: the fp16 and dense runs' NIC bytes over their payload) and
``EXTRA_BYTES_PER_STEP`` (the median of NIC bytes per step over framed payload in the 2-worker image cells, whose
Horovod ran at its default 1 ms cycle). Time to target: the steps to the cell's lower target
(``benchmarks.tta.tta_report``) times the predicted steps' times, against the measured seconds: A counts the
run's own steps to it, B those of the same method's run in another cell (another link or part, with the same
workload, workers and steps), where one exists.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from benchmarks.common.methods import parse_method as bench_method
from benchmarks.common.methods import pruning_schedule
from benchmarks.tta import tta_report
from pactrain_hvd.core.schedule import PolynomialSchedule, schedule_steps
from pactrain_hvd.planner.methods import Method, parse_method
from pactrain_hvd.planner.payload import Tensor, traffic
from pactrain_hvd.planner.step_model import HOROVOD_DEFAULT_CYCLE_TIME_S, HorovodConfig, Link
from pactrain_hvd.planner.step_time import Costs, predict

ROOT = Path(__file__).resolve().parents[2]
RECORDS = sorted((ROOT / "bench" / "results" / "tta").glob("**/record.json"))
PROFILE = ROOT / "reports" / "step_model" / "profile.json"
LOOPBACK = ROOT / "reports" / "step_model" / "tta-loopback" / "record.json"
OUT = ROOT / "bench" / "results" / "planner"
LATENCY_S = 50e-6  # per hop on the benchmark's veth + TCP + Gloo path (assumed, as benchmarks/model/step_time_model.py)
CORES = 2  # the machine the records ran on
FRAMING = 1.065  # NIC bytes over payload of the dense and fp16 runs (median, printed by --fit)
EXTRA_BYTES_PER_STEP = 100e3  # median non-gradient NIC bytes per step of the 2-worker image runs (printed by --fit)
TOLERANCE = 0.20


def kind_of(method: str) -> str:
    return bench_method(method).kind


def sparsity_per_step(method: str, steps: int) -> list[float]:
    """PacTrain's mask sparsity at each step of a run of ``steps`` (0 for the other methods)."""
    spec = bench_method(method)
    if spec.kind != "pactrain":
        return [0.0] * steps
    arguments = pruning_schedule(spec, steps)
    if "schedule" in arguments:
        schedule = arguments["schedule"].polynomial()
    else:
        begin, end, frequency = schedule_steps(arguments.get("total_steps"), arguments.get("begin_step"),
                                               arguments.get("end_step"))
        schedule = PolynomialSchedule(spec.sparsity, begin, end, frequency)
    out, current = [], 0.0
    for step in range(steps):
        if schedule.is_update_step(step):
            current = schedule.target(step)
        out.append(current)
    return out


def loopback_phases(loopback: dict, phase: str) -> dict[tuple[str, str], float]:
    """Median seconds of ``phase`` per (workload, method) and per (workload, method kind) in the loopback record."""
    found: dict[tuple[str, str], list[float]] = {}
    for cell in loopback["cells"].values():
        for method, run in cell["runs"].items():
            value = statistics.median(run["phases_s"][phase])
            found.setdefault((cell["workload"], method), []).append(value)
            found.setdefault((cell["workload"], kind_of(method)), []).append(value)
    return {key: statistics.median(values) for key, values in found.items()}


def costs_for(mode: str, run: dict, cell: dict, method: str, prof: dict, loop: dict) -> tuple[Costs, str]:
    workload = cell["workload"]
    entry = prof["workloads"][workload]
    share = entry["forward_s"] / (entry["forward_s"] + entry["backward_s"])
    kind = kind_of(method)
    kind_key = "pactrain" if kind == "pactrain" else kind
    compress = loop["compress"].get((workload, method), loop["compress"].get((workload, kind), 0.0))
    if mode == "A":
        phases = run.get("phases_s")
        if phases:
            mean = {name: statistics.fmean(values) for name, values in phases.items()}
            return Costs(mean["compute"], mean["update"], share, {kind_key: mean["compress"]}), "run's phases"
        bound = cell["bound"]
        update = loop["update"].get((workload, method), loop["update"].get((workload, kind), 0.0))
        return Costs(bound.get("compute_s", bound["step_s"]), update, share,
                     {kind_key: compress}), "cell's bound + loopback compression and update"
    crowd = max(1.0, cell["workers"] / CORES)
    return Costs((entry["forward_s"] + entry["backward_s"]) * crowd, entry["update_s"] * crowd, share,
                 {kind_key: compress}), "profile + loopback compression"


def predict_run(run: dict, cell: dict, method: str, tensors: list[Tensor], costs: Costs) -> list[float]:
    """Predicted seconds of each step of the run."""
    link = Link(cell["probed_mbit_per_s"] * 1e6 / 8 / FRAMING, LATENCY_S)
    config = HorovodConfig(cycle_time_s=HOROVOD_DEFAULT_CYCLE_TIME_S)
    base = parse_method(method)
    cache: dict[float, float] = {}
    out = []
    for sparsity in sparsity_per_step(method, run["steps"]):
        key = round(sparsity, 6)
        if key not in cache:
            step_method = Method(base.name, base.kind, sparsity, base.values, base.density, base.rank)
            if base.kind == "pactrain" and sparsity == 0.0:
                step_method = Method(base.name, "pactrain", 0.0, base.values)
            cache[key] = predict(step_method, tensors, cell["workers"], link, costs, config,
                                 extra_bytes_per_step=EXTRA_BYTES_PER_STEP / FRAMING).step_s
        out.append(cache[key])
    return out


def other_curves(records: list[Path]) -> dict[tuple, list[tuple[str, list]]]:
    """Curves by (workload, workers, steps, method): where a cell's run has a twin in another cell (another link
    or part; the same seed, data and schedule), its curve in steps stands in for the run's own."""
    found: dict[tuple, list[tuple[str, list]]] = {}
    for path in records:
        for key, cell in json.loads(path.read_text())["cells"].items():
            for method, run in cell["runs"].items():
                where = f"{path.relative_to(ROOT / 'bench' / 'results' / 'tta').as_posix()}: {key}"
                found.setdefault((cell["workload"], cell["workers"], run["steps"], method), []).append((where, run["curve"]))
    return found


def first_step(curve: list, target: float, metric: str) -> int | None:
    return next((step for _, step, value, _ in curve if tta_report.reaches(value, target, metric)), None)


def validate(records: list[Path], prof: dict, loopback: dict) -> list[dict]:
    loop = {phase: loopback_phases(loopback, phase) for phase in ("compress", "update")}
    twins = other_curves(records)
    rows = []
    for path in records:
        record = json.loads(path.read_text())
        for key, cell in record["cells"].items():
            if not cell.get("probed_mbit_per_s"):
                continue  # loopback: no link to predict
            tensors = [Tensor(t["name"], tuple(t["shape"]), t["ready_fraction"])
                       for t in prof["workloads"][cell["workload"]]["tensors"]]
            summary = tta_report.summarize(cell)
            for method, run in cell["runs"].items():
                if bench_method(method).frontend != "horovod":
                    continue  # DDP's buckets and comm hooks are not modelled
                row = {"record": str(path.relative_to(ROOT)), "cell": key, "method": method, "steps": run["steps"],
                       "measured_s": run["train_s"], "lower_target": summary["lower_target"]}
                reached = first_step(run["curve"], summary["lower_target"], summary["metric"])
                row["measured_to_lower_s"] = summary["rows"][method]["time_to_lower"]
                here = f"{path.relative_to(ROOT / 'bench' / 'results' / 'tta').as_posix()}: {key}"
                twin = next(((where, curve) for where, curve in
                             twins.get((cell["workload"], cell["workers"], run["steps"], method), []) if where != here), None)
                for mode in ("A", "B"):
                    costs, source = costs_for(mode, run, cell, method, prof, loop)
                    steps = predict_run(run, cell, method, tensors, costs)
                    row[f"{mode}_s"] = sum(steps)
                    row[f"{mode}_source"] = source
                    # A: the run's own steps to the target; B: another cell's curve of the same method, where one exists
                    if mode == "A":
                        needed = reached
                    else:
                        needed = first_step(twin[1], summary["lower_target"], summary["metric"]) if twin else None
                        row["B_curve_from"] = twin[0] if twin else None
                    row[f"{mode}_to_lower_s"] = sum(steps[:needed]) if needed is not None else None
                rows.append(row)
    return rows


def error(predicted: float | None, measured: float | None) -> float | None:
    return None if predicted is None or not measured else predicted / measured - 1


def markdown(rows: list[dict]) -> str:
    lines = ["| record | cell | method | steps | measured training s | A: predicted s | A: error | B: predicted s | "
             "B: error | measured s to lower target | A: predicted s | A: error | B: predicted s | B: error | B's curve |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]

    def seconds(predicted: float | None, measured: float | None) -> str:
        return "- | -" if predicted is None or measured is None else f"{predicted:.0f} | {error(predicted, measured):+.0%}"

    for r in rows:
        measured = r["measured_to_lower_s"]
        to_lower = (f"{'-' if measured is None else f'{measured:.0f}'} | {seconds(r['A_to_lower_s'], measured)} | "
                    f"{seconds(r['B_to_lower_s'], measured)} | {r['B_curve_from'] or '-'}")
        flag = "" if r["A_source"] == "run's phases" else " \\*"
        lines.append(f"| {r['record'].removeprefix('bench/results/tta/')} | {r['cell']} | {r['method']}{flag} | {r['steps']} | "
                     f"{r['measured_s']:.0f} | {r['A_s']:.0f} | {error(r['A_s'], r['measured_s']):+.0%} | {r['B_s']:.0f} | "
                     f"{error(r['B_s'], r['measured_s']):+.0%} | {to_lower} |")
    return "\n".join(lines)


def summary(rows: list[dict]) -> list[str]:
    out = []
    groups = {"all cells": rows, "2-worker cells": [r for r in rows if r["cell"].endswith("/2w")],
              "link-bound cells (5 and 10 Mbit/s)": [r for r in rows if "link-bound" in r["record"]]}
    for label, group in groups.items():
        for mode in ("A", "B"):
            errors = [abs(error(r[f"{mode}_s"], r["measured_s"])) for r in group]
            worst = max(group, key=lambda r: abs(error(r[f"{mode}_s"], r["measured_s"])))
            out.append(f"{label}, {mode}: {sum(e <= TOLERANCE for e in errors)} of {len(errors)} runs within "
                       f"{TOLERANCE:.0%} of the measured training time; median |error| {statistics.median(errors):.0%}; "
                       f"worst {max(errors):.0%} ({worst['cell']} {worst['method']})")
        for mode, how in (("A", "the run's own steps to it"), ("B", "another cell's curve of the method")):
            timed = [abs(error(r[f"{mode}_to_lower_s"], r["measured_to_lower_s"])) for r in group
                     if r[f"{mode}_to_lower_s"] is not None and r["measured_to_lower_s"] is not None]
            if timed:
                out.append(f"{label}, time to the lower target, {mode} ({how}): {sum(e <= TOLERANCE for e in timed)} of "
                           f"{len(timed)} within {TOLERANCE:.0%}; median |error| {statistics.median(timed):.0%}")
    return out


def fit(records: list[Path], prof: dict) -> tuple[float, float]:
    """(framing, extra bytes per step) from the NIC counters over the last third of each run's steps (masks final):
    framing from the dense and fp16 runs, extra from the other 2-worker image runs (framed payload subtracted)."""
    framing, extra = [], []
    for path in records:
        for cell in json.loads(path.read_text())["cells"].values():
            if not cell.get("probed_mbit_per_s"):
                continue
            tensors = [Tensor(t["name"], tuple(t["shape"])) for t in prof["workloads"][cell["workload"]]["tensors"]]
            for method, run in cell["runs"].items():
                spec = bench_method(method)
                curve = run["curve"]
                first, last = curve[max(0, len(curve) * 2 // 3 - 1)], curve[-1]
                if spec.frontend != "horovod" or last[1] == first[1]:
                    continue
                nic = (last[3] - first[3]) / (last[1] - first[1])
                sent = traffic(parse_method(method), tensors, cell["workers"]).sent_bytes(cell["workers"])
                if spec.kind in ("dense", "fp16"):
                    framing.append(nic / sent)
                elif cell["workload"] == "image" and cell["workers"] == 2:
                    extra.append(nic - FRAMING * sent)
    return statistics.median(framing), statistics.median(extra)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--fit", action="store_true", help="print FRAMING and EXTRA_BYTES_PER_STEP as the records give them")
    args = parser.parse_args(argv)
    prof = json.loads(PROFILE.read_text())
    if args.fit:
        framing, extra = fit(RECORDS, prof)
        print(f"framing {framing:.3f} (FRAMING = {FRAMING}); extra {extra / 1e3:.0f} kB a step "
              f"(EXTRA_BYTES_PER_STEP = {EXTRA_BYTES_PER_STEP:.0f})")
        return 0
    rows = validate(RECORDS, prof, json.loads(LOOPBACK.read_text()))
    lines = summary(rows)
    table = markdown(rows)
    head = (f"Predicted against measured training time (evaluation excluded) of every Horovod run on an emulated "
            f"link, written by `python -m benchmarks.model.planner_validation`. Latency {LATENCY_S * 1e6:.0f} us a hop, "
            f"Horovod cycle {HOROVOD_DEFAULT_CYCLE_TIME_S * 1e3:g} ms, framing {FRAMING:g}x the payload, "
            f"{EXTRA_BYTES_PER_STEP / 1e3:.0f} kB a step of non-gradient traffic. \\* A from the cell's bound (the record "
            "kept no phases).")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "validation.md").write_text(head + "\n\n" + "\n".join(f"- {line}" for line in lines) + "\n\n" + table + "\n")
    (args.out / "validation.json").write_text(json.dumps({"rows": rows, "summary": lines, "framing": FRAMING,
                                                          "extra_bytes_per_step": EXTRA_BYTES_PER_STEP,
                                                          "latency_s": LATENCY_S}, indent=1))
    print("\n".join(lines))
    print(f"wrote {args.out / 'validation.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
