"""Which method to use: time to target where curves exist, else the step time with accuracy's caveat.

The rules, in order (docs/planner.md, "How it picks"):

1. every method below ``MIN_EFFICIENCY`` scaling efficiency: none pays;
2. with curves that reach the target: the shortest time to it;
3. dense or fp16 at ``COMPUTE_BOUND_EFFICIENCY`` or more: that one (compute-bound);
4. the shortest predicted step; methods within ``STEP_TIE`` of it tie, and of those the one that changes the
   model least (``model_change``) is picked, as accuracy was not compared.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pactrain_hvd.planner.curves import Curves
from pactrain_hvd.planner.methods import Method
from pactrain_hvd.planner.step_time import Prediction

# Below this share of the step spent waiting for the network, compression buys at most that share of the
# step and costs accuracy per step: keep the dense reduction.
COMPUTE_BOUND_EFFICIENCY = 0.9
# Without curves, methods whose steps are within this much of the shortest tie on speed; the one of them that
# changes the model least is picked, as accuracy per step tends to fall with compression.
STEP_TIE = 0.05
# Where every method's scaling efficiency is below this, the workers spend most of each step waiting for the
# network whatever the method: none is recommended.
MIN_EFFICIENCY = 0.25
# PacTrain's values, the coarser the later
VALUE_ORDER = {"fp32": 0, "fp16": 1, "bf16": 1, "int3": 2, "ternary": 3}


@dataclass(frozen=True)
class Row:
    prediction: Prediction
    steps_to_target: int | None = None
    curve_workers: int | None = None  # where the curve holds only for this many workers (Top-k, ternary)

    @property
    def time_to_target_s(self) -> float | None:
        return None if self.steps_to_target is None else self.steps_to_target * self.prediction.step_s


def rows(predictions: Sequence[Prediction], curves: Curves | None, target: float | None, workers: int) -> list[Row]:
    out = []
    for prediction in predictions:
        curve = curves.by_method.get(prediction.method.name) if curves else None
        steps = curve.steps_to(target) if curve is not None and target is not None else None
        pinned = None
        if curve is not None and not prediction.method.curve_portable and curve.workers not in (None, workers):
            pinned = curve.workers
        out.append(Row(prediction, steps, pinned))
    return out


def model_change(prediction: Prediction) -> tuple:
    """Sort key, least change to what is trained first: dense, fp16, then the compressors that keep the model whole
    (Top-k, PowerSGD: the more bytes a step, the earlier), then PacTrain, which prunes it (lower sparsity first,
    then fp32, fp16 or bf16, int3, ternary values), then local steps (the longer the interval, the later)."""
    method: Method = prediction.method
    if method.sync_every > 1:  # local steps change each step's update, not only what travels
        return (4, method.sparsity, VALUE_ORDER[method.values], method.sync_every)
    if method.kind in ("dense", "fp16"):
        return (0 if method.kind == "dense" else 1,)
    if method.kind in ("topk", "powersgd"):
        return (2, -prediction.handed_bytes)
    return (3, method.sparsity, VALUE_ORDER[method.values])


def recommend(table: Sequence[Row], curves: Curves | None = None, target: float | None = None,
              workers: int | None = None) -> tuple[str | None, str]:
    """(method name, one-line reason); (None, reason) where no method makes the cluster pay."""
    best_efficiency = max((r.prediction for r in table), key=lambda p: p.efficiency)
    if best_efficiency.efficiency < MIN_EFFICIENCY:
        throughput = (f", so {workers} workers do {workers * best_efficiency.efficiency:.2g}x one worker's work a step"
                      if workers else "")
        return None, (f"no method makes this cluster pay: the best, {best_efficiency.method.name}, runs at "
                      f"{best_efficiency.efficiency:.0%} scaling efficiency (every method is below "
                      f"{MIN_EFFICIENCY:.0%}){throughput}; a faster link, more compute a step (a larger batch per "
                      "worker) or fewer workers would change that")
    timed = sorted((r for r in table if r.time_to_target_s is not None), key=lambda r: r.time_to_target_s)
    if timed:
        best = timed[0]
        reason = (f"reaches the target in {best.steps_to_target} steps x {best.prediction.step_s * 1e3:.0f} ms = "
                  f"{best.time_to_target_s:,.0f} s")
        if len(timed) > 1:
            runner = timed[1]
            reason += (f", {runner.time_to_target_s / best.time_to_target_s:.2f}x sooner than "
                       f"{runner.prediction.method.name} ({runner.time_to_target_s:,.0f} s)")
        if best.curve_workers:
            reason += f" (its curve was measured on {best.curve_workers} workers)"
        return best.prediction.method.name, reason
    if curves is not None and target is not None:
        method, final = curves.best_final([r.prediction.method.name for r in table])
        caveat = (f"no method reaches the target {target:g} in its curve (the best final {curves.metric} is "
                  f"{final:g}, {method}), so accuracy was not compared: a --target the curves reach compares the "
                  "time to it")
    else:
        caveat = ("accuracy was not compared: without an accuracy curve (--curve) the steps each method needs are "
                  "unknown, and a curve decides")
    by_name = {r.prediction.method.name: r.prediction for r in table}
    for reference in ("dense", "fp16"):
        if reference in by_name and by_name[reference].efficiency >= COMPUTE_BOUND_EFFICIENCY:
            p = by_name[reference]
            return reference, (f"compute-bound: {reference} already runs at {p.efficiency:.0%} scaling efficiency "
                               f"(from {COMPUTE_BOUND_EFFICIENCY:.0%}), so compression could save at most the rest "
                               f"and costs accuracy per step; {caveat}")
    shortest = min(r.prediction.step_s for r in table)
    tied = [r.prediction for r in table if r.prediction.step_s <= shortest * (1 + STEP_TIE)]
    pick = min(tied, key=model_change)
    why = "the shortest predicted step" if len(tied) == 1 else (
        f"of the {len(tied)} methods within {STEP_TIE:.0%} of the shortest step ({', '.join(p.method.name for p in tied)}), "
        "the one that changes the model least")
    if pick.method.sync_every > 1:
        caveat += ("; local steps cost accuracy per step (each worker's steps between syncs see its own batches "
                   "only), so measure their curve before choosing them")
    return pick.method.name, f"{why} ({pick.step_s * 1e3:.0f} ms, {pick.efficiency:.0%} scaling efficiency); {caveat}"


def format_table(table: Sequence[Row], has_curve: bool) -> str:
    head = "| method | bytes a step | sent per worker | step ms | scaling efficiency |"
    rule = "|---|---:|---:|---:|---:|"
    if has_curve:
        head += " steps to target | time to target |"
        rule += "---:|---:|"
    lines = [head, rule]
    for row in table:
        p = row.prediction
        line = (f"| {p.method.name} | {size(p.handed_bytes)} | {size(p.sent_bytes)} | {p.step_s * 1e3:,.1f} | "
                f"{p.efficiency:.0%} |")
        if has_curve:
            if row.steps_to_target is None:
                line += " - | - |"
            else:
                pinned = f" (curve of {row.curve_workers} workers)" if row.curve_workers else ""
                line += f" {row.steps_to_target} | {row.time_to_target_s:,.0f} s{pinned} |"
        lines.append(line)
    return "\n".join(lines)


def size(nbytes: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes:.0f} B"
