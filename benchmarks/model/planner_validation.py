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

Both add the traffic Horovod sends besides the gradients (``pactrain_hvd.planner.coordination``): a coordination
round every cycle the background loop is not running a collective, sharing the link with the gradients, and a
remainder a step, at the cycle time each cell ran at (``cycle_time_ms`` in the cell's header; cells recorded
before the header had it ran at Horovod's default, 1 ms; the cycle-time records name it in their directory).
Its constants come from the NIC counters of ``bench/results/tta/cycle-time/`` (``--fit``): 60 steps of three
methods at 1, 10 and 25 ms, cells of their own, which the table does not validate. ``FRAMING`` (TCP/IP headers)
is the dense and fp16 runs' NIC bytes over their payload. Time to target: the steps to the cell's lower target
(``benchmarks.tta.tta_report``) times the predicted steps' times, against the measured seconds: A counts the
run's own steps to it, B those of the same method's run in another cell (another link or part, with the same
workload, workers and steps), where one exists. Runs stopped by a budget are predicted over the steps they ran;
PacTrain's ``-localN`` runs add their N uncommunicated steps (every rank computes the global batch).

Records are found by globbing ``bench/results/tta/**/record.json``: a new cell is validated without a code change.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import statistics
import sys
from pathlib import Path

from benchmarks.common.methods import parse_method as bench_method
from benchmarks.common.methods import pruning_schedule
from benchmarks.tta import tta_report
from pactrain_hvd.core.schedule import PolynomialSchedule, schedule_steps
from pactrain_hvd.planner.coordination import MEASURED, Coordination
from pactrain_hvd.planner.methods import parse_method
from pactrain_hvd.planner.payload import Tensor, traffic
from pactrain_hvd.planner.step_model import HOROVOD_DEFAULT_CYCLE_TIME_S, HorovodConfig, Link, expected_step
from pactrain_hvd.planner.step_time import Costs, predict, step_plan

ROOT = Path(__file__).resolve().parents[2]
TTA = ROOT / "bench" / "results" / "tta"
RECORDS = sorted(TTA.glob("**/record.json"))
FIT_RECORDS = sorted((TTA / "cycle-time").glob("*/record.json"))  # the coordination's constants: not validated
PROFILE = ROOT / "reports" / "step_model" / "profile.json"
LOOPBACK = ROOT / "reports" / "step_model" / "tta-loopback" / "record.json"
EVIDENCE = ROOT / "bench" / "results" / "evidence" / "record.json"
OUT = ROOT / "bench" / "results" / "planner"
LATENCY_S = 50e-6  # per hop on the benchmark's veth + TCP + Gloo path (assumed, as benchmarks/model/step_time_model.py)
CORES = 2  # the machine the records ran on
FRAMING = 1.065  # NIC bytes over payload of the dense and fp16 runs (median, printed by --fit)
COORDINATION = MEASURED  # NIC bytes per idle cycle and per step (printed by --fit)
TOLERANCE = 0.20


def kind_of(method: str) -> str:
    return bench_method(method).kind


def cycle_time_ms(path: Path, cell: dict) -> float:
    """The cell's HOROVOD_CYCLE_TIME: its header's, the directory's name under ``cycle-time/``, else Horovod's default."""
    if cell.get("cycle_time_ms"):
        return float(cell["cycle_time_ms"])
    named = re.fullmatch(r"(\d*\.?\d+)ms", path.parent.name) if path.parent.parent.name == "cycle-time" else None
    return float(named.group(1)) if named else HOROVOD_DEFAULT_CYCLE_TIME_S * 1e3


def sparsity_per_step(method: str, steps: int) -> list[float]:
    """PacTrain's mask sparsity at each step of a run planned for ``steps`` (0 for the other methods)."""
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


def link_of(cell: dict) -> Link:
    return Link(cell["probed_mbit_per_s"] * 1e6 / 8 / FRAMING, LATENCY_S)


def predict_run(run: dict, cell: dict, method: str, tensors: list[Tensor], costs: Costs, cycle_ms: float,
                coordination: Coordination = COORDINATION) -> list[float]:
    """Predicted seconds of each step the run took (a budget may have stopped it before its planned steps)."""
    link = link_of(cell)
    config = HorovodConfig(cycle_time_s=cycle_ms / 1e3)
    unframed = Coordination(coordination.bytes_per_cycle / FRAMING, coordination.bytes_per_step / FRAMING)
    base = parse_method(method)
    cache: dict[float, float] = {}
    out = []
    for sparsity in sparsity_per_step(method, run.get("planned_steps") or run["steps"])[:run["steps"]]:
        key = round(sparsity, 6)
        if key not in cache:
            step_method = dataclasses.replace(base, sparsity=sparsity)
            cache[key] = predict(step_method, tensors, cell["workers"], link, costs, config, unframed).step_s
        out.append(cache[key])
    return out


def local_s(run: dict, cell: dict, costs: Costs) -> float:
    """PacTrain's ``-localN`` steps before the run's clock starts counting steps: every rank computes the global
    batch (``workers`` times its own) and updates, with nothing communicated."""
    return bench_method(run["method"]).local_steps * (cell["workers"] * costs.compute_s + costs.update_s)


def other_curves(records: list[Path]) -> dict[tuple, list[tuple[str, list]]]:
    """Curves by (workload, workers, steps, method): where a cell's run has a twin in another cell (another link
    or part; the same seed, data and schedule), its curve in steps stands in for the run's own."""
    found: dict[tuple, list[tuple[str, list]]] = {}
    for path in records:
        for key, cell in json.loads(path.read_text())["cells"].items():
            for method, run in cell["runs"].items():
                where = f"{path.relative_to(TTA).as_posix()}: {key}"
                found.setdefault((cell["workload"], cell["workers"], planned(run), method), []).append((where, run.get("curve") or []))
    return found


def planned(run: dict) -> int:
    return run.get("planned_steps") or run["steps"]


def first_step(curve: list, target: float, metric: str) -> int | None:
    return next((step for _, step, value, _ in curve if tta_report.reaches(value, target, metric)), None)


def validate(records: list[Path], prof: dict, loopback: dict) -> list[dict]:
    loop = {phase: loopback_phases(loopback, phase) for phase in ("compress", "update")}
    twins = other_curves(records)
    rows = []
    for path in records:
        if path in FIT_RECORDS:
            continue  # the coordination's constants come from these cells
        record = json.loads(path.read_text())
        for key, cell in record["cells"].items():
            if not cell.get("probed_mbit_per_s") or not cell.get("runs"):
                continue  # loopback: no link to predict
            tensors = [Tensor(t["name"], tuple(t["shape"]), t["ready_fraction"])
                       for t in prof["workloads"][cell["workload"]]["tensors"]]
            evaluated = {method: run for method, run in cell["runs"].items() if run.get("curve")}
            summary = tta_report.summarize({**cell, "runs": evaluated}) if evaluated else None
            for method, run in cell["runs"].items():
                if bench_method(method).frontend != "horovod":
                    continue  # DDP's buckets and comm hooks are not modelled
                cycle_ms = cycle_time_ms(path, cell)
                row = {"record": str(path.relative_to(ROOT)), "cell": key, "method": method, "steps": run["steps"],
                       "cycle_ms": cycle_ms, "measured_s": run["train_s"],
                       "lower_target": summary["lower_target"] if summary else None}
                # a run stopped before its first evaluation has no curve: its training time is still predicted
                reached = first_step(run["curve"], summary["lower_target"], summary["metric"]) if method in evaluated else None
                row["measured_to_lower_s"] = summary["rows"][method]["time_to_lower"] if method in evaluated else None
                here = f"{path.relative_to(TTA).as_posix()}: {key}"
                twin = next(((where, curve) for where, curve in
                             twins.get((cell["workload"], cell["workers"], planned(run), method), []) if where != here), None)
                for mode in ("A", "B"):
                    costs, source = costs_for(mode, run, cell, method, prof, loop)
                    steps = predict_run(run, cell, method, tensors, costs, cycle_ms)
                    steps[:0] = [local_s(run, cell, costs)]  # 0 but for -localN runs: before step 1 on the clock
                    row[f"{mode}_s"] = sum(steps)
                    row[f"{mode}_source"] = source
                    # A: the run's own steps to the target; B: another cell's curve of the same method, where one exists
                    if mode == "A":
                        needed = reached
                    else:
                        needed = (first_step(twin[1], summary["lower_target"], summary["metric"])
                                  if twin and summary and method in evaluated else None)
                        row["B_curve_from"] = twin[0] if twin else None
                    row[f"{mode}_to_lower_s"] = sum(steps[:needed + 1]) if needed is not None else None
                rows.append(row)
    return rows


def protocol_rows(record: dict, prof: dict, loopback: dict) -> list[dict]:
    """The evidence protocol's final runs on a link, for the methods the planner has a traffic model of (not DGC's
    or Random-k's, not DDP's hooks); A from the run's median phases (its record keeps medians), B as above."""
    loop = {phase: loopback_phases(loopback, phase) for phase in ("compress", "update")}
    rows = []
    for run in record["runs"]:
        method = run["method"]
        if (run["stage"] != "final" or "probed_mbit_per_s" not in run or kind_of(method) in ("dgc", "randomk")
                or bench_method(method).frontend != "horovod"):
            continue
        cell = {"workload": run["workload"], "workers": run["bound"]["workers"], "bound": run["bound"],
                "probed_mbit_per_s": run["probed_mbit_per_s"]}
        phases = {**run, "phases_s": {name: [seconds] for name, seconds in run["phases_s_median"].items()}}
        tensors = [Tensor(t["name"], tuple(t["shape"]), t["ready_fraction"])
                   for t in prof["workloads"][run["workload"]]["tensors"]]
        row = {"cell": run["cell"], "method": method, "seed": run["seed"], "measured_s": run["train_s"]}
        for mode in ("A", "B"):
            costs, _ = costs_for(mode, phases, cell, method, prof, loop)
            row[f"{mode}_s"] = sum(predict_run(run, cell, method, tensors, costs, run["cycle_ms"]))
        rows.append(row)
    return sorted(rows, key=lambda r: (r["cell"], r["method"], r["seed"]))


def protocol_markdown(rows: list[dict]) -> str:
    errors = [abs(error(r["A_s"], r["measured_s"])) for r in rows]
    lines = [f"The evidence protocol's final runs on a link (`bench/results/evidence/record.json`): A within "
             f"{TOLERANCE:.0%} in {sum(e <= TOLERANCE for e in errors)} of {len(rows)} runs, median |error| "
             f"{statistics.median(errors):.0%}." if rows else "The evidence protocol's record has no final run on a link yet.",
             "", "| cell | method | seed | measured training s | A: predicted s | A: error | B: predicted s | B: error |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['cell']} | {r['method']} | {r['seed']} | {r['measured_s']:.0f} | {r['A_s']:.0f} | "
              f"{error(r['A_s'], r['measured_s']):+.0%} | {r['B_s']:.0f} | {error(r['B_s'], r['measured_s']):+.0%} |"
              for r in rows]
    return "\n".join(lines)


def error(predicted: float | None, measured: float | None) -> float | None:
    return None if predicted is None or not measured else predicted / measured - 1


def markdown(rows: list[dict]) -> str:
    lines = ["| record | cell | method | cycle ms | steps | measured training s | A: predicted s | A: error | B: predicted s | "
             "B: error | measured s to lower target | A: predicted s | A: error | B: predicted s | B: error | B's curve |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]

    def seconds(predicted: float | None, measured: float | None) -> str:
        return "- | -" if predicted is None or measured is None else f"{predicted:.0f} | {error(predicted, measured):+.0%}"

    for r in rows:
        measured = r["measured_to_lower_s"]
        to_lower = (f"{'-' if measured is None else f'{measured:.0f}'} | {seconds(r['A_to_lower_s'], measured)} | "
                    f"{seconds(r['B_to_lower_s'], measured)} | {r['B_curve_from'] or '-'}")
        flag = "" if r["A_source"] == "run's phases" else " \\*"
        lines.append(f"| {r['record'].removeprefix('bench/results/tta/')} | {r['cell']} | {r['method']}{flag} | {r['cycle_ms']:g} | {r['steps']} | "
                     f"{r['measured_s']:.0f} | {r['A_s']:.0f} | {error(r['A_s'], r['measured_s']):+.0%} | {r['B_s']:.0f} | "
                     f"{error(r['B_s'], r['measured_s']):+.0%} | {to_lower} |")
    return "\n".join(lines)


def summary(rows: list[dict]) -> list[str]:
    out = []
    groups = {"all cells": rows, "2-worker cells": [r for r in rows if r["cell"].endswith("/2w")],
              "link-bound cells (`link-bound/`)": [r for r in rows if "/link-bound/" in r["record"]]}
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


def framing_fit(records: list[Path], prof: dict) -> float:
    """NIC bytes over payload of the dense and fp16 runs, over the last third of each run's steps (median)."""
    framing = []
    for path in records:
        for cell in json.loads(path.read_text())["cells"].values():
            if not cell.get("probed_mbit_per_s"):
                continue
            tensors = [Tensor(t["name"], tuple(t["shape"])) for t in prof["workloads"][cell["workload"]]["tensors"]]
            for method, run in cell["runs"].items():
                spec, curve = bench_method(method), run.get("curve") or []
                if spec.frontend != "horovod" or spec.kind not in ("dense", "fp16") or len(curve) < 2:
                    continue
                first, last = curve[max(0, len(curve) * 2 // 3 - 1)], curve[-1]
                if last[1] > first[1]:
                    sent = traffic(parse_method(method), tensors, cell["workers"]).sent_bytes(cell["workers"])
                    framing.append((last[3] - first[3]) / (last[1] - first[1]) / sent)
    return statistics.median(framing)


def coordination_fit(records: list[Path], prof: dict, loopback: dict) -> tuple[Coordination, list[dict]]:
    """Least squares of NIC bytes a step beyond the framed payload = bytes_per_cycle x idle cycles + bytes_per_step,
    over the runs of ``records`` (the cycle-time cells): idle cycles are the measured step less the model's time in
    collectives, over the cell's cycle time."""
    loop = {phase: loopback_phases(loopback, phase) for phase in ("compress", "update")}
    points = []
    for path in records:
        for cell in json.loads(path.read_text())["cells"].values():
            tensors = [Tensor(t["name"], tuple(t["shape"]), t["ready_fraction"])
                       for t in prof["workloads"][cell["workload"]]["tensors"]]
            cycle_s = cycle_time_ms(path, cell) / 1e3
            for method, run in cell["runs"].items():
                costs, _ = costs_for("A", run, cell, method, prof, loop)
                moved = parse_method(method)
                plan = step_plan(moved, traffic(moved, tensors, cell["workers"]), costs, cell["workers"])
                busy = expected_step(plan, cell["workers"], link_of(cell), HorovodConfig(cycle_time_s=cycle_s)).busy_s
                step = run["train_s"] / run["steps"]
                nic = run["curve"][-1][3] / run["curve"][-1][1]
                sent = traffic(moved, tensors, cell["workers"]).sent_bytes(cell["workers"])
                points.append({"record": str(path.relative_to(ROOT)), "method": method, "cycle_ms": cycle_s * 1e3,
                               "idle_cycles": max(0.0, step - busy) / cycle_s, "extra_bytes": nic - FRAMING * sent})
    n = len(points)
    mx = sum(p["idle_cycles"] for p in points) / n
    my = sum(p["extra_bytes"] for p in points) / n
    slope = (sum((p["idle_cycles"] - mx) * (p["extra_bytes"] - my) for p in points)
             / sum((p["idle_cycles"] - mx) ** 2 for p in points))
    return Coordination(slope, my - slope * mx), points


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--fit", action="store_true", help="print FRAMING and COORDINATION as the records give them")
    args = parser.parse_args(argv)
    prof = json.loads(PROFILE.read_text())
    if args.fit:
        framing = framing_fit(RECORDS, prof)
        fitted, points = coordination_fit(FIT_RECORDS, prof, json.loads(LOOPBACK.read_text()))
        for p in points:
            print(f"{p['record']}: {p['method']}: {p['idle_cycles']:.0f} idle cycles a step, "
                  f"{p['extra_bytes'] / 1e3:.1f} kB a step beyond the framed payload")
        print(f"framing {framing:.3f} (FRAMING = {FRAMING}); coordination {fitted.bytes_per_cycle:.0f} B a cycle + "
              f"{fitted.bytes_per_step / 1e3:.1f} kB a step (COORDINATION = {COORDINATION})")
        return 0
    rows = validate(RECORDS, prof, json.loads(LOOPBACK.read_text()))
    lines = summary(rows)
    table = markdown(rows)
    head = (f"Predicted against measured training time (evaluation excluded) of every Horovod run on an emulated "
            f"link, written by `python -m benchmarks.model.planner_validation`. Latency {LATENCY_S * 1e6:.0f} us a hop, "
            f"Horovod cycle as each cell ran (*cycle ms*), framing {FRAMING:g}x the payload, Horovod's coordination "
            f"{COORDINATION.bytes_per_cycle:.0f} B an idle cycle plus {COORDINATION.bytes_per_step / 1e3:.1f} kB a step "
            "(NIC bytes, fitted on `bench/results/tta/cycle-time/`, whose cells the table does not hold). \\* A from the "
            "cell's bound (the record kept no phases).")
    args.out.mkdir(parents=True, exist_ok=True)
    protocol = protocol_rows(json.loads(EVIDENCE.read_text()), prof, json.loads(LOOPBACK.read_text()))
    (args.out / "validation.md").write_text(head + "\n\n" + "\n".join(f"- {line}" for line in lines) + "\n\n" + table
                                            + "\n\n" + protocol_markdown(protocol) + "\n")
    (args.out / "validation.json").write_text(json.dumps({"rows": rows, "summary": lines, "protocol_rows": protocol, "framing": FRAMING,
                                                          "coordination": {"bytes_per_cycle": COORDINATION.bytes_per_cycle,
                                                                           "bytes_per_step": COORDINATION.bytes_per_step},
                                                          "latency_s": LATENCY_S}, indent=1))
    print("\n".join(lines))
    print(f"wrote {args.out / 'validation.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
