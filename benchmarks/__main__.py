"""PacTrain benchmark under constrained bandwidth (root, Linux network namespaces, tc tbf).

    python -m benchmarks --quick                      # one model, one link, < 3 min
    python -m benchmarks                              # the full matrix (long)
    python -m benchmarks --models vgg16 --bandwidths 100mbit --methods dense,pactrain-0.9-fp16
    python -m benchmarks --models fashion-vgg --methods dense,tf-dense,tf-pactrain-0.9-fp16,keras-pactrain-0.9-fp16
    python -m benchmarks --report-only bench/results/<timestamp>.json
    python -m benchmarks tta --quick                  # time to accuracy (benchmarks/tta/tta.py)
    python -m benchmarks protocol run benchmarks/protocol/evidence.toml   # the preregistered protocol

Every rank gets its own namespace and emulated NIC (veth into a bridge namespace, tbf rate
limit both ways); Horovod's Gloo rendezvous runs in the bridge namespace. Writes
bench/results/<timestamp>.json, .md (and latest.md) and PNG plots.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from benchmarks.common.methods import DEFAULT_METHODS, QUICK_METHODS
from benchmarks.links.links import parse_link
from benchmarks.runner.config import BATCH_SIZES, SKIPPED, BenchConfig
from benchmarks.runner.run import run_benchmark
from benchmarks.throughput.report import evaluate_targets, results_table, targets_table, write_outputs

DEFAULT_BANDWIDTHS = ("100mbit", "1gbit", "unthrottled")


def _list(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def _batch_sizes(items: list[str]) -> dict[str, int]:
    sizes = dict(BATCH_SIZES)
    for item in items:
        model, _, value = item.partition("=")
        if not value.isdigit() or int(value) < 1:
            raise SystemExit(f"--batch-size wants MODEL=N with N >= 1, got {item!r}")
        sizes[model] = int(value)
    return sizes


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help=f"resnet18, 100mbit, {', '.join(QUICK_METHODS)}, 1 warm-up + 3 steps, batch 8")
    parser.add_argument("--models", type=_list, default=None, help="comma list (default resnet18,vgg16,gpt; also fashion-vgg, "
                        "the model the TensorFlow methods tf-NAME and keras-NAME run)")
    parser.add_argument("--methods", type=_list, default=None, help=f"comma list (default {','.join(DEFAULT_METHODS)})")
    parser.add_argument("--bandwidths", type=_list, default=None, help="comma list of 100mbit, 1gbit, unthrottled, ...")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="one-way delay on what every NIC receives (an NFQUEUE program; needs iptables)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--batch-size", action="append", default=[], metavar="MODEL=N")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    parser.add_argument("--probe-seconds", type=float, default=None)
    parser.add_argument("--cell-timeout", type=float, default=900.0, help="seconds before a cell is abandoned")
    parser.add_argument("--repeats", type=int, default=1,
                        help="interleaved rounds per model and link; figures are the best round's (shared machines)")
    parser.add_argument("--cycle-time-ms", type=float, default=5.0,
                        help="HOROVOD_CYCLE_TIME for every rank of every cell, every method (default 5; Horovod's "
                             "own default of 1 ms costs ~11%% of a core per idle worker here); 0 for Horovod's")
    parser.add_argument("--skip", type=_list, default=[], help="cells MODEL/LINK/METHOD not to run, glob patterns: gpt/1gbit/*")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--report-only", type=Path, default=None, help="re-render a results JSON, run nothing")
    return parser.parse_args(argv)


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    quick = args.quick
    sizes = _batch_sizes(args.batch_size if not quick or args.batch_size else ["resnet18=8"])
    return BenchConfig(
        models=args.models or (["resnet18"] if quick else ["resnet18", "vgg16", "gpt"]),
        methods=args.methods or list(QUICK_METHODS if quick else DEFAULT_METHODS),
        links=[parse_link(b, args.delay_ms) for b in (args.bandwidths or (["100mbit"] if quick else DEFAULT_BANDWIDTHS))],
        world_size=args.workers,
        warmup=args.warmup if args.warmup is not None else (1 if quick else 3),
        steps=args.steps if args.steps is not None else (3 if quick else 10),
        batch_sizes=sizes, threads=args.threads,
        probe_seconds=args.probe_seconds if args.probe_seconds is not None else (1.0 if quick else 2.0),
        cell_timeout_s=args.cell_timeout, skip=args.skip, cycle_time_ms=args.cycle_time_ms or None,
        repeats=args.repeats,
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["tta"]:  # time to accuracy: its own arguments (python -m benchmarks tta --help)
        from benchmarks.tta import tta

        return tta.main(argv[1:])
    if argv[:1] == ["protocol"]:  # a preregistered time-to-accuracy protocol (benchmarks/protocol/run.py)
        from benchmarks.protocol import run

        return run.main(argv[1:])
    args = parse_args(argv)
    if args.report_only:
        results = json.loads(args.report_only.read_text())
        stamp = args.report_only.stem
    else:
        config = config_from_args(args)
        try:
            config.validate()
        except ValueError as error:
            raise SystemExit(f"error: {error}") from error
        stamp = time.strftime("%Y%m%d-%H%M%S")
        results = run_benchmark(config)
    paths = write_outputs(results, args.out, stamp)
    print(results_table(results))
    print()
    print(targets_table(evaluate_targets(results)))
    print()
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    return 1 if any("error" in cell and cell["error"] != SKIPPED for cell in results["cells"]) else 0


if __name__ == "__main__":
    sys.exit(main())
