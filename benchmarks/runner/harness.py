"""The benchmark run: links, probes, compute bounds, and one Horovod job per cell.

A cell is (model, link, method). For each link setting the harness shapes every rank's NIC,
probes each link with a TCP transfer, then for each model and method starts a rendezvous
server in the bridge namespace and one worker per rank in the rank's namespace, waits, and
reads the ranks' JSON. A failed cell is recorded with its reason; the run goes on. Whatever
happens (failure, Ctrl-C, SIGTERM), every namespace the run made is deleted on the way out.
"""

from __future__ import annotations

import fnmatch
import json
import os
import platform
import select
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import horovod
import torch

from benchmarks.common.methods import parse_method, worker_module
from benchmarks.links.links import LinkSpec, Loopback, Topology, delete_namespace, list_namespaces, stale_namespaces
from benchmarks.runner.rendezvous import slot_env, slot_plan
from example_support.progress import Progress
from pactrain_hvd.core.accounting import ring_allreduce_bytes

PROBE_PORT = 5201
SKIPPED = "skipped by --skip"
BATCH_SIZES = {"resnet18": 16, "vgg16": 32, "gpt": 4,  # ~1 s per step on one thread of this 2-core CPU
               "fashion-vgg": 64}  # the time-to-accuracy image workload's model and batch
# Variables the harness sets per rank; anything else HOROVOD_* (fusion, cycle time) passes through.
_RANK_VARIABLES = ("HOROVOD_GLOO_RENDEZVOUS_ADDR", "HOROVOD_GLOO_RENDEZVOUS_PORT", "HOROVOD_CONTROLLER",
                   "HOROVOD_CPU_OPERATIONS", "HOROVOD_GLOO_IFACE", "NCCL_SOCKET_IFNAME", "HOROVOD_HOSTNAME",
                   "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE",
                   "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_RANK")


# What a TensorFlow rank adds to its record (tf_worker.py): per rank 0, carried into the cell as they are.
_TF_FIGURES = ("framework", "phases_in_graph", "compute_s", "pack_unpack_s", "traces_first_call", "traces",
               "reduction_traces", "warmup_step_s")


@dataclass
class BenchConfig:
    models: list[str]
    methods: list[str]
    links: list[LinkSpec]
    world_size: int = 2
    warmup: int = 3
    steps: int = 10
    batch_sizes: dict[str, int] = field(default_factory=lambda: dict(BATCH_SIZES))
    seed: int = 0
    threads: int = 1
    probe_seconds: float = 2.0
    cell_timeout_s: float = 900.0
    repeats: int = 1  # interleaved rounds per (link, model); each figure is the best round's
    # HOROVOD_CYCLE_TIME for every rank of every cell (None: Horovod's 1 ms). At 1 ms Horovod's
    # background loop alone takes ~11 % of a core per idle worker on this 2-core machine, 4-7 % at 5 ms.
    cycle_time_ms: float | None = 5.0
    skip: list[str] = field(default_factory=list)  # "model/link/method" cells not to run (glob patterns)
    log: bool = True

    def skipped(self, model: str, link: str, method: str) -> bool:
        return any(fnmatch.fnmatchcase(f"{model}/{link}/{method}", pattern) for pattern in self.skip)

    def validate(self) -> None:
        for method in self.methods:
            parse_method(method)  # a bad name fails here, not in a worker
        unknown = [m for m in self.models if m not in self.batch_sizes]
        if unknown:
            raise ValueError(f"no batch size for model(s) {', '.join(unknown)}: pass --batch-size MODEL=N")
        if self.world_size < 2:
            raise ValueError(f"world_size must be >= 2 for a communication benchmark, got {self.world_size}")
        if self.repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {self.repeats}")
        if self.steps < 1 or self.warmup < 0:
            raise ValueError(f"need steps >= 1 and warmup >= 0, got steps={self.steps} warmup={self.warmup}")


def say(config: BenchConfig, message: str, progress: Progress | None = None) -> None:
    """A log line on stderr (above the progress bar, if one is drawn there)."""
    if not config.log:
        return
    line = f"[bench {time.strftime('%H:%M:%S')}] {message}"
    if progress is not None:
        progress.write(line)
    else:
        print(line, file=sys.stderr, flush=True)


def job_count(config: BenchConfig) -> int:
    """Jobs the run will start or skip: per link and model not wholly skipped, a bound and every method, per round."""
    blocks = sum(1 for link in config.links for model in config.models
                 if not all(config.skipped(model, link.label, method) for method in config.methods))
    return blocks * config.repeats * (1 + len(config.methods))


# -- processes ---------------------------------------------------------------------------------


