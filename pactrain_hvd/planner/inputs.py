"""What ``pactrain-plan`` reads from its command line: link rates with their units, shapes, compression times,
glob patterns (``cli.py`` builds the parser around them)."""

from __future__ import annotations

import argparse
import math
import re

DEFAULT_LATENCY_MS = 0.01  # one way per hop, a LAN's
PREFIXES = {"": 1.0, "k": 1e3, "K": 1e3, "m": 1e6, "M": 1e6, "g": 1e9, "G": 1e9, "t": 1e12, "T": 1e12}
LINK_FORMS = ("bits: 10gbit, 100mbit, 1.5Gbps, 100Mb/s, 100 Mbit/s; bytes (x8): 1GB/s, 10GBps, 100MB/s, 500kB/s, "
              "2 GByte/s")
# b / bit(s) are bits and B / byte(s) bytes, each with an optional /s or ps; the prefix's case does not matter
_RATE = re.compile(r"\s*(\d*\.?\d+)\s*([kKmMgGtT]?)((?i:bits?|bytes?)|b|B)(?:/s|ps)?\s*")


def parameter_count(count: int) -> str:
    return f"{count / 1e6:.2f} M parameters" if count >= 10_000 else f"{count:,} parameters"


def link_bits_per_s(text: str) -> float:
    """``"10gbit"``, ``"1.5Gbps"``, ``"100 Mbit/s"`` (bits) or ``"1GB/s"``, ``"10GBps"`` (bytes, x8) -> bits per
    second. A lower-case ``b`` is a bit and an upper-case ``B`` a byte; text that says neither is refused."""
    match = _RATE.fullmatch(str(text))
    if not match or float(match.group(1)) <= 0:
        raise ValueError(f"--link {text!r}: give a rate > 0 with its unit, {LINK_FORMS}")
    unit = match.group(3)
    per_unit = 8 if unit == "B" or unit.lower().startswith("byte") else 1
    return float(match.group(1)) * PREFIXES[match.group(2)] * per_unit


def shape_argument(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(part) for part in text.replace("x", ",").split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of sizes, e.g. 3,224,224") from None
    if not shape or min(shape) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: sizes must be >= 1, e.g. 3,224,224")
    return shape


def compress_times(items: list[str]) -> dict[str, float]:
    out = {}
    for item in items:
        kind, _, seconds = item.partition("=")
        if kind not in ("fp16", "topk", "powersgd", "pactrain") or not seconds:
            raise ValueError(f"--compress-time {item!r}: give KIND=SECONDS, KIND one of fp16, topk, powersgd, pactrain")
        try:
            value = float(seconds)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"--compress-time {item!r}: SECONDS must be a finite number >= 0, got {seconds!r}")
        out[kind] = value
    return out


def prunable_patterns(text: str | None) -> list[str] | None:
    if text is None:
        return None
    patterns = [part.strip() for part in text.split(",") if part.strip()]
    if not patterns:
        raise ValueError(f"--prunable {text!r}: give glob patterns of parameter names, e.g. 'encoder.*,classifier.*'")
    return patterns
