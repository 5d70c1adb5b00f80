"""Run a protocol in resumable parts: ``python -m benchmarks protocol run PROTOCOL --stage selection``.

    python -m benchmarks protocol run benchmarks/protocol/evidence.toml --stage selection
    python -m benchmarks protocol run benchmarks/protocol/evidence.toml --stage final --cells image-10mbit
    python -m benchmarks protocol set-aside benchmarks/protocol/evidence.toml
    python -m benchmarks protocol report benchmarks/protocol/evidence.toml --readme README.md
    python -m benchmarks protocol run benchmarks/protocol/quick.toml --stage all --record /tmp/quick.json

A part runs every planned run that is not in the record yet and appends each to the record as it ends,
so a stop loses at most the run in flight. The final stage runs each family's setting chosen by the
selection (computed from the record, ``verdicts.selection``) and refuses to start before the selection is
complete. Every run records its method, setting, seed, curve ``[training s, step, metric, NIC bytes]``,
wall seconds, start-up, evaluation times, load, step phases and the commit that ran it. ``set-aside``
moves the final runs that shared the cores with other work out of the verdicts (``quiet.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from benchmarks.links.links import Loopback, Topology, namespaces_unavailable, parse_link
from benchmarks.protocol import quiet, report
from benchmarks.protocol.spec import Protocol, ProtocolError, load_protocol
from benchmarks.protocol.verdicts import loopback_cell, runs_of, selection, verdicts
from benchmarks.runner.probing import probe_links, probe_round_trip
from benchmarks.runner.processes import Processes
from benchmarks.runner.signals import cleanup_on_signals
from benchmarks.tta.tta import concurrent_bound, run_method, save_record

REPO = Path(__file__).resolve().parents[2]
PHASES = ("compute", "compress", "comm_wait", "update")


@dataclass(frozen=True)
class Planned:
    stage: str
    cell: str  # a cell's name, or loopback_cell(workload) for the reference's target runs
    family: str
    method: str
    seed: int


def load_record(protocol: Protocol, path: Path) -> dict:
    if not path.is_file():
        return {"protocol": {"name": protocol.name, "file": str(protocol.path), "digest": protocol.digest}, "runs": []}
    record = json.loads(path.read_text())
    if record["protocol"]["digest"] != protocol.digest:
        raise ProtocolError(f"{path} was written under another version of {protocol.path} (digest "
                            f"{record['protocol']['digest'][:12]}, now {protocol.digest[:12]}): a protocol does not "
                            "change after its runs start; write a new protocol file and record")
    return record


def rotated(items: list, by: int) -> list:
    """The run order moves by one family per seed, so slow drifts of the machine fall on every family."""
    return items[by % len(items):] + items[:by % len(items)] if items else items


def plan(protocol: Protocol, record: dict, stage: str) -> list[Planned]:
    """Every run the stage needs, in order; the caller skips those already in the record."""
    reference = protocol.reference
    planned = []
    if stage == "selection":
        cell = protocol.cells[protocol.selection_cell]
        for seed in protocol.selection_seeds:
            planned.append(Planned(stage, loopback_cell(cell.workload), reference.name, reference.candidates[0], seed))
            for family in rotated(protocol.runnable(), seed):
                planned += [Planned(stage, cell.name, family.name, method, seed) for method in family.candidates]
        return planned
    chosen = selection(protocol, record)  # families whose selection is complete go on; the others wait for theirs
    picks = [(name, row["chosen"]) for name, row in chosen["families"].items() if row["chosen"]]
    if not picks:
        raise ProtocolError(f"{protocol.path}: no family's selection is complete in the record; run --stage selection")
    for cell in protocol.cells.values():
        for seed in protocol.final_seeds:
            planned.append(Planned(stage, loopback_cell(cell.workload), reference.name, reference.candidates[0], seed))
            planned += [Planned(stage, cell.name, name, method, seed) for name, method in rotated(picks, seed)]
    return list(dict.fromkeys(planned))  # a workload's loopback runs serve all its cells


def done(record: dict, run: Planned) -> bool:
    return bool(runs_of(record, stage=run.stage, cell=run.cell, method=run.method, seed=run.seed))


def commit() -> str:
    result = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "pactrain_hvd", "benchmarks", "examples"],
                           cwd=REPO, capture_output=True, text=True).stdout.strip()
    return result.stdout.strip() + ("+uncommitted" if dirty else "") if result.returncode == 0 else "unknown"


def workload_of(protocol: Protocol, cell: str) -> str:
    """A cell's workload (a loopback cell is named after its own)."""
    return cell.split("/", 1)[1] if cell.startswith("loopback/") else protocol.cells[cell].workload


