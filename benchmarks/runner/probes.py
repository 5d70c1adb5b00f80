"""What a cell is measured against: each link's TCP rate (probes) and the compute bound (no communication)."""

from __future__ import annotations

import json
import statistics
import subprocess
from pathlib import Path

from benchmarks.links.links import Topology
from benchmarks.runner.config import BenchConfig
from benchmarks.runner.processes import Processes, child_env, in_namespace, python_module, read_line, run_concurrently

PROBE_PORT = 5201


def probe_link(topology: Topology, processes: Processes, rank: int, seconds: float) -> dict:
    """TCP from ``rank`` to the next rank: both NICs are shaped, so this is one rank's link rate."""
    peer = (rank + 1) % topology.world_size
    sink = processes.start(
        in_namespace(topology.worker_namespace(peer), python_module(
            "benchmarks.links.probe", "serve", "--host", topology.worker_address(peer), "--port", str(PROBE_PORT))),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())
    try:
        if read_line(sink, 30) != "ready":
            raise RuntimeError(f"probe sink in {topology.worker_namespace(peer)} did not start: {sink.stderr.read()}")
        sender = subprocess.run(in_namespace(topology.worker_namespace(rank), python_module(
            "benchmarks.links.probe", "send", "--host", topology.worker_address(peer), "--port", str(PROBE_PORT),
            "--seconds", str(seconds))), capture_output=True, text=True, env=child_env(), timeout=seconds + 60)
        if sender.returncode != 0:
            raise RuntimeError(f"probe sender in {topology.worker_namespace(rank)} failed: {sender.stderr.strip()}")
        result = json.loads(read_line(sink, 60))
        sink.wait(10)
    finally:
        processes.stop(sink)
    return {"rank": rank, "peer": peer, **result}


def probe_links(topology: Topology, processes: Processes, seconds: float) -> dict:
    probes = [probe_link(topology, processes, rank, seconds) for rank in range(topology.world_size)]
    return {"probes": probes, "mbit_per_s": min(p["mbit_per_s"] for p in probes),
            "qdisc": topology.qdiscs(0)}


def compute_bound(config: BenchConfig, processes: Processes, model: str, workdir: Path) -> dict:
    """``world_size`` plain-torch single workers at once, no communication: the step-time floor.

    They run concurrently so that they share the CPU exactly as the ranks of a cell do.
    """
    batch = config.batch_sizes[model]
    outs = [workdir / f"bound-{model}-{rank}.json" for rank in range(config.world_size)]
    commands = [python_module("benchmarks.throughput.worker", "--model", model, "--compute-only", "--batch-size", str(batch),
                              "--warmup", str(config.warmup), "--steps", str(config.steps), "--seed", str(config.seed),
                              "--threads", str(config.threads), "--out", str(out)) for out in outs]
    run_concurrently(processes, commands, [out.with_suffix(".log") for out in outs], config.cell_timeout_s,
                     f"compute bound for {model}")
    ranks = [json.loads(out.read_text()) for out in outs]
    medians = [statistics.median(s["total"] for s in r["steps"]) for r in ranks]
    return {"model": model, "batch_size": batch, "workers": config.world_size,
            "step_s_per_worker": medians, "step_s": statistics.median(medians),
            "samples_per_s": sum(batch / m for m in medians),
            "compute_s": statistics.median(statistics.median(s["compute"] for s in r["steps"]) for r in ranks)}
