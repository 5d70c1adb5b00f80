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

Whether a higher metric is better comes from ``higher_is_better`` where the file gives it, else from the metric's
name (``metric_direction``); a name that tells neither is refused rather than guessed.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

from pactrain_hvd.planner.methods import parse_method

# Words of a metric's name that say which way is better; the short ones count only as whole words.
LOWER_IS_BETTER = ("loss", "perplexity", "ppl", "error", "err", "mse", "mae", "rmse", "wer", "cer", "nll")
HIGHER_IS_BETTER = ("accuracy", "acc", "f1", "bleu", "auc", "iou", "miou", "map", "precision", "recall", "rouge")
_LONG_WORDS = 5  # words at least this long also count inside longer names ("valloss" no, "val_accuracy" yes)


def metric_direction(metric: str) -> bool | None:
    """Whether a higher ``metric`` is better, from its name: ``val_loss`` False, ``top1_accuracy`` True; None where
    the name names neither kind, or both."""
    name = metric.lower()
    words = set(re.split(r"[^a-z0-9]+", name))

    def says(vocabulary: tuple[str, ...]) -> bool:
        return any(word in words or (len(word) >= _LONG_WORDS and word in name) for word in vocabulary)

    lower, higher = says(LOWER_IS_BETTER), says(HIGHER_IS_BETTER)
    return None if lower == higher else higher


@dataclass(frozen=True)
class Curve:
    """One method's accuracy curve.

    Attributes:
        method: the method's name as the file gives it.
        points: (optimizer step, metric) pairs in step order.
        metric: name of the held-out metric.
        higher_is_better: whether a higher metric is better.
        workers: workers the curve was measured on (None: not given).
        complete: False where the run stopped before its planned steps (a wall-clock budget).
    """

    method: str
    points: tuple[tuple[int, float], ...]
    metric: str = "metric"
    higher_is_better: bool = True
    workers: int | None = None
    complete: bool = True

    def reaches(self, value: float, target: float) -> bool:
        """Whether a metric of ``value`` meets ``target`` (in the curve's direction)."""
        return value >= target if self.higher_is_better else value <= target

    def steps_to(self, target: float) -> int | None:
        """The first evaluated step whose metric meets ``target`` (None: the curve never does)."""
        return next((step for step, value in self.points if self.reaches(value, target)), None)

    @property
    def final(self) -> float:
        """The metric at the curve's last step."""
        return self.points[-1][1]


@dataclass(frozen=True)
class Curves:
    """The curves of one file, by planner method name.

    Attributes:
        by_method: each method's curve, keyed by ``parse_method(...).name``.
        target: the metric to reach, where the file sets one (else None).
        source: where the curves come from (the file, and the record's cell).
        metric: name of the held-out metric.
        higher_is_better: whether a higher metric is better.
        workers: workers the curves were measured on, where the file says (else None).
    """

    by_method: dict[str, Curve]
    target: float | None
    source: str
    metric: str = "metric"
    higher_is_better: bool = True
    workers: int | None = None

    def best_final(self, methods: list[str] | None = None) -> tuple[str, float]:
        """(method, final metric) of the curve that ends best, among ``methods`` where given."""
        chosen = [(name, c) for name, c in self.by_method.items() if methods is None or name in methods] or list(
            self.by_method.items())
        name, best = (max if self.higher_is_better else min)(chosen, key=lambda item: item[1].final)
        return name, best.final

    def default_target(self) -> float:
        """The file's target, else the worst final metric of its complete curves: every one reaches it (a run a
        budget stopped early does not set it)."""
        if self.target is not None:
            return self.target
        finals = [c.final for c in self.by_method.values() if c.complete] or [
            c.final for c in self.by_method.values()]
        return min(finals) if self.higher_is_better else max(finals)


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
    """Read a curve file in either format above.

    Args:
        path: the JSON file (the planner's format or a benchmark record).
        cell: the record's cell to read; needed only where a record holds several (ignored in the planner's format).

    Returns:
        The file's curves, keyed by planner method name (runs of methods the planner does not model are skipped).

    Raises:
        ValueError: the file is missing, malformed or ambiguous; the message names ``--curve`` / ``--cell``.
    """
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
    if "curves" in document:
        return _planner_curves(document, str(path))
    found: dict[str, Curve] = {}
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
        metric = str(run.get("metric", "metric"))
        higher = _direction(run.get("higher_is_better"), metric, str(path))
        points = _points([(row[1], row[2]) for row in run["curve"]], name, str(path))
        complete = run.get("steps", 0) >= chosen.get("steps", run.get("steps", 0))
        _add(found, name, Curve(name, points, metric, higher, chosen.get("workers"), complete))
    if not found:
        raise ValueError(f"--curve {path}: cell {cell!r} has no run of a method the planner models")
    first = next(iter(found.values()))
    return Curves(found, None, f"{path} ({cell})", first.metric, first.higher_is_better, chosen.get("workers"))


def _direction(given: object, metric: str, source: str) -> bool:
    """``higher_is_better`` as the file gives it, else as the metric's name says; refused where neither tells."""
    if given is not None:
        if not isinstance(given, bool):
            raise ValueError(f"--curve {source}: 'higher_is_better' must be true or false, got {given!r}")
        return given
    higher = metric_direction(metric)
    if higher is None:
        raise ValueError(f"--curve {source}: cannot tell from the metric's name {metric!r} whether higher is better: "
                         "add \"higher_is_better\": true or false to the file")
    return higher


def _planner_curves(document: dict, source: str) -> Curves:
    """The planner's own format (module docstring), each field checked."""
    curves = document["curves"]
    if not isinstance(curves, dict) or not curves:
        raise ValueError(f"--curve {source}: 'curves' must be a non-empty object of method name -> [[step, metric], "
                         f"...], got {_kind(curves)}")
    metric = document.get("metric", "metric")
    if not isinstance(metric, str):
        raise ValueError(f"--curve {source}: 'metric' must be a name, got {metric!r}")
    target = document.get("target")
    if target is not None and (isinstance(target, bool) or not isinstance(target, (int, float))
                               or not math.isfinite(target)):
        raise ValueError(f"--curve {source}: 'target' must be a number, got {target!r}")
    workers = document.get("workers")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ValueError(f"--curve {source}: 'workers' must be a whole number >= 1, got {workers!r}")
    points = {}
    for name, rows in curves.items():
        try:
            parse_method(name)
        except ValueError as error:
            raise ValueError(f"--curve {source}: curve {name!r}: {error}") from None
        points[name] = _points(rows, name, source)
    higher = _direction(document.get("higher_is_better"), metric, source)
    found: dict[str, Curve] = {}
    for name, pairs in points.items():
        _add(found, name, Curve(name, pairs, metric, higher, workers))
    return Curves(found, None if target is None else float(target), source, metric, higher, workers)


def _kind(value: object) -> str:
    return {list: "a list", str: "a string", dict: "an empty object"}.get(type(value), type(value).__name__)
