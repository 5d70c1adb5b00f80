"""Link-rate probes, from the run: ``probe.py``'s sink in one rank's namespace, its sender in the previous rank's."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

from benchmarks.links.links import Topology, in_namespace
from benchmarks.runner.processes import Processes, child_env, python_module, read_line

PROBE_PORT = 5201
ECHO_PORT = 5202


@contextmanager
def probe_pair(topology: Topology, processes: Processes, roles: tuple[str, str], server_rank: int, client_rank: int,
               port: int, *client_args: str, timeout_s: float = 120.0) -> Iterator[tuple[subprocess.Popen, str]]:
    """``probe.py``'s server role in ``server_rank``'s namespace, then its client role in ``client_rank``'s against
    it; yields the running server and what the client printed, and stops the server after."""
    server_role, client_role = roles
    address = topology.worker_address(server_rank)
    server = processes.start(
        in_namespace(topology.worker_namespace(server_rank), python_module(
            "benchmarks.links.probe", server_role, "--host", address, "--port", str(port))),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())
    try:
        if read_line(server, 30) != "ready":
            raise RuntimeError(f"probe {server_role} in {topology.worker_namespace(server_rank)} did not start: "
                               f"{server.stderr.read()}")
        client = subprocess.run(in_namespace(topology.worker_namespace(client_rank), python_module(
            "benchmarks.links.probe", client_role, "--host", address, "--port", str(port), *client_args)),
            capture_output=True, text=True, env=child_env(), timeout=timeout_s)
        if client.returncode != 0:
            raise RuntimeError(f"probe {client_role} in {topology.worker_namespace(client_rank)} failed: "
                               f"{client.stderr.strip()}")
        yield server, client.stdout
    finally:
        processes.stop(server)


def probe_link(topology: Topology, processes: Processes, rank: int, seconds: float) -> dict:
    """TCP from ``rank`` to the next rank: both NICs are shaped, so this is one rank's link rate."""
    peer = (rank + 1) % topology.world_size
    with probe_pair(topology, processes, ("serve", "send"), peer, rank, PROBE_PORT, "--seconds", str(seconds),
                    timeout_s=seconds + 60) as (sink, _):
        result = json.loads(read_line(sink, 60))
        sink.wait(10)
    return {"rank": rank, "peer": peer, **result}


def probe_links(topology: Topology, processes: Processes, seconds: float) -> dict:
    probes = [probe_link(topology, processes, rank, seconds) for rank in range(topology.world_size)]
    return {"probes": probes, "mbit_per_s": min(p["mbit_per_s"] for p in probes),
            "qdisc": topology.qdiscs(0)}


def probe_round_trip(topology: Topology, processes: Processes) -> float:
    """Median TCP round trip (ms) of one-byte messages from rank 0 to rank 1, on the idle emulated links."""
    with probe_pair(topology, processes, ("echo", "ping"), 1, 0, ECHO_PORT) as (_, printed):
        return json.loads(printed)["rtt_ms"]
