"""Time to accuracy on emulated links: PacTrain against dense fp32, fp16, Top-k and PowerSGD, end to end
(on Horovod, and on torch DDP against torch's own fp16 and PowerSGD hooks: ``ddp-`` methods; ``tf-`` methods
train the image workload in TensorFlow, ``tf_tta_worker.py``, in the same command).

    python -m benchmarks tta --quick          # a few steps per method: bytes and sanity (make test)
    python -m benchmarks tta --workloads image --links 100mbit --workers 2 --steps 900 --eval-every 75

A cell is (workload, link, workers). For each cell the harness makes one network namespace and
emulated NIC per worker (``links.py``), measures the *concurrent* compute bound (all workers
training at once with no communication, so they share the CPU as a cell's ranks do; TensorFlow's tape loop
when every method of the part is a ``tf-`` one, else torch's), then trains
every method for the same steps (``tta_worker.py``: same seed, data order, optimizer and cosine
schedule) and records its curve: (training seconds, step, held-out metric, NIC bytes). Each run
is appended to ``--record`` as it finishes, so the matrix can run in parts and a stop loses at
most the run in flight; ``--report-only`` rebuilds the report (``tta_report.py``) from the record.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common.methods import parse_method
from benchmarks.links.links import Loopback, Topology, namespaces_unavailable, parse_link
from benchmarks.runner.jobs import run_job
from benchmarks.runner.probing import probe_links
from benchmarks.runner.processes import Processes, python_module, run_concurrently
from benchmarks.runner.signals import cleanup_on_signals
from benchmarks.tta.tta_report import adopt_reference, cycle_time_ms, write_report

REPO = Path(__file__).resolve().parents[2]
METHODS = ("dense", "fp16", "topk", "powersgd", "pactrain-0.8-fp16", "pactrain-0.9-fp16", "pactrain-0.9-ternary",
           "ddp-fp16", "ddp-powersgd", "ddp-pactrain-0.9-fp16")
QUICK_METHODS = ("dense", "fp16", "topk", "powersgd", "pactrain-0.9-fp16", "pactrain-0.95-ternary-w0-0",
                 "ddp-pactrain-0.9-fp16")
BOUND_STEPS = 20


def cell_key(workload: str, link: str, workers: int) -> str:
    return f"{workload}/{link}/{workers}w"


def load_record(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {"cells": {}}


def save_record(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(record, indent=1) + "\n")
    temporary.replace(path)


def worker_command(args: argparse.Namespace, workload: str, method: str, out: Path, compute_only: bool = False,
                   steps: int | None = None) -> list[str]:
    flags = ["--workload", workload, "--method", method, "--steps", str(steps or args.steps), "--eval-every",
             str(args.eval_every), "--budget-s", str(0.0 if compute_only else args.budget_s),
             "--eval-samples", str(args.eval_samples), "--eval-batches", str(args.eval_batches),
             "--seed", str(args.seed), "--data-seed", str(args.data_seed), "--out", str(out),
             *(["--batch-size", str(args.batch_size)] if args.batch_size else [])]
    module = "benchmarks.tta.tf_tta_worker" if is_tensorflow(method) else "benchmarks.tta.tta_worker"
    return python_module(module, *flags, *(["--compute-only"] if compute_only else []))


def is_tensorflow(method: str) -> bool:
    """``tf-`` methods train in TensorFlow (``tf_tta_worker.py``), the rest in torch (``tta_worker.py``)."""
    return parse_method(method).framework == "tensorflow"


def concurrent_bound(args: argparse.Namespace, workload: str, workers: int, processes: Processes, workdir: Path,
                     framework: str = "torch") -> dict:
    """``workers`` plain trainings at once (torch's, or TensorFlow's tape loop), no communication: the step-time
    floor of this machine."""
    outs = [workdir / f"bound-{workload}-{rank}.json" for rank in range(workers)]
    method = "tf-dense" if framework == "tensorflow" else "dense"
    commands = [worker_command(args, workload, method, out, compute_only=True, steps=BOUND_STEPS) for out in outs]
    run_concurrently(processes, commands, [out.with_suffix(".log") for out in outs], args.timeout,
                     f"compute bound for {workload}")
    ranks = [json.loads(out.read_text()) for out in outs]

    def median(series: list[float]) -> float:  # over ranks of each rank's median past the first two steps
        return statistics.median(statistics.median(s[2:] or s) for s in series)

    step_s = median([r["step_s"] for r in ranks])
    return {"workers": workers, "framework": framework, "step_s": step_s, "samples_per_s": workers * ranks[0]["batch_size"] / step_s,
            **{f"{phase}_s": median([r["phases_s"][phase] for r in ranks]) for phase in ("compute", "update")}}


def run_method(args: argparse.Namespace, topology: Topology | Loopback, processes: Processes, workload: str,
               method: str, workdir: Path) -> dict:
    """One training of every rank; rank 0's record plus every rank's NIC bytes sent (kernel counters)."""
    outs = [workdir / f"{workload}-{method}-rank{rank}.json" for rank in range(topology.world_size)]
    nic = isinstance(topology, Topology)
    before = [topology.counters(rank) for rank in range(topology.world_size)] if nic else []
    started = time.monotonic()
    run_job(topology, processes, lambda rank: worker_command(args, workload, method, outs[rank]), workdir, args.timeout,
            cycle_time_ms=args.cycle_time_ms)
    record = json.loads(outs[0].read_text())
    record["wall_s"] = time.monotonic() - started
    if nic:
        record["nic_tx_bytes"] = [a["tx_bytes"] - b["tx_bytes"] for a, b in
                                  zip([topology.counters(rank) for rank in range(topology.world_size)], before)]
    return record


def run_cell(args: argparse.Namespace, record: dict, workload: str, link_text: str, workers: int,
             processes: Processes, workdir: Path) -> None:
    key = cell_key(workload, link_text, workers)
    cell = record["cells"].setdefault(key, {"workload": workload, "link": link_text, "workers": workers, "runs": {},
                                            "steps": args.steps, "eval_every": args.eval_every,
                                            "budget_s": args.budget_s, "cycle_time_ms": args.cycle_time_ms,
                                            "batch_size": args.batch_size})
    # Steps, cycle time and batch make the cell; a part may evaluate more often or stop at a budget (each run
    # records its own evaluation interval and budget).
    protocol = (cell["steps"], cycle_time_ms(cell), cell.get("batch_size"))
    asked = (args.steps, args.cycle_time_ms, args.batch_size)
    if protocol != asked:
        raise RuntimeError(f"{key} in {args.record} ran (steps, cycle ms, batch) {protocol}; this run asks for "
                           f"{asked}: use the same, or another --record")
    todo = [m for m in args.methods if m not in cell["runs"]]
    if not todo:
        print(f"[tta] {key}: every method is in the record already", flush=True)
        return
    link = parse_link(link_text)
    skipped = args.loopback or namespaces_unavailable()
    topology = Loopback(workers) if skipped else Topology(workers)
    try:
        if skipped:
            cell["where"] = f"loopback, unshaped ({skipped})"
        else:
            topology.create()
            topology.shape(link)
            cell["probed_mbit_per_s"] = probe_links(topology, processes, seconds=1.0)["mbit_per_s"]
            cell["where"] = f"emulated {link_text} per worker (probed {cell['probed_mbit_per_s']:.0f} Mbit/s)"
        framework = "tensorflow" if all(is_tensorflow(m) for m in todo) else "torch"
        cell["bound"] = concurrent_bound(args, workload, workers, processes, workdir, framework)
        cell["load"] = os.getloadavg()
        print(f"[tta] {key}: {cell['where']}; concurrent bound {cell['bound']['samples_per_s']:.1f} samples/s",
              flush=True)
        for method in todo:
            print(f"[tta] {key}: {method}, {args.steps} steps", flush=True)
            cell["runs"][method] = dict(run_method(args, topology, processes, workload, method, workdir),
                                        load=os.getloadavg(), bound=cell["bound"],  # a later part re-measures
                                        eval_every=args.eval_every, budget_s=args.budget_s)
            run = cell["runs"][method]
            print(f"[tta] {key}: {method}: {run['metric']} {run['curve'][-1][2]:.4f} after {run['train_s']:.0f} s "
                  f"of training", flush=True)
            save_record(args.record, record)
    finally:
        processes.stop_all()
        if isinstance(topology, Topology):
            topology.teardown()
        save_record(args.record, record)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks tta", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="image, 100mbit, 2 workers, 6 steps: sanity, not speed")
    parser.add_argument("--workloads", nargs="+", choices=("image", "language"), default=["image"])
    parser.add_argument("--links", nargs="+", default=["100mbit"], help="rate per worker's NIC: 100mbit, 25mbit, ...")
    parser.add_argument("--workers", type=int, nargs="+", default=[2])
    parser.add_argument("--methods", nargs="+", default=list(METHODS))
    parser.add_argument("--steps", type=int, default=900, help="optimizer steps per run (every method)")
    parser.add_argument("--eval-every", type=int, default=75)
    parser.add_argument("--budget-s", type=float, default=0.0,
                        help="per run, stop at the first evaluation past this many training seconds (0: none)")
    parser.add_argument("--eval-samples", type=int, default=10000, help="image: test images per evaluation")
    parser.add_argument("--eval-batches", type=int, default=20, help="language: validation batches per worker")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--data-seed", type=int, default=0, help="image: the order of the training batches")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="per worker (image 64, language 16); the learning rate follows the global batch")
    parser.add_argument("--cycle-time-ms", type=float, default=5.0,
                        help="HOROVOD_CYCLE_TIME of every rank: each cycle costs a coordination round trip on the link")
    parser.add_argument("--timeout", type=float, default=5400.0, help="seconds before a run is abandoned")
    parser.add_argument("--loopback", action="store_true", help="no link emulation, even as root")
    parser.add_argument("--record", type=Path, default=REPO / "bench" / "results" / "tta" / "record.json")
    parser.add_argument("--report-only", action="store_true", help="rebuild the report from --record")
    parser.add_argument("--reference", type=Path, default=None,
                        help="another part's record: its fp16 final sets the target of cells run here without fp16")
    args = parser.parse_args(argv)
    if args.reference is not None and not args.reference.is_file():
        parser.error(f"--reference {args.reference}: no such record")
    if args.quick:
        args.workloads, args.links, args.workers, args.methods = ["image"], ["100mbit"], [2], list(QUICK_METHODS)
        args.steps, args.eval_every, args.eval_samples = 6, 3, 1000
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    record = load_record(args.record)
    if not args.report_only:
        processes = Processes()
        with cleanup_on_signals(), tempfile.TemporaryDirectory(prefix="ptb-tta-") as tmp:
            try:
                for workload in args.workloads:
                    for link in args.links:
                        for workers in args.workers:
                            run_cell(args, record, workload, link, workers, processes, Path(tmp))
            except (RuntimeError, TimeoutError, OSError) as error:
                print(f"[tta] FAILED: {error}", flush=True)
                write_report(record, args.record.parent)
                return 1
    if args.reference is not None:
        adopt_reference(record, load_record(args.reference), str(args.reference))
        save_record(args.record, record)
    markdown = write_report(record, args.record.parent)
    print(markdown, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
