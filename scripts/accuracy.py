#!/usr/bin/env python3
"""Accuracy report: dense Horovod against PacTrain at several sparsities, same seed and hyperparameters.

Each run is one example launched with ``horovodrun -np N --gloo`` (``--np``, default 2) that
writes its metrics with ``--result-json``; this script collects them into
``reports/accuracy/``:

- ``results.json``: the settings and every run's metrics (final metric, wire bytes, wall time).
- ``results.md``: one table per task, with the change against the dense run.
- ``accuracy.png``: metric and total bytes against sparsity.

The full report (5 sparsities x 2 tasks) takes about an hour on 2 CPU cores::

    .venv/bin/python scripts/accuracy.py

Packed-value encodings side by side (``--values``; the dense run happens once)::

    .venv/bin/python scripts/accuracy.py --sparsities 0 0.9 --values fp32 fp16 ternary --out reports/accuracy/values

A tiny configuration proves the pipeline in a couple of minutes::

    .venv/bin/python scripts/accuracy.py --sparsities 0 0.9 --max-steps 20 --lm-max-steps 10 --out /tmp/accuracy
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Task:
    name: str
    script: str
    metric: str  # key in the example's result JSON
    label: str
    higher_is_better: bool


TASKS = {
    "fashion_mnist": Task("fashion_mnist", "examples/pytorch_fashion_mnist.py", "test_accuracy",
                          "Fashion-MNIST top-1", True),
    "char_lm": Task("char_lm", "examples/pytorch_char_lm.py", "val_perplexity", "char-LM val perplexity", False),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--sparsities", type=float, nargs="+", default=[0.0, 0.5, 0.8, 0.9, 0.95],
                        help="final sparsities to compare; 0 is the dense Horovod baseline")
    parser.add_argument("--tasks", nargs="+", choices=sorted(TASKS), default=sorted(TASKS))
    parser.add_argument("--np", type=int, default=2, help="workers per run")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--epochs", type=int, default=2, help="Fashion-MNIST epochs")
    parser.add_argument("--lm-epochs", type=int, default=1, help="char-LM epochs")
    parser.add_argument("--max-steps", type=int, default=None, help="cap on Fashion-MNIST steps (tiny runs)")
    parser.add_argument("--lm-max-steps", type=int, default=None, help="cap on char-LM steps (tiny runs)")
    parser.add_argument("--lm-val-batches", type=int, default=20, help="char-LM validation batches per worker")
    parser.add_argument("--fp16", action="store_true", help="fp16 values on the wire in every run")
    parser.add_argument("--lr-schedule", choices=("constant", "cosine"), default="constant",
                        help="Fashion-MNIST learning-rate schedule (the char LM always anneals)")
    parser.add_argument("--values", nargs="+", choices=("fp32", "fp16", "ternary"), default=["fp32"],
                        help="PacTrain packed-value encodings to compare (the examples' --values)")
    parser.add_argument("--out", default=str(REPO_ROOT / "reports" / "accuracy"), help="report folder")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds allowed per run")
    return parser.parse_args(argv)


# -- running --------------------------------------------------------------------------------------
def horovodrun() -> str:
    """The horovodrun of this interpreter's environment, else the one on PATH."""
    beside = Path(sys.executable).parent / "horovodrun"
    found = str(beside) if beside.is_file() else shutil.which("horovodrun")
    if found is None:
        sys.exit("accuracy: horovodrun not found: install Horovod (bash scripts/install.sh)")
    return found


def example_args(task: Task, sparsity: float, values: str, args: argparse.Namespace, result_json: Path) -> list[str]:
    """The example's flags: identical for every run of a task except --sparsity and --values."""
    common = ["--sparsity", str(sparsity), "--values", values, "--seed", str(args.seed), "--result-json",
              str(result_json), "--logdir="]
    if args.fp16:
        common.append("--fp16")
    if task.name == "fashion_mnist":
        extra = ["--epochs", str(args.epochs), "--lr-schedule", args.lr_schedule]
        extra += ["--max-steps", str(args.max_steps)] if args.max_steps else []
    else:
        extra = ["--epochs", str(args.lm_epochs), "--val-batches", str(args.lm_val_batches)]
        extra += ["--max-steps", str(args.lm_max_steps)] if args.lm_max_steps else []
    return common + extra


