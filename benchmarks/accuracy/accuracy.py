#!/usr/bin/env python3
"""Accuracy report: dense Horovod against PacTrain at several sparsities, same seeds and hyperparameters.

Each run is one example launched with ``horovodrun -np N --gloo`` (``--np``, default 2) that
writes its metrics with ``--result-json``; this script collects them into ``reports/accuracy/``:

- ``results.json``: the settings and every run's metrics (task, parameters, sparsity, seed,
  final metric, bytes over the run and per step once masks are final, wall time).
- ``results.md``: one table per task: the mean over seeds, each seed, the change against dense.
- ``accuracy.png``: metric against sparsity, a line per ranking / values.

The workloads are the ones PacTrain is for (``TASKS``): FashionVGG (4.3 M parameters, 3 epochs,
about 8 minutes a run at 2 workers on 2 cores) and a 5 M-parameter char-GPT (one epoch, about
15 minutes). The full report, 4 sparsities x 2 seeds x 2 tasks::

    .venv/bin/python -m benchmarks.accuracy.accuracy

A report grows in parts: runs already in ``--out``'s ``results.json`` are kept, not run again.
One change at a time against the default (``--rankings``, ``--values``, ``--windows``; the dense run happens once)::

    .venv/bin/python -m benchmarks.accuracy.accuracy --tasks image --sparsities 0 0.9 --rankings layer erk global

A tiny configuration proves the pipeline in a couple of minutes::

    .venv/bin/python -m benchmarks.accuracy.accuracy --sparsities 0 0.9 --seeds 1 --max-steps 20 --lm-max-steps 10 --out /tmp/accuracy
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pactrain_hvd.core.masks import DEFAULT_RANKING, RANKINGS
from pactrain_hvd.core.schedule import RUN_MASK_UPDATES, RUN_WINDOW

REPO_ROOT = Path(__file__).resolve().parents[2]
# The report's value labels say what travels (its runs leave compression off unless --fp16); the
# examples take the library's packed_values, where "inherit" (as compression says) is fp32 here.
PACKED_VALUES_FLAG = {"fp32": "inherit"}
# The product's pruning window for ``total_steps=``, as fractions of the run (``core.schedule.RUN_WINDOW``).
DEFAULT_WINDOW = "-".join(f"{f:g}" for f in RUN_WINDOW)
# The image task's learning-rate schedule (its model_args); the language example has its own warm-up + cosine.
DEFAULT_LR_SCHEDULE = "cosine"
# The dense run's setting (sparsity, values, ranking, window, updates, lr schedule, rescaled): ``grouped``'s key.
DENSE = (0.0, "fp32", "layer", DEFAULT_WINDOW, RUN_MASK_UPDATES, DEFAULT_LR_SCHEDULE, False)


@dataclass(frozen=True)
class Task:
    name: str
    script: str
    model_args: tuple[str, ...]  # the workload's size: the same in every run of the task
    metric: str  # key in the example's result JSON
    label: str
    higher_is_better: bool

    @property
    def takes_lr_schedule(self) -> bool:
        """The image examples take ``--lr-schedule``; the language example keeps its own warm-up + cosine."""
        return "--lr-schedule" in self.model_args


# The workloads PacTrain is for (tests/unit/test_workloads.py holds their size and wire : compute ratios).
TASKS = {
    "image": Task("image", "examples/pytorch_fashion_mnist.py", ("--model", "vgg", "--lr-schedule", "cosine"),
                  "test_accuracy", "Fashion-MNIST top-1, FashionVGG (4.3 M parameters)", True),
    # The same model, data and recipe in TensorFlow (Keras layers, a tf.function tape loop): its rows are
    # against TensorFlow's own dense run.
    "image-tf": Task("image-tf", "examples/tensorflow2_fashion_mnist.py", ("--model", "vgg", "--lr-schedule", "cosine"),
                     "test_accuracy", "Fashion-MNIST top-1, FashionVGG in Keras, TensorFlow tape loop (4.3 M parameters)",
                     True),
    "language": Task("language", "examples/pytorch_char_lm.py",
                     ("--embed-dim", "320", "--layers", "4", "--heads", "4", "--block-size", "128", "--batch-size", "16"),
                     "val_perplexity", "King James char-GPT (5.0 M parameters) validation perplexity", False),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--sparsities", type=float, nargs="+", default=[0.0, 0.8, 0.9, 0.95],
                        help="final sparsities to compare; 0 is the dense Horovod baseline")
    parser.add_argument("--tasks", nargs="+", choices=sorted(TASKS), default=sorted(TASKS))
    parser.add_argument("--np", type=int, default=2, help="workers per run")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--epochs", type=int, default=3, help="image epochs")
    parser.add_argument("--lm-epochs", type=int, default=1, help="language-model epochs")
    parser.add_argument("--max-steps", type=int, default=None, help="cap on image steps (tiny runs)")
    parser.add_argument("--lm-max-steps", type=int, default=None, help="cap on language-model steps")
    parser.add_argument("--lm-val-batches", type=int, default=20, help="language-model validation batches per worker")
    parser.add_argument("--fp16", action="store_true", help="fp16 values on the wire in every run")
    parser.add_argument("--dense-from", type=Path, default=None, metavar="RESULTS_JSON",
                        help="another report's results.json (same protocol) whose dense runs of this report's seeds "
                             "set the *vs dense* column where this report has none of its own")
    parser.add_argument("--values", nargs="+", choices=("fp32", "fp16", "ternary", "int3"), default=["fp32"],
                        help="PacTrain packed-value encodings to compare (the examples' --packed-values; fp32: inherit)")
    parser.add_argument("--rankings", nargs="+", choices=RANKINGS, default=[DEFAULT_RANKING],
                        help="how sparsity is spread over tensors (the examples' --ranking)")
    parser.add_argument("--windows", nargs="+", type=window_argument, default=[DEFAULT_WINDOW],
                        help="pruning windows BEGIN-END as fractions of the run (the examples' --prune-window), or "
                             "rampSTEPS: packed from the first step, re-ranked at every step of a STEPS-step ramp "
                             "(the examples' --prune-ramp)")
    parser.add_argument("--updates", nargs="+", type=int, default=[RUN_MASK_UPDATES],
                        help="mask updates in the window (the examples' --prune-updates)")
    parser.add_argument("--lr-schedules", nargs="+", choices=("cosine", "cosine-rewind"), default=[DEFAULT_LR_SCHEDULE],
                        help="image learning-rate schedules (the example's --lr-schedule)")
    parser.add_argument("--rescale-survivors", action="store_true",
                        help="every pruned run rescales its survivors at step 0 (the examples' --rescale-survivors; "
                             "windows that prune from step 0 only)")
    parser.add_argument("--out", default=str(REPO_ROOT / "reports" / "accuracy"), help="report folder")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds allowed per run")
    args = parser.parse_args(argv)
    if any(ramp_steps(w) for w in args.windows) and args.updates != [RUN_MASK_UPDATES]:
        parser.error("--updates counts mask updates in a window; a ramp re-ranks at every step: run ramps apart")
    if args.rescale_survivors and not all(ramp_steps(w) or float(w.split("-")[0]) == 0 for w in args.windows):
        parser.error("--rescale-survivors rescales the masks of step 0: give windows that begin at 0, or ramps")
    return args


@dataclass(frozen=True)
class Run:
    task: Task
    sparsity: float
    values: str
    ranking: str
    seed: int
    window: str = DEFAULT_WINDOW
    updates: int = RUN_MASK_UPDATES
    lr_schedule: str = DEFAULT_LR_SCHEDULE
    rescale_survivors: bool = False

    @property
    def name(self) -> str:
        variant = "".join(f"-{v}" for v, default in ((self.values, "fp32"), (self.ranking, "layer")) if v != default)
        if self.window != DEFAULT_WINDOW:
            variant += f"-{self.window}" if ramp_steps(self.window) else f"-w{self.window}"
        variant += f"-u{self.updates}" if self.updates != RUN_MASK_UPDATES else ""
        variant += f"-{self.lr_schedule}" if self.lr_schedule != DEFAULT_LR_SCHEDULE else ""
        variant += "-rescale" if self.rescale_survivors else ""
        return f"{self.task.name}-s{self.sparsity:g}{variant}-seed{self.seed}"


def ramp_steps(window: str) -> str | None:
    """A ``rampSTEPS`` window's STEPS (the examples' ``--prune-ramp``); None for a ``BEGIN-END`` window."""
    return window[len("ramp"):] if window.startswith("ramp") else None


def window_argument(text: str) -> str:
    """``BEGIN-END`` fractions of the run, normalised (``0.10-0.6`` -> ``0.1-0.6``), or ``rampSTEPS``."""
    steps = ramp_steps(text)
    if steps is not None:
        if not steps.isdigit():
            raise argparse.ArgumentTypeError(f"a ramp is rampSTEPS, its length in optimizer steps, got {text!r}")
        return f"ramp{int(steps)}"
    try:
        first, last = (float(part) for part in text.split("-"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a window is BEGIN-END, fractions of the run, got {text!r}") from None
    if not 0 <= first <= last <= 1:
        raise argparse.ArgumentTypeError(f"a window needs 0 <= BEGIN <= END <= 1, got {text!r}")
    return f"{first:g}-{last:g}"


# -- running --------------------------------------------------------------------------------------
def horovodrun() -> str:
    """The horovodrun of this interpreter's environment, else the one on PATH."""
    beside = Path(sys.executable).parent / "horovodrun"
    found = str(beside) if beside.is_file() else shutil.which("horovodrun")
    if found is None:
        sys.exit("accuracy: horovodrun not found: install Horovod (bash scripts/install.sh)")
    return found