@dataclass
class Processes:
    """Every child the harness started and has not reaped: ended by id on the way out."""

    running: list[subprocess.Popen] = field(default_factory=list)

    def start(self, command: list[str], **kwargs) -> subprocess.Popen:
        process = subprocess.Popen(command, start_new_session=True, **kwargs)
        self.running.append(process)
        return process

    def stop(self, process: subprocess.Popen, grace_s: float = 5.0) -> None:
        if process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(grace_s)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                process.wait()
        if process in self.running:
            self.running.remove(process)

    def stop_all(self) -> None:
        for process in list(self.running):
            self.stop(process, grace_s=2.0)


def python_module(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def in_namespace(namespace: str | None, command: list[str]) -> list[str]:
    """``command`` run inside ``namespace``; ``None`` (a ``Loopback`` topology) runs it here."""
    return command if namespace is None else ["ip", "netns", "exec", namespace, *command]


def read_line(process: subprocess.Popen, timeout_s: float) -> str:
    """The child's next stdout line, or ``TimeoutError`` naming the command."""
    ready, _, _ = select.select([process.stdout], [], [], timeout_s)
    if not ready:
        raise TimeoutError(f"no output from `{' '.join(map(str, process.args))}` within {timeout_s:.0f} s")
    return process.stdout.readline().strip()


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _RANK_VARIABLES}
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="2")
    return env


# -- probes and bounds -------------------------------------------------------------------------


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


def run_concurrently(processes: Processes, commands: list[list[str]], logs: list[Path], timeout_s: float,
                     what: str) -> None:
    """Every command at once on this machine (no namespace, no Horovod), each writing its own log; a
    failure raises ``RuntimeError`` naming ``what``, with the first log's tail."""
    files = [open(log, "w") for log in logs]
    try:
        started = [processes.start(command, stdout=file, stderr=subprocess.STDOUT, env=child_env())
                   for command, file in zip(commands, files)]
        failure = wait_all(started, processes, timeout_s)
    finally:
        for file in files:
            file.close()
    if failure:
        raise RuntimeError(f"{what} failed: {failure}\n{tail(logs[0])}")


# -- cells -------------------------------------------------------------------------------------


def tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def wait_all(workers: list[subprocess.Popen], processes: Processes, timeout_s: float) -> str | None:
    """Wait for every worker; on the first failure or the timeout, stop the rest. Returns why, or None."""
    deadline = time.monotonic() + timeout_s
    while True:
        codes = [w.poll() for w in workers]
        failed = [i for i, code in enumerate(codes) if code not in (None, 0)]
        if failed or time.monotonic() > deadline:
            for worker in workers:
                processes.stop(worker)
            return (f"rank {failed[0]} exited with {codes[failed[0]]}" if failed
                    else f"timed out after {timeout_s:.0f} s")
        if all(code == 0 for code in codes):
            for worker in workers:
                processes.running.remove(worker)
            return None
        time.sleep(0.2)


def start_rendezvous(topology: Topology | Loopback, processes: Processes) -> tuple[subprocess.Popen, int]:
    server = processes.start(in_namespace(topology.bridge_namespace, python_module(
        "benchmarks.runner.rendezvous", "--size", str(topology.world_size))),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())
    line = read_line(server, 120)
    if not line:
        raise RuntimeError(f"rendezvous server did not start: {server.stderr.read()}")
    return server, int(json.loads(line)["port"])


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def rank_env(topology: Topology | Loopback, rank: int, port: int, cycle_time_ms: float | None = None,
             master_port: int = 0) -> dict[str, str]:
    """Horovod's Gloo rendezvous and NIC for ``rank``, and torch.distributed's (the DDP methods: rank 0's address)."""
    env = child_env()
    if cycle_time_ms is not None:
        env["HOROVOD_CYCLE_TIME"] = f"{cycle_time_ms:g}"
    device = topology.worker_device(rank)
    env.update(HOROVOD_GLOO_RENDEZVOUS_ADDR=topology.bridge_address, HOROVOD_GLOO_RENDEZVOUS_PORT=str(port),
               HOROVOD_CONTROLLER="gloo", HOROVOD_CPU_OPERATIONS="gloo", HOROVOD_GLOO_IFACE=device,
               NCCL_SOCKET_IFNAME=device, **slot_env(slot_plan(topology.world_size)[rank]),
               MASTER_ADDR=topology.worker_address(0), MASTER_PORT=str(master_port), GLOO_SOCKET_IFNAME=device)
    return env


