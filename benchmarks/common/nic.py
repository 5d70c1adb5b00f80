"""A network device's kernel byte counters in this process's namespace (no framework import)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path


def nic_counters(device: str) -> dict[str, int]:
    """Kernel counters of ``device`` in this process's namespace (all bytes, headers included)."""
    base = Path("/sys/class/net") / device / "statistics"
    return {name: int((base / name).read_text()) for name in ("tx_bytes", "rx_bytes", "tx_packets", "rx_packets")}


def counter_delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {name: after[name] - before[name] for name in before}


def tx_bytes(device: str) -> int:
    return int((Path("/sys/class/net") / device / "statistics" / "tx_bytes").read_text())


def tx_counter(device: str) -> Callable[[], int]:
    """Reads ``device``'s transmitted bytes; reads 0 where this namespace has no such device (a loopback run)."""
    if device and (Path("/sys/class/net") / device).exists():
        return lambda: tx_bytes(device)
    return lambda: 0