def example_args(run: Run, args: argparse.Namespace, result_json: Path) -> list[str]:
    """The example's flags: identical for every run of a task except sparsity, values, ranking and seed."""
    flags = [*run.task.model_args, "--sparsity", str(run.sparsity), "--packed-values", PACKED_VALUES_FLAG.get(run.values, run.values), "--ranking", run.ranking,
             "--seed", str(run.seed), "--result-json", str(result_json), "--logdir="]
    if args.fp16:
        flags.append("--fp16")
    if steps := ramp_steps(run.window):
        flags += ["--prune-ramp", steps]
    elif run.window != DEFAULT_WINDOW:
        flags += ["--prune-window", *run.window.split("-")]
    if run.updates != RUN_MASK_UPDATES:
        flags += ["--prune-updates", str(run.updates)]
    if run.lr_schedule != DEFAULT_LR_SCHEDULE:
        flags += ["--lr-schedule", run.lr_schedule]  # after model_args: the last one counts
    if run.rescale_survivors:
        flags.append("--rescale-survivors")
    if run.task.name.startswith("image"):
        flags += ["--epochs", str(args.epochs)] + (["--max-steps", str(args.max_steps)] if args.max_steps else [])
    else:
        flags += ["--epochs", str(args.lm_epochs), "--val-batches", str(args.lm_val_batches)]
        flags += ["--max-steps", str(args.lm_max_steps)] if args.lm_max_steps else []
    return flags


