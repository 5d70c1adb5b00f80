"""``pactrain-plan`` / ``python -m pactrain_hvd.planner``: should I use PacTrain on my cluster?

    pactrain-plan --model mypackage.models:make_model --workers 16 --link 10gbit --step-time 0.25
    pactrain-plan --model my_model.py:Net --input-shape 3,224,224 --batch-size 32 --profile \\
        --workers 4 --link 1gbit --latency-ms 5 --curve my_curves.json

Prints, per method: bytes a worker hands the collectives per step, bytes it sends over the ring, the
predicted step time, the scaling efficiency (the step without communication over the predicted step), and
with ``--curve`` the steps to the target and the time to it; then the method it would pick, with the
reason, and what it assumed. No Horovod, no workers, no GPU: the model is built on torch's meta device.

Methods (--methods, comma-separated): dense, fp16, topk[-DENSITY] (default 0.01), powersgd[-rRANK]
(default rank 4), pactrain-SPARSITY[-fp16|-bf16|-ternary|-int3][-syncH] (PacTrain's packed values; fp32 without a
suffix; -syncH: local steps, a sync every H steps), diloco-hH-fp16|fp32 (local steps, nothing pruned), e.g.
topk-0.001,powersgd-r8,pactrain-0.95-ternary,pactrain-0.9-int3-sync25.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from pactrain_hvd import __version__
from pactrain_hvd.planner.coordination import MEASURED, Coordination
from pactrain_hvd.planner.curves import load_curves
from pactrain_hvd.planner.inputs import (
    DEFAULT_LATENCY_MS,
    compress_times,
    link_bits_per_s,
    parameter_count,
    prunable_patterns,
    shape_argument,
)
from pactrain_hvd.planner.methods import DEFAULT_METHODS, parse_method
from pactrain_hvd.planner.models import build_model, model_tensors, sparse_gradient_names
from pactrain_hvd.planner.payload import pactrain_parts, prunable_names
from pactrain_hvd.planner.recommend import format_table, recommend, rows, size
from pactrain_hvd.planner.step_model import HorovodConfig, Link
from pactrain_hvd.planner.step_time import Costs, predict


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pactrain-plan", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    p.add_argument("--model", required=True, help="MODULE:CALLABLE, FILE.py:CALLABLE (called without arguments), or a "
                                                  "torchvision/timm model name")
    p.add_argument("--workers", type=int, required=True, help="number of workers (one GPU each)")
    p.add_argument("--link", required=True, help="each worker's link rate each way: bits (10gbit, 100mbit, 1.5Gbps, "
                                                 "100Mb/s) or bytes (1GB/s, 10GBps, 100MB/s); b is a bit, B a byte")
    p.add_argument("--latency-ms", type=float, default=DEFAULT_LATENCY_MS,
                   help=f"one-way latency per message hop, ms (default {DEFAULT_LATENCY_MS:g}: a LAN; between sites "
                        "give the one-way latency, typically 10-50 ms)")
    compute = p.add_mutually_exclusive_group(required=True)
    compute.add_argument("--step-time", type=float, help="measured forward + backward seconds of one worker's step")
    compute.add_argument("--profile", action="store_true", help="measure compute and compression here (needs --input-shape)")
    p.add_argument("--update-time", type=float, default=0.0, help="seconds of the optimizer's update (default 0)")
    p.add_argument("--compress-time", action="append", default=[], metavar="KIND=SECONDS",
                   help="compression + decompression seconds per step of fp16, topk, powersgd or pactrain (default 0)")
    p.add_argument("--input-shape", type=shape_argument, help="one sample's input shape for --profile, e.g. 3,224,224")
    p.add_argument("--batch-size", type=int, default=32, help="per-worker batch for --profile (default 32)")
    p.add_argument("--token-inputs", type=int, default=None, metavar="VOCABULARY",
                   help="--profile: feed random integer token ids in [0, VOCABULARY) of --input-shape (a language "
                        "model), instead of normal floats")
    p.add_argument("--methods", default=",".join(DEFAULT_METHODS),
                   help="comma-separated methods to compare (names above; default: " + ",".join(DEFAULT_METHODS) + ")")
    p.add_argument("--prunable", metavar="GLOB[,GLOB...]",
                   help="parameter names PacTrain prunes, as the library's prunable= glob patterns (default: every "
                        "tensor of >= 2 dimensions); e.g. 'encoder.*' keeps the embeddings dense")
    p.add_argument("--per-tensor", action="store_true",
                   help="also print each tensor: shape, elements, pruned or dense, and its bytes a step under the "
                        "first PacTrain method of --methods")
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
    p.add_argument("--json", help="also write the table, the inputs and each row's step split to this JSON file")
    return p


def _check(args: argparse.Namespace) -> None:
    """Every argument's range, before anything is built or printed."""
    if args.workers < 1:
        raise ValueError(f"--workers must be >= 1, got {args.workers}")
    for name, value, low, strict in (("--latency-ms", args.latency_ms, 0, False), ("--step-time", args.step_time, 0, True),
                                     ("--update-time", args.update_time, 0, False), ("--cycle-ms", args.cycle_ms, 0, False),
                                     ("--cycle-bytes", args.cycle_bytes, 0, False),
                                     ("--overhead-bytes", args.overhead_bytes, 0, False),
                                     ("--target", args.target, -math.inf, False)):
        if value is None:
            continue
        if not math.isfinite(value) or value < low or (strict and value == low):
            bound = "" if low == -math.inf else f" {'>' if strict else '>='} {low:g}"
            raise ValueError(f"{name} must be a finite number{bound}, got {value:g}")
    if args.profile and args.input_shape is None:
        raise ValueError("--profile needs --input-shape (one sample's shape, e.g. 3,224,224)")
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.token_inputs is not None and args.token_inputs < 1:
        raise ValueError(f"--token-inputs must be a vocabulary size >= 1, got {args.token_inputs}")
    if args.json:
        folder = Path(args.json).parent
        if Path(args.json).is_dir():
            raise ValueError(f"--json {args.json}: is a folder; name the file to write, e.g. {Path(args.json) / 'plan.json'}")
        if not folder.is_dir():
            raise ValueError(f"--json {args.json}: no such folder {folder}")


