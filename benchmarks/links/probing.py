"""Link-rate probes, from the run: ``probe.py``'s sink in one rank's namespace, its sender in the previous rank's."""

from __future__ import annotations

import json
import subprocess

from benchmarks.links.links import Topology, in_namespace
from benchmarks.runner.processes import Processes, child_env, python_module, read_line

PROBE_PORT = 5201
ECHO_PORT = 5202


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


def probe_round_trip(topology: Topology, processes: Processes) -> float:
    """Median TCP round trip (ms) of one-byte messages from rank 0 to rank 1, on the idle emulated links."""
    address = topology.worker_address(1)
    server = processes.start(in_namespace(topology.worker_namespace(1), python_module(
        "benchmarks.links.probe", "echo", "--host", address, "--port", str(ECHO_PORT))),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())
    try:
        if read_line(server, 30) != "ready":
            raise RuntimeError(f"echo server in {topology.worker_namespace(1)} did not start: {server.stderr.read()}")
        pinger = subprocess.run(in_namespace(topology.worker_namespace(0), python_module(
            "benchmarks.links.probe", "ping", "--host", address, "--port", str(ECHO_PORT))),
            capture_output=True, text=True, env=child_env(), timeout=120)
        if pinger.returncode != 0:
            raise RuntimeError(f"ping from {topology.worker_namespace(0)} failed: {pinger.stderr.strip()}")
        return json.loads(pinger.stdout)["rtt_ms"]
    finally:
        processes.stop(server)