def run_name(task: Task, sparsity: float, values: str) -> str:
    return f"{task.name}-s{sparsity:g}" + ("" if values == "fp32" else f"-{values}")


def planned_runs(args: argparse.Namespace) -> list[tuple[str, float, str]]:
    """(task, sparsity, values) to run; at sparsity 0 nothing is packed, so one run covers every encoding."""
    return [(name, sparsity, values) for name in args.tasks for sparsity in args.sparsities
            for values in (["fp32"] if sparsity == 0 else args.values)]


def run_one(task: Task, sparsity: float, values: str, args: argparse.Namespace, out: Path) -> dict:
    """Launch one training run; its metrics plus the launcher's wall time, or an ``error``."""
    name = run_name(task, sparsity, values)
    result_json, log_path = out / "runs" / f"{name}.json", out / "logs" / f"{name}.log"
    result_json.unlink(missing_ok=True)
    command = [horovodrun(), "-np", str(args.np), "-H", f"localhost:{args.np}", "--gloo",
               sys.executable, str(REPO_ROOT / task.script), *example_args(task, sparsity, values, args, result_json)]
    # PyTorch runs: horovodrun's build check is their only TensorFlow import, and at level 2 it still logs
    # three harmless "Unable to register cuFFT/cuDNN/cuBLAS factory" errors.
    env = dict(os.environ, PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="3")
    print(f"[accuracy] {name}: {' '.join(command[1:])}", flush=True)
    started = time.perf_counter()
    with open(log_path, "w") as log:
        try:
            returncode = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT,
                                        timeout=args.timeout, check=False).returncode
        except subprocess.TimeoutExpired:
            returncode = "timeout"
    seconds = time.perf_counter() - started
    base = {"task": task.name, "sparsity_target": sparsity, "values": values, "launcher_seconds": seconds,
            "log": str(log_path)}
    if returncode != 0 or not result_json.is_file():
        tail = log_path.read_text(errors="replace").splitlines()[-15:]
        print(f"[accuracy] {name} FAILED ({returncode}); last lines of {log_path}:\n  " + "\n  ".join(tail), flush=True)
        return dict(base, error=f"exit {returncode}")
    result = json.loads(result_json.read_text())
    result.pop("history", None)
    print(f"[accuracy] {name}: {task.metric} {result[task.metric]:.4f}, sent {result['sent_bytes'] / 1e6:.1f} MB "
          f"vs dense {result['dense_bytes'] / 1e6:.1f} MB, {seconds:.0f} s", flush=True)
    return dict(base, **result)


# -- reporting ------------------------------------------------------------------------------------
def baseline(runs: list[dict], task: Task) -> dict | None:
    return next((r for r in runs if r["task"] == task.name and r["sparsity_target"] == 0 and "error" not in r), None)