def _profile_notes(measured: dict, methods: list) -> list[str]:
    """What ``--profile`` did not measure, for the Assumed lines."""
    names = {kind: [m.name for m in methods if m.kind == kind] for kind in ("topk", "powersgd", "pactrain")}
    notes = []
    if names["pactrain"]:
        notes.append("PacTrain's compression timed once, a gather and scatter of the survivors at 0.9 sparsity with fp32 "
                     "values (no quantization), and charged to every PacTrain row (" + ", ".join(names["pactrain"]) + ")")
    if names["topk"]:
        notes.append("Top-k's compression timed at 1 % and charged to every Top-k row (" + ", ".join(names["topk"]) + ")")
    if names["powersgd"]:
        notes.append("PowerSGD's compression timed at rank 4 and charged to every PowerSGD row ("
                     + ", ".join(names["powersgd"]) + ")")
    if measured["device"] == "cpu":
        notes.append("compute and compression measured on this machine's CPU and not scaled to an accelerator: for a "
                     "GPU cluster, time a step there and pass --step-time and --compress-time")
    return notes


def _sparse_warning(names: list[str]) -> str:
    return (f"{', '.join(names)}: sparse gradients (nn.Embedding / nn.EmbeddingBag with sparse=True), modelled here as "
            "dense tensors in every row; Horovod allgathers only the rows a step touches, with their indices, unless "
            "sparse_as_dense=True, so the dense, fp16, Top-k and PowerSGD rows can overstate their bytes many times; "
            "PacTrain sends a pruned sparse gradient dense, as modelled, and an unpruned one (see --prunable) as "
            "Horovod does")


