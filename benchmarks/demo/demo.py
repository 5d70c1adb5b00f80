"""``make demo``: the same small training three times, dense Horovod, Horovod's fp16 compression and PacTrain.

    python -m benchmarks.demo.demo              # what `make demo` runs: output under demo-output/
    python -m benchmarks.demo.demo --loopback   # no link emulation, even as root
    python -m benchmarks.demo.demo --record     # refresh the committed record, reports/demo/

Every run is ``examples/pytorch_demo.py`` on 2 workers (``--dense``: ``hvd.DistributedOptimizer``;
``--dense --fp16``: the same with ``compression=hvd.Compression.fp16``; else ``pt.DistributedOptimizer``),
started the way the benchmark starts its cells: as root, each rank in its own network namespace
behind an emulated 100 Mbit/s NIC (``links.py``); otherwise on loopback, unshaped, which it says.
Rank 0's output passes through. It ends with a table (samples/s, MB per step, test accuracy, wall
time) and a PNG of test accuracy against training time, written with the table under ``--out``
(default ``demo-output/``, not tracked by git).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.links.links import Loopback, Topology, namespaces_unavailable, parse_link
from benchmarks.runner.jobs import run_job
from benchmarks.runner.probing import probe_links
from benchmarks.runner.processes import Processes
from benchmarks.runner.signals import cleanup_on_signals
from pactrain_hvd.core.accounting import ring_allreduce_bytes

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "pytorch_demo.py"
WORKERS = 2


@dataclass
class DemoRun:
    """One of the two trainings and what it measured."""

    title: str
    flags: list[str]
    result: dict | None = None
    wall_s: float = 0.0
    nic_tx_bytes_per_step: float | None = None  # None on loopback: no NIC of its own

    @property
    def mb_per_step(self) -> float:
        if self.nic_tx_bytes_per_step is not None:
            return self.nic_tx_bytes_per_step / 1e6
        return ring_allreduce_bytes(self.result["sent_bytes_per_step"], self.result["world_size"]) / 1e6


def aligned_table(headers: list[str], rows: list[list[str]]) -> str:
    """A markdown table padded to line up in a terminal; columns after the first align right."""
    widths = [max(len(cell) for cell in column) for column in zip(headers, *rows)]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))) + " |"

    rule = "|" + "|".join("-" * (w + 1) + ("-" if i == 0 else ":") for i, w in enumerate(widths)) + "|"
    return "\n".join([line(headers), rule, *(line(row) for row in rows)])


def results_table(runs: list[DemoRun]) -> str:
    """The five-second table, then PacTrain (the last run) against dense (the first) and against fp16 (a middle one)."""
    bytes_header = "MB/step on the NIC" if runs[0].nic_tx_bytes_per_step is not None else "MB/step (estimated)"
    rows = [[run.title, f"{run.result['samples_per_s']:.0f}", f"{run.mb_per_step:.2f}",
             f"{run.result['test_accuracy']:.3f}", f"{run.wall_s:.0f} s"] for run in runs]
    table = aligned_table(["run", "samples/s", bytes_header, "test accuracy", "wall time"], rows)
    dense, packed = runs[0], runs[-1]
    verdict = (f"PacTrain: {packed.result['samples_per_s'] / dense.result['samples_per_s']:.1f}x the samples/s of "
               f"dense Horovod, {dense.mb_per_step / packed.mb_per_step:.1f}x fewer bytes per step, test accuracy "
               f"{100 * (packed.result['test_accuracy'] - dense.result['test_accuracy']):+.1f} points.")
    for fp16 in [run for run in runs[1:-1] if "fp16" in run.title]:
        verdict += (f" Against {fp16.title}: {packed.result['samples_per_s'] / fp16.result['samples_per_s']:.1f}x the "
                    f"samples/s, {fp16.mb_per_step / packed.mb_per_step:.1f}x fewer bytes per step.")
    return f"{table}\n\n{verdict}"


def plot_curves(runs: list[DemoRun], title: str, path: Path) -> Path:
    """Test accuracy against training time (evaluation excluded), one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6.4, 4.0))
    for run in runs:
        seconds, _, accuracy = zip(*run.result["curve"])
        axis.plot(seconds, accuracy, marker="o", label=f"{run.title} ({run.result['samples_per_s']:.0f} samples/s)",
                  linewidth=2.5 if "PacTrain" in run.title else 1.5)
    axis.set_xlabel("training time, s (evaluation excluded)")
    axis.set_ylabel("test accuracy")
    axis.set_ylim(0, 1)
    axis.set_xlim(left=0)
    axis.grid(alpha=0.3)
    axis.set_title(title, fontsize=10)
    axis.legend(loc="lower right")
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return path


def column_notes(nic: bool) -> str:
    """What each column of the table measured."""
    return "\n".join([
        "- samples/s: both workers, training steps only (evaluations excluded)",
        "- MB/step on the NIC: each worker's kernel tx counter over the whole run (start-up broadcast and "
        "evaluations included) / steps, mean over workers" if nic else
        "- MB/step (estimated): ring all-reduce of the bytes each worker hands Horovod (loopback has no NIC "
        "per worker to count)",
        "- test accuracy: the last evaluation, 2000 Fashion-MNIST test images",
        "- wall time: launch to exit of the run (start-up, data, evaluations included)",
    ])


