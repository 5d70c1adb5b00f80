"""Emulated NICs: a network namespace per rank, a veth pair into a bridge namespace, tbf shaping.

Topology (``prefix`` = ``ptb-<harness pid>-``)::

    ns <prefix>w0: ptbw0 10.77.0.1/24 --veth-- ptbb0 ┐
    ns <prefix>w1: ptbw1 10.77.0.2/24 --veth-- ptbb1 ┼ bridge ptbbr 10.77.0.254/24 in ns <prefix>br
    ...                                              ┘

Each rank has its own full-duplex "NIC": a token bucket (tbf) on the worker end shapes what it
sends, another on the bridge end shapes what it receives; a delay, where asked, holds what it receives
(``delay.py``, an NFQUEUE program: this kernel has no ``sch_netem``). Everything lives in namespaces this
module creates, with private addresses, and ``Topology.teardown`` deletes them all (deleting a
namespace deletes its veth ends and the bridge). Requires root (CAP_NET_ADMIN) and iproute2.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

SUBNET = "10.77.0"
BRIDGE_HOST = 254
BRIDGE = "ptbbr"
NAME_ROOT = "ptb-"
# Queue at most this long in the token bucket before dropping (tbf ``latency``).
TBF_LATENCY_MS = 50
# ``ip netns exec NS`` bind-mounts the files of /etc/netns/NS over /etc for the command it runs.
NETNS_ETC = Path("/etc/netns")


class LinkError(RuntimeError):
    """A namespace, link or qdisc command failed (message names the command and its stderr)."""


@dataclass(frozen=True)
class LinkSpec:
    """One bandwidth setting: ``rate_mbit=None`` is unthrottled (same topology, no qdisc)."""

    rate_mbit: float | None
    delay_ms: float = 0.0

    @property
    def label(self) -> str:
        if self.rate_mbit is None:
            name = "unthrottled"
        elif self.rate_mbit >= 1000 and self.rate_mbit % 1000 == 0:
            name = f"{self.rate_mbit / 1000:g}gbit"
        else:
            name = f"{self.rate_mbit:g}mbit"
        return f"{name}+{self.delay_ms:g}ms" if self.delay_ms else name


def parse_link(text: str, delay_ms: float = 0.0) -> LinkSpec:
    """``100mbit``, ``1gbit``, ``2.5gbit``, ``unthrottled`` (or ``none``) -> ``LinkSpec``."""
    value = text.strip().lower()
    if value in ("unthrottled", "none", "inf"):
        return LinkSpec(None, delay_ms)
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(k|m|g)bit", value)
    if not match:
        raise ValueError(f"bandwidth {text!r} is not understood: use e.g. 100mbit, 1gbit or unthrottled")
    rate_mbit = float(match.group(1)) * {"k": 1e-3, "m": 1.0, "g": 1e3}[match.group(2)]
    if rate_mbit <= 0:
        raise ValueError(f"bandwidth {text!r} must be positive")
    return LinkSpec(rate_mbit, delay_ms)


def tbf_burst_bytes(rate_mbit: float) -> int:
    """Bucket size: 2 ms of traffic, at least 32 KiB.

    Small buckets starve fast links (each refill is one timer tick); large ones let a sender
    run far above the rate for a while. 2 ms keeps the error under 1 % of a 0.2 s step.
    """
    return max(32 * 1024, int(rate_mbit * 1e6 / 8 * 0.002))


def shaping_commands(namespace: str, device: str, link: LinkSpec) -> list[list[str]]:
    """``tc`` commands that give ``device`` (in ``namespace``) the link's egress rate, from scratch (its delay is
    ``delay_commands``')."""
    commands = [["tc", "-n", namespace, "qdisc", "del", "dev", device, "root"]]  # may fail: nothing there
    if link.rate_mbit is None:
        return commands
    commands.append(["tc", "-n", namespace, "qdisc", "add", "dev", device, "root", "tbf", "rate",
                     f"{link.rate_mbit:g}mbit", "burst", str(tbf_burst_bytes(link.rate_mbit)),
                     "latency", f"{TBF_LATENCY_MS}ms"])
    return commands


def delay_commands(namespace: str, device: str, delay_ms: float) -> tuple[list[str], list[str]]:
    """The firewall rule that queues what ``device`` receives, and the program that releases it ``delay_ms`` later.

    The delay sits on the receiving side, after the packet has left its sender's namespace: a packet held in
    the sender's own stack would count against TCP's small-queue limit and cut the rate (a 20 ms hold there
    gives 2 Mbit/s of 10); here the sender has already let it go, as it has on a real long link.
    """
    rule = ["ip", "netns", "exec", namespace, "iptables-legacy", "-A", "INPUT", "-i", device, "-j", "NFQUEUE",
            "--queue-num", "0"]
    program = ["ip", "netns", "exec", namespace, sys.executable, "-m", "benchmarks.links.delay",
               "--delay-ms", f"{delay_ms:g}"]
    return rule, program


