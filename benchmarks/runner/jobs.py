"""One Horovod job: its Gloo rendezvous server, each rank's environment, and a worker per rank in its namespace."""

from __future__ import annotations

import json
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path

from benchmarks.links.links import Loopback, Topology, in_namespace
from benchmarks.runner.processes import Processes, child_env, python_module, read_line, tail, wait_all
from benchmarks.runner.rendezvous import slot_env, slot_plan


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
