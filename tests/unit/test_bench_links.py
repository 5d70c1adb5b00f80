"""Link specs, tc commands and namespace naming of the benchmark (no namespace is created here)."""

import os
import subprocess

import pytest

from benchmarks.links.links import (
    LinkSpec,
    Topology,
    delay_commands,
    parse_link,
    shaping_commands,
    stale_namespaces,
    tbf_burst_bytes,
)


@pytest.mark.parametrize("text, rate, label", [
    ("100mbit", 100.0, "100mbit"), ("1gbit", 1000.0, "1gbit"), ("2.5gbit", 2500.0, "2500mbit"),
    ("500kbit", 0.5, "0.5mbit"), ("unthrottled", None, "unthrottled"), ("none", None, "unthrottled"),
])
def test_parse_link(text, rate, label):
    link = parse_link(text)
    assert link.rate_mbit == rate
    assert link.label == label


@pytest.mark.parametrize("text", ["100", "fast", "0mbit", "100mbps"])
def test_parse_link_rejects(text):
    with pytest.raises(ValueError, match="bandwidth"):
        parse_link(text)


def test_label_names_the_delay():
    assert parse_link("100mbit", delay_ms=2).label == "100mbit+2ms"


def test_tbf_burst_is_two_milliseconds_of_traffic_at_least_32_kib():
    assert tbf_burst_bytes(100) == 32 * 1024  # 25 kB at 100 Mbit/s
    assert tbf_burst_bytes(1000) == 250_000


def test_shaping_commands_tbf_only():
    commands = shaping_commands("ns", "dev0", LinkSpec(100.0))
    assert commands[0] == ["tc", "-n", "ns", "qdisc", "del", "dev", "dev0", "root"]
    assert commands[1] == ["tc", "-n", "ns", "qdisc", "add", "dev", "dev0", "root", "tbf", "rate", "100mbit",
                           "burst", "32768", "latency", "50ms"]
    assert len(commands) == 2


def test_a_delay_is_not_a_qdisc_but_a_queue_on_the_receiving_side():
    """No sch_netem in this kernel: tc keeps the rate, an NFQUEUE rule on INPUT and ``delay.py`` the delay."""
    commands = shaping_commands("ns", "dev0", LinkSpec(1000.0, delay_ms=1.5))
    assert len(commands) == 2 and "tbf" in commands[1] and "netem" not in commands[1]
    rule, program = delay_commands("ns", "dev0", 1.5)
    assert rule[4:] == ["iptables-legacy", "-A", "INPUT", "-i", "dev0", "-j", "NFQUEUE", "--queue-num", "0"]
    assert program[:4] == ["ip", "netns", "exec", "ns"] and program[-4:] == ["-m", "benchmarks.links.delay", "--delay-ms", "1.5"]


def test_unthrottled_only_clears_the_qdisc():
    assert len(shaping_commands("ns", "dev0", LinkSpec(None))) == 1


def test_topology_names_and_private_addresses():
    topology = Topology(world_size=3, prefix="ptb-1-")
    assert topology.bridge_namespace == "ptb-1-br"
    assert [topology.worker_namespace(r) for r in range(3)] == ["ptb-1-w0", "ptb-1-w1", "ptb-1-w2"]
    assert [topology.worker_address(r) for r in range(3)] == ["10.77.0.1", "10.77.0.2", "10.77.0.3"]
    assert topology.bridge_address == "10.77.0.254"
    assert all(len(topology.worker_device(r)) <= 15 for r in range(3))  # IFNAMSIZ
    assert Topology(world_size=2).prefix == f"ptb-{os.getpid()}-"


def test_topology_rejects_world_sizes_the_subnet_cannot_hold():
    with pytest.raises(ValueError, match="world_size"):
        Topology(world_size=254)


def test_stale_namespaces_are_those_of_dead_harnesses():
    dead = subprocess.Popen(["true"])
    dead.wait()
    names = [f"ptb-{os.getpid()}-br", f"ptb-{dead.pid}-w0", "ptb-notapid-w0", "other-ns"]
    assert stale_namespaces(names) == [f"ptb-{dead.pid}-w0"]