def markdown_table(runs: list[dict], task: Task) -> str:
    dense = baseline(runs, task)
    lines = [f"### {task.label}", "",
             f"| target sparsity | values | reached | {task.metric} | vs dense | sent MB | dense MB | ratio | "
             "ring MB/worker | train s | wall s |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for run in (r for r in runs if r["task"] == task.name):
        if "error" in run:
            lines.append(f"| {run['sparsity_target']:g} | {run['values']} | failed: {run['error']} (see {run['log']}) "
                         "||||||||||")
            continue
        value = run[task.metric]
        delta = f"{value - dense[task.metric]:+.4f}" if dense else "n/a"
        lines.append(
            f"| {run['sparsity_target']:g} | {run['values']} | {run['sparsity']:.3f} | {value:.4f} | {delta} | "
            f"{run['sent_bytes'] / 1e6:.1f} | {run['dense_bytes'] / 1e6:.1f} | {run['compression_ratio']:.2f}x | "
            f"{run['ring_bytes_per_worker'] / 1e6:.1f} | {run['wall_seconds']:.0f} | {run['launcher_seconds']:.0f} |")
    return "\n".join(lines)


def write_markdown(path: Path, runs: list[dict], settings: dict) -> None:
    header = [
        "# Accuracy: dense Horovod vs PacTrain", "",
        f"{settings['np']} workers (horovodrun, Gloo), seed {settings['seed']}, same hyperparameters in every run; "
        f"only `--sparsity` and `--values` change. Fashion-MNIST: {settings['epochs']} epochs, "
        f"{settings.get('lr_schedule', 'constant')} learning rate"
        + (f" (at most {settings['max_steps']} steps)" if settings["max_steps"] else "")
        + f"; char-LM: {settings['lm_epochs']} epochs"
        + (f" (at most {settings['lm_max_steps']} steps)" if settings["lm_max_steps"] else "")
        + f"; `--fp16`: {settings['fp16']}.", "",
        "*sent MB*: bytes each worker handed to the all-reduce over the run; *dense MB*: the same for a dense "
        "all-reduce of every gradient; *ring MB/worker*: what ring all-reduce puts on each worker's link, "
        "2(n-1)/n x sent; *train s*: the example's training-loop time; *wall s*: the whole launch.", "",
    ]
    tables = [markdown_table(runs, TASKS[name]) for name in settings["tasks"]]
    path.write_text("\n".join(header) + "\n" + "\n\n".join(tables) + "\n")


def write_plot(path: Path, runs: list[dict], task_names: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(2, len(task_names), figsize=(5.5 * len(task_names), 7), squeeze=False)
    for column, name in enumerate(task_names):
        task = TASKS[name]
        done = sorted((r for r in runs if r["task"] == name and "error" not in r), key=lambda r: r["sparsity_target"])
        top, bottom = axes[0][column], axes[1][column]
        for values in dict.fromkeys(r.get("values", "fp32") for r in done if r["sparsity_target"] > 0):
            line = [r for r in done if r["sparsity_target"] == 0 or r.get("values", "fp32") == values]
            top.plot([r["sparsity_target"] for r in line], [r[task.metric] for r in line], "o-", label=values)
        top.legend()
        top.set_title(task.label)
        top.set_ylabel(task.metric)
        labels = [f"{r['sparsity_target']:g}" + ("" if r.get("values", "fp32") == "fp32" else f" {r['values']}")
                  for r in done]
        bottom.bar(labels, [r["sent_bytes"] / 1e6 for r in done], color="tab:orange", label="sent")
        bottom.plot(labels, [r["dense_bytes"] / 1e6 for r in done], "k--", label="dense")
        bottom.set_xlabel("target sparsity")
        bottom.set_ylabel("all-reduce MB per worker (run total)")
        bottom.legend()
        top.set_xlabel("target sparsity")
        top.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    for folder in (out, out / "runs", out / "logs"):
        folder.mkdir(parents=True, exist_ok=True)
    settings = {key: getattr(args, key) for key in ("np", "seed", "epochs", "lm_epochs", "max_steps", "lm_max_steps",
                                                    "lm_val_batches", "fp16", "values", "sparsities", "tasks",
                                                    "lr_schedule")}
    runs = []
    for name, sparsity, values in planned_runs(args):
        runs.append(run_one(TASKS[name], sparsity, values, args, out))
        (out / "results.json").write_text(json.dumps({"settings": settings, "runs": runs}, indent=2) + "\n")
    write_markdown(out / "results.md", runs, settings)
    write_plot(out / "accuracy.png", runs, args.tasks)
    print(f"[accuracy] wrote {out / 'results.json'}, {out / 'results.md'}, {out / 'accuracy.png'}")
    failed = [run_name(TASKS[r["task"]], r["sparsity_target"], r["values"]) for r in runs if "error" in r]
    if failed:
        print(f"[accuracy] FAILED runs: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
