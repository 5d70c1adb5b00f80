"""Which method to use: time to target where curves exist, else the step time with accuracy's caveat."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pactrain_hvd.planner.curves import Curves
from pactrain_hvd.planner.step_time import Prediction

# Below this share of the step spent waiting for the network, compression buys at most that share of the
# step and costs accuracy per step: keep the dense reduction.
COMPUTE_BOUND_EFFICIENCY = 0.9
# Without curves, methods whose steps are within this much of the shortest tie on speed; the least compressed
# of them (the most bytes a step) is picked, as accuracy per step tends to fall with compression.
STEP_TIE = 0.05


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


def recommend(table: Sequence[Row]) -> tuple[str, str]:
    """(method name, one-line reason)."""
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
    by_name = {r.prediction.method.name: r.prediction for r in table}
    for reference in ("dense", "fp16"):
        if reference in by_name and by_name[reference].efficiency >= COMPUTE_BOUND_EFFICIENCY:
            p = by_name[reference]
            return reference, (f"compute-bound: {reference} already runs at {p.efficiency:.0%} scaling efficiency, so "
                               "compression could save at most the rest and costs accuracy per step")
    shortest = min(r.prediction.step_s for r in table)
    tied = [r.prediction for r in table if r.prediction.step_s <= shortest * (1 + STEP_TIE)]
    pick = max(tied, key=lambda p: p.handed_bytes)
    why = "the shortest predicted step" if len(tied) == 1 else (
        f"the least compressed of the {len(tied)} methods within {STEP_TIE:.0%} of the shortest step")
    return pick.method.name, (f"{why} ({pick.step_s * 1e3:.0f} ms, {pick.efficiency:.0%} scaling efficiency); "
                              "without an accuracy curve (--curve) the steps each method needs are unknown")


def format_table(table: Sequence[Row], has_curve: bool) -> str:
    head = "| method | bytes a step | sent per worker | step ms | scaling efficiency |"
    rule = "|---|---:|---:|---:|---:|"
    if has_curve:
        head += " steps to target | time to target |"
        rule += "---:|---:|"
    lines = [head, rule]
    for row in table:
        p = row.prediction
        line = (f"| {p.method.name} | {_size(p.handed_bytes)} | {_size(p.sent_bytes)} | {p.step_s * 1e3:,.1f} | "
                f"{p.efficiency:.0%} |")
        if has_curve:
            if row.steps_to_target is None:
                line += " - | - |"
            else:
                pinned = f" (curve of {row.curve_workers} workers)" if row.curve_workers else ""
                line += f" {row.steps_to_target} | {row.time_to_target_s:,.0f} s{pinned} |"
        lines.append(line)
    return "\n".join(lines)


def _size(nbytes: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes:.0f} B"
