"""``pactrain-plan`` / ``python -m pactrain_hvd.planner``: should I use PacTrain on my cluster?

    pactrain-plan --model mypackage.models:make_model --workers 16 --link 10gbit --step-time 0.25
    pactrain-plan --model my_model.py:Net --input-shape 3,224,224 --batch-size 32 --profile \\
        --workers 4 --link 1gbit --latency-ms 5 --curve my_curves.json

Prints, per method: bytes a worker hands the collectives per step, bytes it sends over the ring, the
predicted step time, the scaling efficiency (the step without communication over the predicted step), and
with ``--curve`` the steps to the target and the time to it; then the method it would pick, with the
reason, and what it assumed. No Horovod, no workers, no GPU: the model is built on torch's meta device.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time

from pactrain_hvd.planner.coordination import MEASURED, Coordination
from pactrain_hvd.planner.curves import load_curves
from pactrain_hvd.planner.methods import DEFAULT_METHODS, parse_method
from pactrain_hvd.planner.models import build_model, model_tensors
from pactrain_hvd.planner.recommend import format_table, recommend, rows
from pactrain_hvd.planner.step_model import HorovodConfig, Link
from pactrain_hvd.planner.step_time import Costs, predict

UNITS = {"k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}


def parameter_count(count: int) -> str:
    return f"{count / 1e6:.2f} M parameters" if count >= 10_000 else f"{count:,} parameters"


def link_bits_per_s(text: str) -> float:
    """``"10gbit"``, ``"100mbit"``, ``"1.5Gbps"``, ``"100 Mbit/s"`` -> bits per second."""
    match = re.fullmatch(r"\s*(\d*\.?\d+)\s*([kmgt])\s*(?:bit|b|bps|bit/s)?(?:/s)?\s*", str(text).lower())
    if not match or float(match.group(1)) <= 0:
        raise ValueError(f"--link {text!r}: give a rate with its unit, e.g. 10gbit, 100mbit, 1.5gbps")
    return float(match.group(1)) * UNITS[match.group(2)]


def _shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(part) for part in text.replace("x", ",").split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of sizes, e.g. 3,224,224") from None
    if not shape or min(shape) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: sizes must be >= 1, e.g. 3,224,224")
    return shape


def _compress(items: list[str]) -> dict[str, float]:
    out = {}
    for item in items:
        kind, _, seconds = item.partition("=")
        if kind not in ("fp16", "topk", "powersgd", "pactrain") or not seconds:
            raise ValueError(f"--compress-time {item!r}: give KIND=SECONDS, KIND one of fp16, topk, powersgd, pactrain")
        out[kind] = float(seconds)
    return out


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pactrain-plan", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--model", required=True, help="MODULE:CALLABLE, FILE.py:CALLABLE, or a torchvision/timm model name")
    p.add_argument("--workers", type=int, required=True, help="number of workers (one GPU each)")
    p.add_argument("--link", required=True, help="each worker's link rate each way, e.g. 10gbit, 100mbit")
    p.add_argument("--latency-ms", type=float, default=0.01, help="latency per message hop (default 0.01 ms)")
    compute = p.add_mutually_exclusive_group(required=True)
    compute.add_argument("--step-time", type=float, help="measured forward + backward seconds of one worker's step")
    compute.add_argument("--profile", action="store_true", help="measure compute and compression here (needs --input-shape)")
    p.add_argument("--update-time", type=float, default=0.0, help="seconds of the optimizer's update (default 0)")
    p.add_argument("--compress-time", action="append", default=[], metavar="KIND=SECONDS",
                   help="compression + decompression seconds per step of fp16, topk, powersgd or pactrain (default 0)")
    p.add_argument("--input-shape", type=_shape, help="one sample's input shape for --profile, e.g. 3,224,224")
    p.add_argument("--batch-size", type=int, default=32, help="per-worker batch for --profile (default 32)")
    p.add_argument("--token-inputs", type=int, default=None, help="--profile: integer inputs below this (a vocabulary)")
    p.add_argument("--methods", default=",".join(DEFAULT_METHODS), help="comma-separated methods to compare")
    p.add_argument("--curve", help="accuracy curves: the planner's JSON, or a benchmark time-to-accuracy record")
    p.add_argument("--cell", help="the record's cell, where --curve holds several")
    p.add_argument("--target", type=float, help="the metric to reach (default: the curve file's, else every curve's worst final)")
    p.add_argument("--cycle-ms", type=float, default=1.0,
                   help="HOROVOD_CYCLE_TIME the workers run at (default: Horovod's own, 1 ms; raise it on slow links)")
    p.add_argument("--cycle-bytes", type=float, default=MEASURED.bytes_per_cycle,
                   help=f"Horovod's coordination bytes a worker sends each cycle (default {MEASURED.bytes_per_cycle:g}, "
                        "measured; 0: none)")
    p.add_argument("--overhead-bytes", type=float, default=MEASURED.bytes_per_step,
                   help=f"per-step traffic beyond the gradients and the cycles, per worker (default "
                        f"{MEASURED.bytes_per_step:g}, measured; docs/planner.md)")
    p.add_argument("--ranking", default="erk", choices=("erk", "layer"), help="PacTrain's mask ranking (default erk)")
    p.add_argument("--json", help="also write the table to this JSON file")
    return p


def _check(args: argparse.Namespace) -> None:
    if args.workers < 1:
        raise ValueError(f"--workers must be >= 1, got {args.workers}")
    if args.latency_ms < 0:
        raise ValueError(f"--latency-ms must be >= 0, got {args.latency_ms}")
    if args.step_time is not None and not args.step_time > 0:
        raise ValueError(f"--step-time must be > 0 seconds, got {args.step_time}")
    if args.update_time < 0 or args.cycle_ms < 0 or args.overhead_bytes < 0 or args.cycle_bytes < 0:
        raise ValueError("--update-time, --cycle-ms, --cycle-bytes and --overhead-bytes must be >= 0")
    if args.profile and args.input_shape is None:
        raise ValueError("--profile needs --input-shape (one sample's shape, e.g. 3,224,224)")
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {args.batch_size}")


def run(argv: list[str] | None = None) -> dict:
    args = parser().parse_args(argv)
    _check(args)
    started = time.perf_counter()
    link = Link(link_bits_per_s(args.link) / 8, args.latency_ms / 1e3)
    methods = [parse_method(name.strip()) for name in args.methods.split(",") if name.strip()]
    if not methods:
        raise ValueError("--methods is empty")
    model = build_model(args.model, "cpu" if args.profile else "meta")
    tensors = model_tensors(model)
    assumed = [f"model {args.model}: {len(tensors)} trainable tensors, {parameter_count(sum(t.numel for t in tensors))}",
               f"link {args.link} = {link.bytes_per_s * 8 / 1e9:g} Gbit/s each way per worker (the goodput, not the "
               f"nominal rate), {args.latency_ms:g} ms per message hop, ring collectives",
               f"Horovod cycle {args.cycle_ms:g} ms (HOROVOD_CYCLE_TIME), fusion buffer 128 MB; traffic beyond the "
               f"gradients {args.cycle_bytes:,.0f} B each cycle the loop is idle plus {args.overhead_bytes:,.0f} B a step",
               "gradients become ready in reverse parameter order, at a pace proportional to their size"]
    if args.profile:
        from pactrain_hvd.planner.profile import load_note, measure

        costs, measured = measure(model, args.input_shape, args.batch_size, integer_inputs=args.token_inputs)
        assumed.append(f"measured here ({measured['device']}, batch {args.batch_size}{load_note(measured)}): forward + backward "
                       f"{costs.compute_s * 1e3:.1f} ms, update {costs.update_s * 1e3:.1f} ms, compression "
                       + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in costs.compress_s.items() if k != "dense"))
    else:
        costs = Costs(compute_s=args.step_time, update_s=args.update_time, compress_s=_compress(args.compress_time))
        assumed.append(f"compute {args.step_time * 1e3:g} ms a step (given), update {args.update_time * 1e3:g} ms, "
                       "compression " + (", ".join(f"{k} {v * 1e3:g} ms" for k, v in costs.compress_s.items()) or
                                         "free (--compress-time or --profile to count it)"))
    config = HorovodConfig(cycle_time_s=args.cycle_ms / 1e3)
    coordination = Coordination(args.cycle_bytes, args.overhead_bytes)
    predictions = [predict(m, tensors, args.workers, link, costs, config, coordination, args.ranking)
                   for m in methods]
    curves = load_curves(args.curve, args.cell) if args.curve else None
    target = args.target if args.target is not None else (curves.default_target() if curves else None)
    if curves:
        assumed.append(f"accuracy curves from {curves.source}, target {target:g}; Top-k and ternary curves hold for "
                       "the number of workers they were measured on, the others for any (fixed global batch)")
    table = rows(predictions, curves, target, args.workers)
    choice, reason = recommend(table)
    return {"table": table, "choice": choice, "reason": reason, "assumed": assumed, "has_curve": curves is not None,
            "seconds": time.perf_counter() - started, "target": target}


def main(argv: list[str] | None = None) -> int:
    try:
        result = run(argv)
    except ValueError as error:
        print(f"pactrain-plan: error: {error}", file=sys.stderr)
        return 2
    print(format_table(result["table"], result["has_curve"]))
    print(f"\nRecommendation: {result['choice']}: {result['reason']}.")
    print("\nAssumed:\n" + "\n".join(f"- {line}" for line in result["assumed"]))
    args = parser().parse_args(argv)
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"choice": result["choice"], "reason": result["reason"], "assumed": result["assumed"],
                       "target": result["target"], "rows": [
                           {"method": r.prediction.method.name, "handed_bytes": r.prediction.handed_bytes,
                            "sent_bytes": r.prediction.sent_bytes, "step_s": r.prediction.step_s,
                            "efficiency": r.prediction.efficiency, "steps_to_target": r.steps_to_target,
                            "time_to_target_s": r.time_to_target_s} for r in result["table"]]}, out, indent=1)
    return 0