def planned_runs(args: argparse.Namespace) -> list[Run]:
    """Every setting for every seed; at sparsity 0 nothing is pruned or packed, so one run per seed
    covers every encoding and ranking."""
    runs = []
    for name in args.tasks:
        for sparsity in args.sparsities:
            schedules = args.lr_schedules if name == "image" else [DEFAULT_LR_SCHEDULE]  # the LM has its own
            variants = ([DENSE[1:]] if sparsity == 0 else
                        [(v, r, w, u, lr, args.rescale_survivors) for lr in schedules for u in args.updates
                         for w in args.windows for r in args.rankings for v in args.values])
            runs += [Run(TASKS[name], sparsity, v, r, seed, w, u, lr, rescaled)
                     for v, r, w, u, lr, rescaled in variants for seed in args.seeds]
    return runs


def final_mask_bytes_per_step(result: dict) -> float | None:
    """Bytes per step handed to Horovod once masks are final: the last step's where the example records it
    (a 1-epoch run), else the mean over the last epoch, which the schedule leaves with final masks."""
    if result.get("last_step_sent_bytes"):
        return float(result["last_step_sent_bytes"])
    history = result.get("history") or []
    last = history[-1] if history else None
    return last["sent_bytes"] / last["steps"] if last and last["steps"] else None