def settings(protocol: Protocol, run: Planned, cycle_ms: float, timeout_s: float) -> SimpleNamespace:
    """What ``tta.worker_command`` and ``tta.run_method`` read, for one planned run."""
    workload = protocol.workloads[workload_of(protocol, run.cell)]
    reference = run.method == protocol.reference.candidates[0] and not run.cell.startswith("loopback/")
    return SimpleNamespace(steps=workload.steps, eval_every=workload.eval_every, eval_samples=workload.eval_samples,
                           eval_batches=workload.eval_batches, seed=run.seed, data_seed=run.seed, batch_size=None,
                           budget_s=workload.reference_budget_s if reference else workload.budget_s,
                           timeout=timeout_s, cycle_time_ms=cycle_ms)


def summarized(raw: dict) -> dict:
    """Rank 0's worker record, with its per-step series reduced to what the report reads."""
    keep = ("workload", "metric", "size", "steps", "planned_steps", "budget_s", "batch_size", "seed", "data_seed",
            "curve", "train_s", "parameters", "sparsity", "local_s", "broadcast", "eval_elapsed_s", "eval_s",
            "elapsed_s", "wall_s", "nic_tx_bytes")
    steady = raw["step_s"][2:] or raw["step_s"]
    return {**{key: raw[key] for key in keep if key in raw},
            "step_s_median": statistics.median(steady),
            "phases_s_median": {name: statistics.median(raw["phases_s"][name][2:] or raw["phases_s"][name])
                                for name in PHASES if raw["phases_s"].get(name)},
            "step_s": [round(s, 4) for s in raw["step_s"]],
            "handed_bytes_last": raw["handed_bytes"][-1] if raw.get("handed_bytes") else None}


def run_where(protocol: Protocol, record: dict, where: str, runs: list[Planned], path: Path, loopback_only: bool,
              timeout_s: float, processes: Processes, workdir: Path) -> None:
    """Every planned run of one cell (or of a workload's loopback), in one topology built once."""
    on_loopback = where.startswith("loopback/") or loopback_only
    cell = None if where.startswith("loopback/") else protocol.cells[where]
    workload = workload_of(protocol, where)
    topology = Loopback(protocol.workers) if on_loopback else Topology(protocol.workers)
    context: dict = {"cycle_ms": cell.cycle_ms if cell else 1.0, "commit": commit()}  # the code of this part
    try:
        if on_loopback:
            context["where"] = "loopback, unshaped"
        else:
            topology.create()
            topology.shape(parse_link(cell.link, delay_ms=cell.rtt_ms / 2))
            context["probed_mbit_per_s"] = probe_links(topology, processes, seconds=1.0)["mbit_per_s"]
            context["probed_rtt_ms"] = probe_round_trip(topology, processes)
            context["where"] = (f"emulated {cell.link} per worker, {cell.rtt_ms:g} ms round trip (probed "
                                f"{context['probed_mbit_per_s']:.1f} Mbit/s, {context['probed_rtt_ms']:.2f} ms)")
        bound_args = settings(protocol, runs[0], context["cycle_ms"], timeout_s)
        context["bound"] = concurrent_bound(bound_args, workload, protocol.workers, processes, workdir)
        print(f"[protocol] {where}: {context['where']}; compute bound {context['bound']['step_s']:.3f} s a step",
              flush=True)
        for run in runs:
            print(f"[protocol] {run.stage} {where} {run.method} seed {run.seed}", flush=True)
            args = settings(protocol, run, context["cycle_ms"], timeout_s)
            raw = run_method(args, topology, processes, workload, run.method, workdir)
            entry = {"stage": run.stage, "cell": run.cell, "family": run.family, "method": run.method,
                     "seed": run.seed, "load": os.getloadavg(), **context, **summarized(raw)}
            record["runs"].append(entry)
            save_record(path, record)
            final = entry["curve"][-1]
            print(f"[protocol] {run.method} seed {run.seed}: {entry['metric']} {final[2]:.4f} at step {final[1]} after "
                  f"{entry['train_s']:.0f} s of training ({entry['wall_s']:.0f} s wall)", flush=True)
    finally:
        processes.stop_all()
        if isinstance(topology, Topology):
            topology.teardown()