def run(command: list[str], check: bool = True) -> subprocess.CompletedProcess:
    """Run one ip/tc command; on failure raise ``LinkError`` with the command and its stderr."""
    completed = subprocess.run(command, capture_output=True, text=True)
    if check and completed.returncode != 0:
        raise LinkError(f"`{' '.join(command)}` failed ({completed.returncode}): {completed.stderr.strip()}")
    return completed


def list_namespaces() -> list[str]:
    completed = run(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in completed.stdout.splitlines() if line.strip()]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stale_namespaces(names: list[str]) -> list[str]:
    """``ptb-<pid>-*`` namespaces whose harness process is gone (left by a killed run)."""
    stale = []
    for name in names:
        match = re.fullmatch(rf"{NAME_ROOT}(\d+)-\w+", name)
        if match and not _pid_alive(int(match.group(1))):
            stale.append(name)
    return stale


def delete_namespace(name: str) -> None:
    """Kill what still runs in the namespace (only our workers and probes can), then delete it
    and its /etc/netns/<name> files."""
    pids = run(["ip", "netns", "pids", name], check=False).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    run(["ip", "netns", "del", name], check=False)
    shutil.rmtree(NETNS_ETC / name, ignore_errors=True)
    try:
        NETNS_ETC.rmdir()  # only if nothing else (another run, the admin) keeps files there
    except OSError:
        pass


def remove_stale_namespaces() -> list[str]:
    """Delete the namespaces of dead runs (``stale_namespaces``); returns their names."""
    stale = stale_namespaces(list_namespaces())
    for name in stale:
        delete_namespace(name)
    return stale


def in_namespace(namespace: str | None, command: list[str]) -> list[str]:
    """``command`` run inside ``namespace``; ``None`` (a ``Loopback`` topology) runs it here."""
    return command if namespace is None else ["ip", "netns", "exec", namespace, *command]


def write_hosts_file(namespace: str, address: str) -> Path:
    """Make this machine's hostname resolve to ``address`` for commands run by ``ip netns exec``.

    Horovod 0.28.1 gives ``HOROVOD_GLOO_IFACE`` to its global Gloo context only: the context of
    each process set (``GlooContext::InitializeForProcessSet``, the global set included) is
    built with an empty interface, so Gloo binds to whatever the hostname resolves to, which
    is 127.0.0.1 here. Resolved per namespace to the rank's own address, every context uses
    the emulated NIC.
    """
    directory = NETNS_ETC / namespace
    directory.mkdir(parents=True, exist_ok=True)
    hosts = directory / "hosts"
    hosts.write_text(f"127.0.0.1 localhost\n{address} {socket.gethostname()}\n")
    return hosts


def namespaces_unavailable() -> str | None:
    """Why this machine cannot emulate links (not root, no iproute2, ``ip netns add`` refused), or None."""
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "needs iproute2 (ip, tc)"
    probe = f"{NAME_ROOT}{os.getpid()}-probe"
    added = run(["ip", "netns", "add", probe], check=False)
    if added.returncode != 0:
        return f"`ip netns add` fails here: {added.stderr.strip()}"
    delete_namespace(probe)
    return None


@dataclass
class Loopback:
    """Every rank on this machine's loopback, unshaped: ``Topology``'s interface without root.

    No rank has a NIC of its own, so there are no per-rank counters.
    """

    world_size: int
    bridge_namespace = None
    bridge_address = "127.0.0.1"

    def worker_namespace(self, rank: int) -> None:
        return None

    def worker_device(self, rank: int) -> str:
        return "lo"

    def worker_address(self, rank: int) -> str:
        return "127.0.0.1"