def _per_tensor(methods: list, tensors: list, args: argparse.Namespace, patterns: list[str] | None) -> dict | None:
    if not args.per_tensor:
        return None
    method = next((m for m in methods if m.kind == "pactrain"), None)
    if method is None:
        raise ValueError("--per-tensor breaks down a PacTrain method: --methods has none (e.g. add pactrain-0.9-fp16)")
    parts = pactrain_parts(method, tensors, args.workers, args.ranking, patterns)
    return {"method": method.name, "tensors": [
        {"name": part.tensor.name, "shape": list(part.tensor.shape), "numel": part.tensor.numel,
         "pruned": part.kept is not None, "kept": part.kept, "packed": part.packed, "bytes": part.nbytes}
        for part in parts]}


def format_per_tensor(breakdown: dict) -> str:
    lines = [f"Per tensor, {breakdown['method']}:", "", "| tensor | shape | elements | PacTrain | bytes a step |",
             "|---|---|---:|---|---:|"]
    for t in breakdown["tensors"]:
        state = ("dense" if not t["pruned"] else
                 f"pruned, {t['kept']:,} kept, " + ("packed" if t["packed"] else "sent whole"))
        lines.append(f"| {t['name']} | {'x'.join(map(str, t['shape'])) or '-'} | {t['numel']:,} | {state} | "
                     f"{size(t['bytes'])} |")
    return "\n".join(lines)


def run(argv: list[str] | None = None) -> dict:
    args = parser().parse_args(argv)
    _check(args)
    started = time.perf_counter()
    bits_per_s = link_bits_per_s(args.link)
    link = Link(bits_per_s / 8, args.latency_ms / 1e3)
    methods = [parse_method(name.strip()) for name in args.methods.split(",") if name.strip()]
    if not methods:
        raise ValueError("--methods is empty")
    costs = None if args.profile else Costs(compute_s=args.step_time, update_s=args.update_time,
                                            compress_s=compress_times(args.compress_time))
    patterns = prunable_patterns(args.prunable)
    model = build_model(args.model, "cpu" if args.profile else "meta")
    tensors = model_tensors(model)
    pruned = prunable_names(tensors, patterns)
    if patterns is not None and not pruned:
        raise ValueError(f"--prunable {args.prunable!r} matches no trainable tensor (their names look like "
                         f"{', '.join(t.name for t in tensors[:3])})")
    latency = (" (the default: a LAN's; between sites pass the one-way latency, typically 10-50 ms)"
               if args.latency_ms == DEFAULT_LATENCY_MS else "")
    assumed = [f"model {args.model}: {len(tensors)} trainable tensors, {parameter_count(sum(t.numel for t in tensors))}",
               f"link {args.link} = {bits_per_s / 1e9:.4g} Gbit/s = {bits_per_s / 8e9:.4g} GB/s each way per worker (the "
               f"goodput, not the nominal rate), {args.latency_ms:g} ms one way per message hop{latency}, ring collectives",
               f"Horovod cycle {args.cycle_ms:g} ms (HOROVOD_CYCLE_TIME), fusion buffer 128 MB; traffic beyond the "
               f"gradients {args.cycle_bytes:,.0f} B each cycle the loop is idle plus {args.overhead_bytes:,.0f} B a step",
               "gradients become ready in reverse parameter order, at a pace proportional to their size"]
    if any(m.kind == "pactrain" for m in methods):
        count = sum(t.numel for t in tensors if t.name in set(pruned))
        assumed.append(f"PacTrain prunes {len(pruned)} of {len(tensors)} tensors ({parameter_count(count)}): "
                       + (f"those --prunable {args.prunable} matches" if patterns is not None else
                          "those of >= 2 dimensions, the library's default (--prunable to choose)"))
    if args.profile:
        from pactrain_hvd.planner.profile import load_note, measure

        costs, measured = measure(model, args.input_shape, args.batch_size, integer_inputs=args.token_inputs)
        assumed.append(f"measured here ({measured['device']}, batch {args.batch_size}{load_note(measured)}): forward + backward "
                       f"{costs.compute_s * 1e3:.1f} ms, update {costs.update_s * 1e3:.1f} ms, compression "
                       + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in costs.compress_s.items() if k != "dense"))
        assumed += _profile_notes(measured, methods)
    else:
        assumed.append(f"compute {args.step_time * 1e3:g} ms a step (given), update {args.update_time * 1e3:g} ms, "
                       "compression " + (", ".join(f"{k} {v * 1e3:g} ms" for k, v in costs.compress_s.items()) or
                                         "free (--compress-time or --profile to count it)"))
    config = HorovodConfig(cycle_time_s=args.cycle_ms / 1e3)
    coordination = Coordination(args.cycle_bytes, args.overhead_bytes)
    predictions = [predict(m, tensors, args.workers, link, costs, config, coordination, args.ranking, patterns)
                   for m in methods]
    curves = load_curves(args.curve, args.cell) if args.curve else None
    target = args.target if args.target is not None else (curves.default_target() if curves else None)
    if curves:
        assumed.append(f"accuracy curves from {curves.source}: {curves.metric}, "
                       f"{'higher' if curves.higher_is_better else 'lower'} is better"
                       + (f", measured on {curves.workers} workers" if curves.workers else "")
                       + f", target {target:g}; Top-k and ternary curves hold for the number of workers they were "
                         "measured on, the others for any (fixed global batch)")
    sparse = sparse_gradient_names(model)
    warnings = [_sparse_warning(sparse)] if sparse else []
    table = rows(predictions, curves, target, args.workers)
    choice, reason = recommend(table, curves, target, args.workers)
    return {"table": table, "choice": choice, "reason": reason, "assumed": assumed, "has_curve": curves is not None,
            "seconds": time.perf_counter() - started, "target": target, "warnings": warnings, "curves": curves,
            "per_tensor": _per_tensor(methods, tensors, args, patterns),
            "inputs": {**vars(args), "link_bits_per_s": bits_per_s}}