def run_stage(protocol: Protocol, stage: str, path: Path, cells: list[str] | None, loopback_only: bool,
              timeout_s: float) -> int:
    record = load_record(protocol, path)
    stages = ("selection", "final") if stage == "all" else (stage,)
    processes = Processes()
    with cleanup_on_signals(), tempfile.TemporaryDirectory(prefix="ptb-protocol-") as tmp:
        for current in stages:
            wanted = None if cells is None else {*cells, *(loopback_cell(protocol.cells[c].workload) for c in cells)}
            todo = [run for run in plan(protocol, record, current) if not done(record, run)
                    and (wanted is None or run.cell in wanted)]
            print(f"[protocol] {protocol.name} {current}: {len(todo)} runs to go", flush=True)
            for where in dict.fromkeys(run.cell for run in todo):
                run_where(protocol, record, where, [run for run in todo if run.cell == where], path, loopback_only,
                          timeout_s, processes, Path(tmp))
    report.write(protocol, record, path.parent)
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks protocol", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("run", "report", "set-aside"))
    parser.add_argument("protocol", type=Path)
    parser.add_argument("--stage", choices=("selection", "final", "all"), default="all")
    parser.add_argument("--cells", nargs="+", default=None, help="only these cells (and their loopback targets)")
    parser.add_argument("--record", type=Path, default=None, help="default: the protocol's own record")
    parser.add_argument("--loopback", action="store_true", help="no link emulation (a dry run: its times mean nothing)")
    parser.add_argument("--readme", type=Path, default=None, help="report: rewrite this file's verdict table")
    parser.add_argument("--timeout", type=float, default=5400.0, help="seconds before a run is abandoned")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        protocol = load_protocol(args.protocol)
        path = args.record or REPO / protocol.record
        if args.cells:
            unknown = sorted(set(args.cells) - set(protocol.cells))
            if unknown:
                raise ProtocolError(f"--cells {' '.join(unknown)}: not cells of {args.protocol} ({sorted(protocol.cells)})")
        if args.action == "set-aside":
            record = load_record(protocol, path)
            for moved in quiet.set_aside(protocol, record):
                run = moved["run"]
                print(f"[protocol] set aside {run['cell']} {run['method']} seed {run['seed']}: {moved['reason']}")
            save_record(path, record)
            return 0
        if args.action == "report":
            record = load_record(protocol, path)
            print(report.write(protocol, record, path.parent), flush=True)
            if args.readme:
                report.update_readme(args.readme, protocol, verdicts(protocol, record))
            return 0
        loopback = args.loopback or bool(namespaces_unavailable())
        return run_stage(protocol, args.stage, path, args.cells, loopback, args.timeout)
    except ProtocolError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except (RuntimeError, TimeoutError, OSError) as error:
        print(f"[protocol] FAILED: {error}", flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