def run_job(topology: Topology | Loopback, processes: Processes, command: Callable[[int], list[str]], logdir: Path,
            timeout_s: float, cycle_time_ms: float | None = None, show_rank: int | None = None) -> None:
    """One Horovod job: ``command(rank)`` for every rank in its namespace, with its own Gloo rendezvous.

    Each rank's output goes to ``logdir/rank<r>.log``, but ``show_rank``'s to this process's
    stdout and stderr. A failure raises ``RuntimeError`` with the tails of the logs.
    """
    server, port = start_rendezvous(topology, processes)
    master_port = free_port()  # free here, and so in a fresh namespace too
    logs = [None if rank == show_rank else open(logdir / f"rank{rank}.log", "w") for rank in range(topology.world_size)]
    try:
        workers = [processes.start(in_namespace(topology.worker_namespace(rank), command(rank)),
                                   stdout=logs[rank], stderr=subprocess.STDOUT if logs[rank] else None,
                                   env=rank_env(topology, rank, port, cycle_time_ms, master_port))
                   for rank in range(topology.world_size)]
        failure = wait_all(workers, processes, timeout_s)
    finally:
        for log in logs:
            if log:
                log.close()
        server.stdin.close()
        processes.stop(server)
    if failure:
        logs_tail = "\n".join(f"--- rank {rank} log:\n{tail(logdir / f'rank{rank}.log', 12)}"
                              for rank in range(topology.world_size) if rank != show_rank)
        raise RuntimeError(f"{failure}\n{logs_tail}")


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


def summarize_cell(ranks: list[dict], link: dict, bound: dict) -> dict:
    """The figures of one cell, from the ranks' records (see the README for each column)."""
    size, batch = ranks[0]["size"], ranks[0]["batch_size"]
    steps = len(ranks[0]["steps"])
    step_s = [max(r["steps"][i]["total"] for r in ranks) for i in range(steps)]  # a step ends when the last rank's does
    median_step = statistics.median(step_s)
    phases = {phase: statistics.mean(statistics.median(s[phase] for s in r["steps"]) for r in ranks)
              for phase in ("compute", "compress", "comm_wait", "update")}
    payload = ranks[0]["payload"]
    ideal_bytes = ring_allreduce_bytes(payload["allreduce_bytes"], size) + (size - 1) * payload["allgather_bytes"]
    tx = statistics.mean(r["nic"]["tx_bytes"] for r in ranks) / steps
    control_tx = statistics.mean(r["control_tx_bytes_per_s"] for r in ranks) * statistics.mean(step_s)
    rx = statistics.mean(r["nic"]["rx_bytes"] for r in ranks) / steps
    rate_bytes = link["mbit_per_s"] * 1e6 / 8
    samples = size * batch / median_step
    return {
        "samples_per_s": samples, "step_s": median_step, "step_s_all": step_s, "phases_s": phases,
        "payload": payload, "ideal_ring_bytes_per_worker": ideal_bytes, "ideal_wire_s": ideal_bytes / rate_bytes,
        "wire_tx_bytes_per_step": tx, "wire_rx_bytes_per_step": rx,
        "wire_tx_bytes_per_rank": [r["nic"]["tx_bytes"] / steps for r in ranks],
        "wire_over_ideal": tx / ideal_bytes if ideal_bytes else None,
        "control_tx_bytes_per_step": control_tx, "data_over_ideal": (tx - control_tx) / ideal_bytes if ideal_bytes else None,
        "counter_wire_s": tx / rate_bytes,
        "bound_samples_per_s": bound["samples_per_s"], "ratio_to_bound": samples / bound["samples_per_s"],
        "loss_first": ranks[0]["losses"][0], "loss_last": ranks[0]["losses"][-1],
        "pactrain_stats": ranks[0].get("pactrain_stats"), "comm_in_backward": ranks[0].get("comm_in_backward", False),
        **{key: ranks[0][key] for key in _TF_FIGURES if key in ranks[0]},
    }


# -- the run -----------------------------------------------------------------------------------


@contextmanager
def cleanup_on_signals() -> Iterator[None]:
    """SIGTERM/SIGHUP become exceptions, so ``finally`` blocks (teardown) run; Ctrl-C already does."""
    def to_exit(signum, _frame):
        raise SystemExit(128 + signum)

    previous = {sig: signal.signal(sig, to_exit) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


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


def best_round(tries: list[dict], bound: dict) -> dict:
    """The try with the highest throughput (or the last failure), against the best bound."""
    ran = [cell for cell in tries if "error" not in cell]
    if not ran:
        return tries[-1]
    best = dict(max(ran, key=lambda cell: cell["samples_per_s"]))
    best.update(rounds=[cell.get("samples_per_s") for cell in tries], bound_samples_per_s=bound["samples_per_s"],
                ratio_to_bound=best["samples_per_s"] / bound["samples_per_s"])
    return best


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


def meta(config: BenchConfig) -> dict:
    return {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "config": asdict(config) | {
        "links": [asdict(link) | {"label": link.label} for link in config.links]},
        "cpu_count": os.cpu_count(), "loadavg_start": os.getloadavg(), "platform": platform.platform(),
        "python": platform.python_version(), "torch": torch.__version__, "horovod": horovod.__version__,
        "horovod_knobs": {k: v for k, v in os.environ.items() if k.startswith("HOROVOD_") and k not in _RANK_VARIABLES}}