def to_json(result: dict) -> dict:
    """``run``'s result as the ``--json`` file holds it."""
    curves = result["curves"]
    out = {"choice": result["choice"], "reason": result["reason"], "assumed": result["assumed"],
           "warnings": result["warnings"], "target": result["target"], "inputs": result["inputs"], "rows": []}
    if curves is not None:
        out["curve"] = {"source": curves.source, "metric": curves.metric, "higher_is_better": curves.higher_is_better,
                        "workers": curves.workers}
    for r in result["table"]:
        p = r.prediction
        curve = curves.by_method.get(p.method.name) if curves else None
        row = {"method": p.method.name, "handed_bytes": p.handed_bytes, "sent_bytes": p.sent_bytes, "step_s": p.step_s,
               "compute_s": p.compute_s, "compress_s": p.compress_s, "wait_s": p.wait_s,
               "coordination_bytes": p.coordination_bytes, "efficiency": p.efficiency,
               "steps_to_target": r.steps_to_target, "time_to_target_s": r.time_to_target_s}
        if curves is not None:
            row["curve_workers"] = curve.workers if curve is not None else None
        out["rows"].append(row)
    if result["per_tensor"] is not None:
        out["per_tensor"] = result["per_tensor"]
    return out


def main(argv: list[str] | None = None) -> int:
    try:
        result = run(argv)
    except ValueError as error:
        print(f"pactrain-plan: error: {error}", file=sys.stderr)
        return 2
    print(format_table(result["table"], result["has_curve"]))
    for warning in result["warnings"]:
        print(f"\nWarning: {warning}.")
    if result["per_tensor"] is not None:
        print("\n" + format_per_tensor(result["per_tensor"]))
    print(f"\nRecommendation: {result['choice'] or 'none'}: {result['reason']}.")
    print("\nAssumed:\n" + "\n".join(f"- {line}" for line in result["assumed"]))
    json_path = result["inputs"]["json"]
    if json_path:
        with open(json_path, "w") as out:
            json.dump(to_json(result), out, indent=1)
    return 0