def run_one(run: Run, args: argparse.Namespace, out: Path) -> dict:
    """Launch one training run; its metrics plus the launcher's wall time, or an ``error``."""
    result_json, log_path = out / "runs" / f"{run.name}.json", out / "logs" / f"{run.name}.log"
    result_json.unlink(missing_ok=True)
    command = [horovodrun(), "-np", str(args.np), "-H", f"localhost:{args.np}", "--gloo",
               sys.executable, str(REPO_ROOT / run.task.script), *example_args(run, args, result_json)]
    # PyTorch runs: horovodrun's build check is their only TensorFlow import, and at level 2 it still logs
    # three harmless "Unable to register cuFFT/cuDNN/cuBLAS factory" errors.
    env = dict(os.environ, PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="3")
    print(f"[accuracy] {run.name}: {' '.join(command[1:])}", flush=True)
    started = time.perf_counter()
    with open(log_path, "w") as log:
        try:
            returncode = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT,
                                        timeout=args.timeout, check=False).returncode
        except subprocess.TimeoutExpired:
            returncode = "timeout"
    seconds = time.perf_counter() - started
    base = {"name": run.name, "task": run.task.name, "sparsity_target": run.sparsity, "values": run.values, "ranking": run.ranking,
            "window": run.window, "updates": run.updates, "lr_schedule": run.lr_schedule,
            "rescale_survivors": run.rescale_survivors, "seed": run.seed, "launcher_seconds": seconds, "log": str(log_path)}
    if returncode != 0 or not result_json.is_file():
        tail = log_path.read_text(errors="replace").splitlines()[-15:]
        print(f"[accuracy] {run.name} FAILED ({returncode}); last lines of {log_path}:\n  " + "\n  ".join(tail),
              flush=True)
        return dict(base, error=f"exit {returncode}")
    result = json.loads(result_json.read_text())
    result["final_bytes_per_step"] = final_mask_bytes_per_step(result)
    result.pop("history", None)
    print(f"[accuracy] {run.name}: {run.task.metric} {result[run.task.metric]:.4f}, sent "
          f"{result['sent_bytes'] / 1e6:.1f} MB vs dense {result['dense_bytes'] / 1e6:.1f} MB, {seconds:.0f} s", flush=True)
    return dict(base, **result)


# -- reporting ------------------------------------------------------------------------------------
def settings_of(run: dict) -> tuple:
    return (run["task"], run["sparsity_target"], run.get("values", "fp32"), run.get("ranking", "layer"),
            run.get("window", DEFAULT_WINDOW), run.get("updates", RUN_MASK_UPDATES),
            run.get("lr_schedule", DEFAULT_LR_SCHEDULE), run.get("rescale_survivors", False))


