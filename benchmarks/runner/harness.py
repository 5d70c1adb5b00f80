"""The benchmark run: links, probes, compute bounds, and one Horovod job per cell (one module per concern:
``config``, ``processes``, ``probes``, ``jobs``, ``summary``; this one runs them).

A cell is (model, link, method). For each link setting the harness shapes every rank's NIC,
probes each link with a TCP transfer, then for each model and method starts a rendezvous
server in the bridge namespace and one worker per rank in the rank's namespace, waits, and
reads the ranks' JSON. A failed cell is recorded with its reason; the run goes on. Whatever
happens (failure, Ctrl-C, SIGTERM), every namespace the run made is deleted on the way out.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.links.links import LinkSpec, Topology, delete_namespace, list_namespaces, stale_namespaces
from benchmarks.runner.config import BATCH_SIZES, SKIPPED, BenchConfig, job_count, say
from benchmarks.runner.jobs import free_port, rank_env, run_job, start_rendezvous
from benchmarks.runner.probes import PROBE_PORT, compute_bound, probe_link, probe_links
from benchmarks.runner.processes import (
    Processes,
    child_env,
    cleanup_on_signals,
    in_namespace,
    python_module,
    read_line,
    run_concurrently,
    tail,
    wait_all,
)
from benchmarks.runner.summary import best_round, meta, summarize_cell
from example_support.progress import Progress

# The names the benchmarks import from here (each defined in the module of its concern).
__all__ = ["BATCH_SIZES", "PROBE_PORT", "SKIPPED", "BenchConfig", "Processes", "best_round", "child_env",
           "cleanup_on_signals", "compute_bound", "free_port", "in_namespace", "job_count", "meta", "probe_link",
           "probe_links", "python_module", "rank_env", "read_line", "remove_stale", "run_benchmark", "run_block",
           "run_cell", "run_concurrently", "run_job", "run_one", "say", "start_rendezvous", "summarize_cell", "tail",
           "wait_all"]


def run_cell(config: BenchConfig, topology: Topology, processes: Processes, model: str, method: str,
             workdir: Path) -> list[dict]:
    """One benchmark cell: ``world_size`` workers in their namespaces. Returns the ranks' records."""
    cell_dir = Path(tempfile.mkdtemp(prefix=f"{model}-{method}-", dir=workdir))

    def worker(rank: int) -> list[str]:
        return python_module(
            "benchmarks.throughput.worker", "--model", model, "--method", method,
            "--batch-size", str(config.batch_sizes[model]), "--warmup", str(config.warmup),
            "--steps", str(config.steps), "--seed", str(config.seed), "--threads", str(config.threads),
            "--out", str(cell_dir / f"rank{rank}.json"))

    run_job(topology, processes, worker, cell_dir, config.cell_timeout_s, config.cycle_time_ms)
    return [json.loads((cell_dir / f"rank{rank}.json").read_text()) for rank in range(topology.world_size)]


def remove_stale(config: BenchConfig) -> list[str]:
    stale = stale_namespaces(list_namespaces())
    for name in stale:
        delete_namespace(name)
    if stale:
        say(config, f"removed namespaces of dead runs: {', '.join(stale)}")
    return stale


def run_benchmark(config: BenchConfig) -> dict:
    """Every cell of ``config``; returns the results document (see ``report.py`` for its use)."""
    config.validate()
    processes, topology = Processes(), Topology(config.world_size)
    results = {"meta": meta(config), "links": {}, "bounds": [], "cells": []}
    progress = Progress(total=job_count(config), desc="[bench] progress", unit="job", enabled=config.log,
                        stream=sys.stderr)
    with cleanup_on_signals(), tempfile.TemporaryDirectory(prefix="ptb-") as tmp, progress:
        workdir = Path(tmp)
        try:
            remove_stale(config)
            topology.create()
            say(config, f"namespaces: {', '.join(topology.created)}", progress)
            for link in config.links:
                topology.shape(link)
                results["links"][link.label] = probe_links(topology, processes, config.probe_seconds)
                say(config, f"link {link.label}: probed {results['links'][link.label]['mbit_per_s']:.1f} Mbit/s",
                    progress)
                for model in config.models:
                    if all(config.skipped(model, link.label, method) for method in config.methods):
                        continue
                    bound, cells = run_block(config, topology, processes, model, link, results["links"][link.label],
                                             workdir, progress)
                    results["bounds"].append(bound)
                    results["cells"].extend(cells)
        finally:
            processes.stop_all()
            topology.teardown()
    results["meta"]["loadavg_end"] = os.getloadavg()
    return results


def run_block(config: BenchConfig, topology: Topology, processes: Processes, model: str, link: LinkSpec,
              probed: dict, workdir: Path, progress: Progress) -> tuple[dict, list[dict]]:
    """The compute bound and every method of one model on one link, ``config.repeats`` times over.

    The machine is shared and its load drifts, so the bound is measured next to the cells it
    bounds, and with repeats the rounds are interleaved (bound, m1, m2, ..., bound, m1, ...) and
    each figure is the best round's: the estimate least disturbed by other users, taken the
    same way for the bound and for every method.
    """
    bounds, rounds = [], []
    for _ in range(config.repeats):
        bound = dict(compute_bound(config, processes, model, workdir), link=link.label)
        bounds.append(bound)
        say(config, f"compute bound {model} x{config.world_size}, batch {bound['batch_size']}: "
                    f"{bound['samples_per_s']:.2f} samples/s", progress)
        progress.update()
        rounds.append([run_one(config, topology, processes, model, link, method, probed, bound, workdir, progress)
                       for method in config.methods])
    best_bound = max(bounds, key=lambda b: b["samples_per_s"])
    best_bound = dict(best_bound, rounds=[b["samples_per_s"] for b in bounds])
    cells = [best_round([round_[i] for round_ in rounds], best_bound) for i in range(len(config.methods))]
    return best_bound, cells


def run_one(config: BenchConfig, topology: Topology, processes: Processes, model: str, link: LinkSpec, method: str,
            probed: dict, bound: dict, workdir: Path, progress: Progress) -> dict:
    cell = {"model": model, "link": link.label, "method": method, "batch_size": config.batch_sizes[model],
            "loadavg_start": os.getloadavg()[0]}
    if config.skipped(model, link.label, method):
        say(config, f"{model} {link.label} {method}: skipped", progress)
        progress.update()
        return dict(cell, error=SKIPPED)
    started = time.monotonic()
    try:
        ranks = run_cell(config, topology, processes, model, method, workdir)
        cell.update(summarize_cell(ranks, probed, bound))
        message = (f"{model} {link.label} {method}: {cell['samples_per_s']:.2f} samples/s, "
                   f"{cell['ratio_to_bound']:.2f}x bound, wire {cell['wire_tx_bytes_per_step'] / 1e6:.2f} MB/step")
    except (RuntimeError, TimeoutError, OSError, ValueError, KeyError) as error:
        cell["error"] = str(error)
        message = f"{model} {link.label} {method}: FAILED: {error}"
    cell["wall_s"] = time.monotonic() - started
    say(config, message, progress)
    progress.update()
    return cell
