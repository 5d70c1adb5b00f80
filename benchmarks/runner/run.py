"""The benchmark run: links, probes, compute bounds, and one Horovod job per cell.

A cell is (model, link, method). For each link setting the run shapes every rank's NIC,
probes each link with a TCP transfer, then for each model and method starts a rendezvous
server in the bridge namespace and one worker per rank in the rank's namespace, waits, and
reads the ranks' JSON. A failed cell is recorded with its reason; the run goes on. Whatever
happens (failure, Ctrl-C, SIGTERM), every namespace the run made is deleted on the way out.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import horovod
import torch

from benchmarks.common.methods import parse_method, worker_module
from benchmarks.links.links import LinkSpec, Topology, remove_stale_namespaces
from benchmarks.runner.bound import compute_bound
from benchmarks.runner.config import SKIPPED, BenchConfig, job_count, say
from benchmarks.runner.jobs import run_job
from benchmarks.runner.probing import probe_links
from benchmarks.runner.processes import RANK_VARIABLES, Processes, python_module
from benchmarks.runner.signals import cleanup_on_signals
from benchmarks.runner.summary import best_round, summarize_cell
from example_support.progress import Progress


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
            stale = remove_stale_namespaces()
            if stale:
                say(config, f"removed namespaces of dead runs: {', '.join(stale)}", progress)
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
                    block_bounds, cells = run_block(config, topology, processes, model, link, results["links"][link.label],
                                             workdir, progress)
                    results["bounds"].extend(block_bounds)
                    results["cells"].extend(cells)
        finally:
            processes.stop_all()
            topology.teardown()
    results["meta"]["loadavg_end"] = os.getloadavg()
    return results


def run_block(config: BenchConfig, topology: Topology, processes: Processes, model: str, link: LinkSpec,
              probed: dict, workdir: Path, progress: Progress) -> tuple[list[dict], list[dict]]:
    """The compute bound and every method of one model on one link, ``config.repeats`` times over.

    The machine is shared and its load drifts, so the bound is measured next to the cells it
    bounds, and with repeats the rounds are interleaved (bound, m1, m2, ..., bound, m1, ...) and
    each figure is the best round's: the estimate least disturbed by other users, taken the
    same way for the bound and for every method.
    """
    modules = list(dict.fromkeys(worker_module(parse_method(m)) for m in config.methods))  # a bound per framework
    bounds, rounds = {module: [] for module in modules}, []
    for _ in range(config.repeats):
        for module in modules:
            bound = dict(compute_bound(config, processes, model, workdir, module), link=link.label)
            bounds[module].append(bound)
            say(config, f"compute bound {model} ({bound['framework']}) x{config.world_size}, batch "
                        f"{bound['batch_size']}: {bound['samples_per_s']:.2f} samples/s", progress)
        progress.update()
        rounds.append([run_one(config, topology, processes, model, link, method, probed,
                               bounds[worker_module(parse_method(method))][-1], workdir, progress)
                       for method in config.methods])
    best = {module: dict(max(tries, key=lambda b: b["samples_per_s"]), rounds=[b["samples_per_s"] for b in tries])
            for module, tries in bounds.items()}
    cells = [best_round([round_[i] for round_ in rounds], best[worker_module(parse_method(method))])
             for i, method in enumerate(config.methods)]
    return list(best.values()), cells


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


def run_cell(config: BenchConfig, topology: Topology, processes: Processes, model: str, method: str,
             workdir: Path) -> list[dict]:
    """One benchmark cell: ``world_size`` workers in their namespaces. Returns the ranks' records."""
    cell_dir = Path(tempfile.mkdtemp(prefix=f"{model}-{method}-", dir=workdir))

    def worker(rank: int) -> list[str]:
        return python_module(
            worker_module(parse_method(method)), "--model", model, "--method", method,
            "--batch-size", str(config.batch_sizes[model]), "--warmup", str(config.warmup),
            "--steps", str(config.steps), "--seed", str(config.seed), "--threads", str(config.threads),
            "--out", str(cell_dir / f"rank{rank}.json"))

    run_job(topology, processes, worker, cell_dir, config.cell_timeout_s, config.cycle_time_ms)
    return [json.loads((cell_dir / f"rank{rank}.json").read_text()) for rank in range(topology.world_size)]


def meta(config: BenchConfig) -> dict:
    return {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "config": asdict(config) | {
        "links": [asdict(link) | {"label": link.label} for link in config.links]},
        "cpu_count": os.cpu_count(), "loadavg_start": os.getloadavg(), "platform": platform.platform(),
        "python": platform.python_version(), "torch": torch.__version__, "horovod": horovod.__version__,
        "horovod_knobs": {k: v for k, v in os.environ.items() if k.startswith("HOROVOD_") and k not in RANK_VARIABLES}}
