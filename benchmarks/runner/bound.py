"""The compute bound: the step-time floor of a model, its workers run at once without communication."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from benchmarks.runner.config import BenchConfig
from benchmarks.runner.processes import Processes, python_module, run_concurrently


def compute_bound(config: BenchConfig, processes: Processes, model: str, workdir: Path,
                  module: str = "benchmarks.throughput.worker") -> dict:
    """``world_size`` plain single workers at once (``module``'s framework), no communication: the step-time floor.

    They run concurrently so that they share the CPU exactly as the ranks of a cell do.
    """
    batch = config.batch_sizes[model]
    outs = [workdir / f"bound-{model}-{module.rsplit('.', 1)[-1]}-{rank}.json" for rank in range(config.world_size)]
    commands = [python_module(module, "--model", model, "--compute-only", "--batch-size", str(batch),
                              "--warmup", str(config.warmup), "--steps", str(config.steps), "--seed", str(config.seed),
                              "--threads", str(config.threads), "--out", str(out)) for out in outs]
    run_concurrently(processes, commands, [out.with_suffix(".log") for out in outs], config.cell_timeout_s,
                     f"compute bound for {model}")
    ranks = [json.loads(out.read_text()) for out in outs]
    medians = [statistics.median(s["total"] for s in r["steps"]) for r in ranks]
    return {"model": model, "framework": ranks[0].get("framework", "torch"), "batch_size": batch,
            "workers": config.world_size,
            "step_s_per_worker": medians, "step_s": statistics.median(medians),
            "samples_per_s": sum(batch / m for m in medians),
            "compute_s": statistics.median(statistics.median(s["compute"] for s in r["steps"]) for r in ranks)}