@dataclass
class Topology:
    """The namespaces, links and addresses of one benchmark run, and what has been created so far.

    Example::

        >>> topology = Topology(world_size=2)
        >>> try:
        ...     topology.create(); topology.shape(parse_link("100mbit"))
        ... finally:
        ...     topology.teardown()
    """

    world_size: int
    prefix: str = field(default_factory=lambda: f"{NAME_ROOT}{os.getpid()}-")
    created: list[str] = field(default_factory=list)
    delays: list[subprocess.Popen] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not 1 <= self.world_size < BRIDGE_HOST:
            raise ValueError(f"world_size must be between 1 and {BRIDGE_HOST - 1}, got {self.world_size}")

    @property
    def bridge_namespace(self) -> str:
        return f"{self.prefix}br"

    @property
    def bridge_address(self) -> str:
        return f"{SUBNET}.{BRIDGE_HOST}"

    def worker_namespace(self, rank: int) -> str:
        return f"{self.prefix}w{rank}"

    def worker_device(self, rank: int) -> str:
        """The worker's NIC, as seen inside its namespace (``HOROVOD_GLOO_IFACE``)."""
        return f"ptbw{rank}"

    def bridge_port(self, rank: int) -> str:
        return f"ptbb{rank}"

    def worker_address(self, rank: int) -> str:
        return f"{SUBNET}.{rank + 1}"

    def _add_namespace(self, name: str) -> None:
        run(["ip", "netns", "add", name])
        self.created.append(name)
        run(["ip", "-n", name, "link", "set", "lo", "up"])

    def create(self) -> None:
        """Bridge namespace, then one namespace + veth pair per rank; addresses; links up."""
        bridge_ns = self.bridge_namespace
        self._add_namespace(bridge_ns)
        run(["ip", "-n", bridge_ns, "link", "add", BRIDGE, "type", "bridge"])
        run(["ip", "-n", bridge_ns, "addr", "add", f"{self.bridge_address}/24", "dev", BRIDGE])
        run(["ip", "-n", bridge_ns, "link", "set", BRIDGE, "up"])
        for rank in range(self.world_size):
            worker_ns, device, port = self.worker_namespace(rank), self.worker_device(rank), self.bridge_port(rank)
            self._add_namespace(worker_ns)
            run(["ip", "-n", worker_ns, "link", "add", device, "type", "veth", "peer", "name", port, "netns", bridge_ns])
            run(["ip", "-n", bridge_ns, "link", "set", port, "master", BRIDGE])
            run(["ip", "-n", bridge_ns, "link", "set", port, "up"])
            run(["ip", "-n", worker_ns, "addr", "add", f"{self.worker_address(rank)}/24", "dev", device])
            run(["ip", "-n", worker_ns, "link", "set", device, "up"])
            write_hosts_file(worker_ns, self.worker_address(rank))

    def shape(self, link: LinkSpec) -> None:
        """Give every rank's NIC the link: tbf on its egress (worker end) and ingress (bridge end)."""
        for rank in range(self.world_size):
            for namespace, device in ((self.worker_namespace(rank), self.worker_device(rank)),
                                      (self.bridge_namespace, self.bridge_port(rank))):
                delete, *adds = shaping_commands(namespace, device, link)
                run(delete, check=False)
                for command in adds:
                    run(command)
        if link.delay_ms:
            self.delay(link.delay_ms)

    def delay(self, delay_ms: float) -> None:
        """Hold every packet a rank's NIC receives for ``delay_ms``: two ranks then see twice that round trip."""
        if shutil.which("iptables-legacy") is None:
            raise LinkError("a link delay needs iptables-legacy (Debian package iptables): this kernel has no sch_netem")
        for rank in range(self.world_size):
            rule, program = delay_commands(self.worker_namespace(rank), self.worker_device(rank), delay_ms)
            run(rule)
            process = subprocess.Popen(program, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                       cwd=Path(__file__).resolve().parents[2])
            self.delays.append(process)
            if process.stdout.readline().strip() != "ready":
                raise LinkError(f"the delay program in {self.worker_namespace(rank)} did not start: "
                                f"{process.stderr.read().strip()}")

    def qdiscs(self, rank: int) -> str:
        """``tc qdisc show`` of the rank's NIC, for the results file."""
        return run(["tc", "-n", self.worker_namespace(rank), "qdisc", "show", "dev", self.worker_device(rank)]).stdout.strip()

    def counters(self, rank: int) -> dict[str, int]:
        """tx/rx bytes and packets of the rank's NIC (kernel counters, not self-reported)."""
        out = run(["ip", "-n", self.worker_namespace(rank), "-j", "-s", "link", "show", self.worker_device(rank)]).stdout
        stats = json.loads(out)[0]["stats64"]
        return {"tx_bytes": stats["tx"]["bytes"], "rx_bytes": stats["rx"]["bytes"],
                "tx_packets": stats["tx"]["packets"], "rx_packets": stats["rx"]["packets"]}

    def teardown(self) -> None:
        """Delete every namespace this topology created (workers first); safe to call twice."""
        while self.delays:
            process = self.delays.pop()
            process.kill()
            process.wait()
        while self.created:
            delete_namespace(self.created.pop())