def grouped(runs: list[dict], task: Task) -> dict[tuple, list[dict]]:
    """Finished runs of ``task`` by setting (``DENSE``'s fields), seeds together, in run order."""
    groups: dict[tuple, list[dict]] = {}
    for run in runs:
        if run["task"] == task.name and "error" not in run:
            groups.setdefault(settings_of(run)[1:], []).append(run)
    return groups


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def markdown_table(runs: list[dict], task: Task, borrowed_dense: Sequence[dict] = ()) -> str:
    groups = grouped(runs, task)
    dense = groups.get(DENSE) or grouped(list(borrowed_dense), task).get(DENSE, [])
    parameters = next((r["parameters"] for g in groups.values() for r in g if "parameters" in r), None)
    lines = [f"### {task.label}", "", f"{parameters:,} parameters." if parameters else "", "",
             f"| sparsity | ranking | values | window | updates | lr | reached | {task.metric} (mean) | per seed | vs dense | "
             "sent MB/run | kB/step, final masks | dense kB/step | train s (mean) |",
             "|---:|---|---|---|---:|---|---:|---:|---|---:|---:|---:|---:|---:|"]
    for (sparsity, values, ranking, window, updates, lr_schedule, rescaled), group in groups.items():
        metric = mean([r[task.metric] for r in group])
        seeds = {r["seed"] for r in group}  # a row of fewer seeds than the dense runs compares with its own
        same_seeds = [r[task.metric] for r in dense if r["seed"] in seeds]
        dense_metric = mean(same_seeds) if same_seeds else None
        if dense_metric is None:
            delta = "n/a"
        elif task.higher_is_better:
            delta = f"{100 * (metric - dense_metric):+.2f} pp"
        else:
            delta = f"{100 * (metric / dense_metric - 1):+.1f} %"
        # Where some seeds record the last step and some only an epoch's mean, the last step alone is the
        # final masks' cost: the two do not average.
        exact = [r for r in group if r.get("last_step_sent_bytes")]
        per_step = [r["final_bytes_per_step"] for r in exact or group if r.get("final_bytes_per_step")]
        dense_per_step = mean([r["dense_bytes"] / r["steps"] for r in group])
        lines.append(
            f"| {sparsity:g} | {ranking} | {values} | {window}{', rescaled' if rescaled else ''} | {'every step' if ramp_steps(window) else updates} | {lr_label(task, lr_schedule)} | {mean([r['sparsity'] for r in group]):.3f} | {metric:.4f} | "
            + ", ".join(f"{r[task.metric]:.4f}" for r in group) + f" | {delta} | "
            f"{mean([r['sent_bytes'] for r in group]) / 1e6:.0f} | "
            + (f"{mean(per_step) / 1e3:.0f}" if per_step else "n/a")
            + f" | {dense_per_step / 1e3:.0f} | {mean([r['wall_seconds'] for r in group]):.0f} |")
    failed = [r for r in runs if r["task"] == task.name and "error" in r]
    lines += [f"\nFailed: {r['log']} ({r['error']})" for r in failed]
    return "\n".join(lines)


def write_markdown(path: Path, runs: list[dict], settings: dict) -> None:
    header = [
        "# Accuracy: dense Horovod vs PacTrain", "",
        f"{settings['np']} workers (horovodrun, Gloo), seeds {settings['seeds']}, same hyperparameters in every run; "
        f"only sparsity, ranking and values change. Image: {settings['epochs']} epochs, cosine learning rate"
        + (f" (at most {settings['max_steps']} steps)" if settings["max_steps"] else "")
        + f"; language: {settings['lm_epochs']} epoch"
        + (f" (at most {settings['lm_max_steps']} steps)" if settings["lm_max_steps"] else "")
        + f", the example's recipe (AdamW beta2 0.99, warm-up over 5 % then cosine, clipping at norm 1); `--fp16`: {settings['fp16']}. Pruning runs from 10 % to 60 % of the steps "
        "(`total_steps=`, the default window) unless the *window* column says otherwise; *rampN*: packed from the first "
        "step, sparsity 0.5 at step 0 rising to the final at step N, masks re-ranked at every step (`pt.short_ramp`)"
        + ("; *rescaled*: the survivors of step 0's masks take their tensor's norm (`rescale_survivors=True`)."
           if any(r.get("rescale_survivors") for r in runs) else "."), "",
        "*sent MB/run*: bytes each worker handed to the all-reduce over the run; *kB/step, final masks*: the same "
        "per step in the last epoch; *dense kB/step*: a dense all-reduce of every gradient; *train s*: the "
        "example's training-loop time."
        + (f" *vs dense*: against the dense runs of the same seeds in `{settings['dense_from']}`." if settings.get("dense_from") else ""), "",
    ]
    borrowed = dense_runs(REPO_ROOT / settings["dense_from"], settings) if settings.get("dense_from") else []
    tables = [markdown_table(runs, TASKS[name], borrowed) for name in settings["tasks"]]
    path.write_text("\n".join(header) + "\n" + "\n\n".join(tables) + "\n")


def lr_label(task: Task, lr_schedule: str) -> str:
    return lr_schedule if task.takes_lr_schedule else "its own"


def variant_label(task: Task, values: str, ranking: str, window: str, updates: int, lr_schedule: str,
                  rescaled: bool) -> str:
    """A plot legend's words for one row of the report, lr named only where it can differ."""
    words = [values, ranking, f"window {window}", "updates every step" if ramp_steps(window) else f"{updates} updates"]
    words += [lr_schedule] if task.takes_lr_schedule else []
    return " ".join(words + (["rescaled"] if rescaled else []))


