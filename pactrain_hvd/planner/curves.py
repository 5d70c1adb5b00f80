"""Accuracy curves: steps to a target, per method. Time to accuracy = steps to target x step time.

A curve is a method's held-out metric at some optimizer steps of a run with a fixed global batch. Where the
method reduces a linear function of the summed gradient (dense, fp16, PacTrain with fp32/fp16/bf16 values;
PowerSGD approximately), the steps a curve needs do not depend on how many workers share that global batch,
so a short run on a few workers (or one) predicts the cluster's. Top-k and ternary values keep per-worker
state, so their curves hold only for the number of workers they were measured on
(``Method.curve_portable``; the planner marks such times with the curve's worker count).

Two file formats are read:

- the planner's own (``--curve``)::

      {"metric": "test_accuracy", "higher_is_better": true, "workers": 2, "target": 0.89,
       "curves": {"fp16": [[40, 0.61], [80, 0.72]], "pactrain-0.9-fp16": [[40, 0.58], [80, 0.70]]}}

  pairs of (optimizer step, metric); ``higher_is_better``, ``workers`` and ``target`` are optional;
- a time-to-accuracy record of the repository's benchmark (``bench/results/tta/**/record.json``; pick its
  cell with ``cell`` if it has several): each run's ``curve`` rows are (training seconds, step, metric, bytes).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pactrain_hvd.planner.methods import parse_method


@dataclass(frozen=True)
class Curve:
    """``points``: (step, metric) in step order."""

    method: str
    points: tuple[tuple[int, float], ...]
    metric: str = "metric"
    higher_is_better: bool = True
    workers: int | None = None
    complete: bool = True  # False: a run stopped before its planned steps (a wall-clock budget)

    def reaches(self, value: float, target: float) -> bool:
        return value >= target if self.higher_is_better else value <= target

    def steps_to(self, target: float) -> int | None:
        """The first evaluated step whose metric meets ``target`` (None: the curve never does)."""
        return next((step for step, value in self.points if self.reaches(value, target)), None)

    @property
    def final(self) -> float:
        return self.points[-1][1]


@dataclass(frozen=True)
class Curves:
    """Curves by planner method name (``parse_method(...).name``), and the target, if the file sets one."""

    by_method: dict[str, Curve]
    target: float | None
    source: str

    def default_target(self) -> float:
        """The file's target, else the worst final metric of its complete curves: every one reaches it (a run a
        budget stopped early does not set it)."""
        if self.target is not None:
            return self.target
        finals = [c.final for c in self.by_method.values() if c.complete] or [
            c.final for c in self.by_method.values()]
        higher = next(iter(self.by_method.values())).higher_is_better
        return min(finals) if higher else max(finals)


def _points(rows: list, name: str, source: str) -> tuple[tuple[int, float], ...]:
    try:
        points = tuple(sorted((int(step), float(value)) for step, value in rows))
    except (TypeError, ValueError) as error:
        raise ValueError(f"--curve {source}: curve {name!r} must be a list of [step, metric] pairs ({error})") from None
    if not points:
        raise ValueError(f"--curve {source}: curve {name!r} is empty")
    return points


def _add(found: dict[str, Curve], name: str, curve: Curve) -> None:
    """Keep the first curve of each planner name (a record may hold the same method with several windows)."""
    found.setdefault(parse_method(name).name, curve)


def load_curves(path: str | Path, cell: str | None = None) -> Curves:
    """Read a curve file (either format above); errors name ``--curve`` / ``--cell`` and say what is wrong."""
    path = Path(path)
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"--curve {path}: no such file") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"--curve {path}: not JSON ({error})") from None
    if not isinstance(document, dict) or not ("curves" in document or "cells" in document):
        raise ValueError(f"--curve {path}: expected a 'curves' object (the planner's format) or a benchmark "
                         "record with 'cells'")
    found: dict[str, Curve] = {}
    if "curves" in document:
        metric = str(document.get("metric", "metric"))
        higher = bool(document.get("higher_is_better", metric != "val_perplexity"))
        for name, rows in document["curves"].items():
            _add(found, name, Curve(name, _points(rows, name, str(path)), metric, higher, document.get("workers")))
        return Curves(found, document.get("target"), str(path))
    cells = document["cells"]
    if cell is None:
        if len(cells) != 1:
            raise ValueError(f"--cell: {path} holds {len(cells)} cells, name one of: {', '.join(cells)}")
        cell = next(iter(cells))
    if cell not in cells:
        raise ValueError(f"--cell {cell!r} is not in {path}: it holds {', '.join(cells)}")
    chosen = cells[cell]
    for name, run in chosen["runs"].items():
        try:
            parse_method(name)
        except ValueError:
            continue  # a method the planner does not model (DDP's hooks)
        metric = run.get("metric", "metric")
        points = _points([(row[1], row[2]) for row in run["curve"]], name, str(path))
        complete = run.get("steps", 0) >= chosen.get("steps", run.get("steps", 0))
        _add(found, name, Curve(name, points, metric, metric != "val_perplexity", chosen.get("workers"), complete))
    if not found:
        raise ValueError(f"--curve {path}: cell {cell!r} has no run of a method the planner models")
    return Curves(found, None, f"{path} ({cell})")