def write_outputs(runs: list[DemoRun], where: str, out: Path) -> tuple[str, Path | None]:
    """``results.md``, ``results.json`` and ``demo.png`` (None without matplotlib) under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    table = f"{results_table(runs)}\n\n{column_notes(runs[0].nic_tx_bytes_per_step is not None)}"
    try:
        picture = plot_curves(runs, f"Fashion-MNIST, {WORKERS} workers, {where}", out / "demo.png")
    except ImportError:
        picture = None
    (out / "results.md").write_text(f"`make demo`, link: {where}.\n\n{table}\n"
                                    + (f"\n![test accuracy against training time]({picture.name})\n" if picture else ""))
    (out / "results.json").write_text(json.dumps(
        {"link": where, "runs": [dict(run.result, wall_s=run.wall_s, mb_per_step=run.mb_per_step) for run in runs]},
        indent=1))
    return table, picture


def say(message: str) -> None:
    print(message, flush=True)


def train(run: DemoRun, topology: Topology | Loopback, processes: Processes, args: argparse.Namespace,
          workdir: Path) -> None:
    """One training on every rank; fills in ``run``'s result, wall time and NIC bytes."""
    out = workdir / f"{run.title.replace(' ', '-').replace('+', '').lower()}.json"
    nic = isinstance(topology, Topology)
    before = [topology.counters(rank) for rank in range(WORKERS)] if nic else []
    started = time.monotonic()
    run_job(topology, processes, lambda rank: [sys.executable, str(EXAMPLE), *run.flags, "--steps", str(args.steps),
                                               "--result-json", str(out)],
            workdir, args.timeout, show_rank=0)
    run.wall_s = time.monotonic() - started
    run.result = json.loads(out.read_text())
    if nic:
        after = [topology.counters(rank) for rank in range(WORKERS)]
        run.nic_tx_bytes_per_step = statistics.mean(
            a["tx_bytes"] - b["tx_bytes"] for a, b in zip(after, before)) / args.steps


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.demo.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--link", default="100mbit", help="emulated rate per worker's NIC (root only)")
    parser.add_argument("--loopback", action="store_true", help="run on loopback even where links can be emulated")
    parser.add_argument("--steps", type=int, default=90, help="training steps per run")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds before a run is abandoned")
    parser.add_argument("--out", type=Path, default=REPO / "demo-output", help="where the table and picture go")
    parser.add_argument("--record", action="store_true", help="write the committed record, reports/demo/, instead")
    args = parser.parse_args(argv)
    if args.record:
        args.out = REPO / "reports" / "demo"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    link = parse_link(args.link)
    rate = f"{link.rate_mbit:g} Mbit/s" if link.rate_mbit else link.label
    started = time.monotonic()
    skipped = "--loopback" if args.loopback else namespaces_unavailable()
    topology = Loopback(WORKERS) if skipped else Topology(WORKERS)
    runs = [DemoRun("dense Horovod", ["--dense"]), DemoRun("Horovod fp16", ["--dense", "--fp16"]),
            DemoRun("PacTrain 0.9", ["--sparsity", "0.9"])]
    say(f"PacTrain demo: Fashion-MNIST, {WORKERS} workers, {args.steps} steps, trained {len(runs)} times: "
        f"{runs[0].title} (hvd.DistributedOptimizer), {runs[1].title} (compression=hvd.Compression.fp16), "
        f"then {runs[2].title} (pt.DistributedOptimizer).")
    if skipped:
        where = "loopback, unshaped"
        say(f"Link: loopback, unshaped. Skipped: the emulated {rate} link per worker ({skipped}). Loopback is "
            "far faster than a network, so expect a smaller gap than on a real cluster link.")
    processes = Processes()
    with cleanup_on_signals(), tempfile.TemporaryDirectory(prefix="ptb-demo-") as tmp:
        try:
            if not skipped:
                topology.create()
                topology.shape(link)
                probed = probe_links(topology, processes, seconds=1.0)["mbit_per_s"]
                where = f"emulated {rate} link per worker (probed {probed:.0f} Mbit/s)"
                say(f"Link: each worker in its own network namespace behind an emulated {rate} NIC (tc tbf both "
                    f"ways); a TCP probe measured {probed:.1f} Mbit/s.")
            for number, run in enumerate(runs, 1):
                say(f"\n== run {number}/{len(runs)}: {run.title}")
                train(run, topology, processes, args, Path(tmp))
        except (RuntimeError, TimeoutError, OSError) as error:
            say(f"demo FAILED: {error}")
            return 1
        finally:
            processes.stop_all()
            if isinstance(topology, Topology):
                topology.teardown()
    table, picture = write_outputs(runs, where, args.out)
    say(f"\n== dense Horovod, Horovod fp16 and PacTrain, {where}\n\n{table}\n")
    say(f"Picture (test accuracy against training time): {picture}" if picture else
        "Picture skipped: matplotlib is not installed (pip install matplotlib)")
    say(f"Demo took {time.monotonic() - started:.0f} s.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