def write_plot(path: Path, runs: list[dict], task_names: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(task_names), figsize=(5.5 * len(task_names), 4), squeeze=False)
    for axis, name in zip(axes[0], task_names):
        task = TASKS[name]
        groups = grouped(runs, task)
        dense = groups.get(DENSE, [])
        for variant in dict.fromkeys(tuple(rest) for (s, *rest) in groups if s > 0):
            points = {s: g for (s, *rest), g in groups.items() if tuple(rest) == variant}
            points.update({0.0: dense} if dense else {})
            xs = sorted(points)
            axis.plot(xs, [mean([r[task.metric] for r in points[x]]) for x in xs], "o-", label=variant_label(task, *variant))
            for x in xs:
                axis.scatter([x] * len(points[x]), [r[task.metric] for r in points[x]], s=8, color="grey")
        axis.set_title(task.label, fontsize=9)
        axis.set_xlabel("target sparsity")
        axis.set_ylabel(task.metric)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


# Settings that every run of one report shares; the rest (sparsities, seeds, ...) only say what to run.
PROTOCOL = ("np", "epochs", "lm_epochs", "max_steps", "lm_max_steps", "lm_val_batches", "fp16")


def finished_runs(path: Path, protocol: dict, remedy: str) -> list[dict]:
    """The finished runs of the report at ``path``, which must share this run's protocol."""
    record = json.loads(path.read_text())
    theirs = {key: record["settings"].get(key) for key in PROTOCOL}
    if theirs != protocol:
        sys.exit(f"accuracy: {path} was made with {theirs}, this run asks for {protocol}: {remedy}")
    return [run for run in record["runs"] if "name" in run and "error" not in run]


def previous_runs(path: Path, protocol: dict) -> dict[str, dict]:
    """Finished runs of an earlier invocation into the same folder, by name: a report grows in parts."""
    return {run["name"]: run for run in finished_runs(path, protocol, "use another --out")} if path.is_file() else {}


def dense_runs(path: Path, settings: dict) -> list[dict]:
    """``--dense-from``'s dense runs: the baseline of a report that adds settings without rerunning it."""
    if not path.is_file():
        sys.exit(f"accuracy: --dense-from {path}: no such file")
    runs = finished_runs(path, {key: settings[key] for key in PROTOCOL}, "--dense-from needs a report of the same protocol")
    return [run for run in runs if settings_of(run)[1:] == DENSE]


def save(out: Path, settings: dict, runs: dict[str, dict]) -> None:
    """``results.json`` and ``results.md`` as they stand: a stop loses at most the run in flight."""
    settings["seeds"] = sorted({r["seed"] for r in runs.values()})
    (out / "results.json").write_text(json.dumps({"settings": settings, "runs": list(runs.values())}, indent=2) + "\n")
    write_markdown(out / "results.md", list(runs.values()), settings)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    for folder in (out, out / "runs", out / "logs"):
        folder.mkdir(parents=True, exist_ok=True)
    protocol = {key: getattr(args, key) for key in PROTOCOL}
    runs = previous_runs(out / "results.json", protocol)
    settings = dict(protocol, tasks=sorted({r["task"] for r in runs.values()} | set(args.tasks)),
                    load_before=os.getloadavg())
    if args.dense_from:
        dense_runs(args.dense_from, settings)  # a wrong file fails before any run
        settings["dense_from"] = os.path.relpath(args.dense_from.resolve(), REPO_ROOT)
    for run in planned_runs(args):
        if run.name in runs:
            print(f"[accuracy] {run.name}: kept from {out / 'results.json'}", flush=True)
            continue
        runs[run.name] = run_one(run, args, out)
        save(out, settings, runs)
    settings["load_after"] = os.getloadavg()
    save(out, settings, runs)
    write_plot(out / "accuracy.png", list(runs.values()), settings["tasks"])
    print(f"[accuracy] wrote {out / 'results.json'}, {out / 'results.md'}, {out / 'accuracy.png'}")
    failed = [r["log"] for r in runs.values() if "error" in r]
    if failed:
        print(f"[accuracy] FAILED runs: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
