"""Mask fingerprints: a few int64 words per tensor that ranks exchange to prove masks agree."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from pactrain_hvd.core.errors import MaskMismatchError

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX = np.uint64(0xBF58476D1CE4E5B9)


def mask_fingerprint(mask: np.ndarray) -> tuple[int, int]:
    """(surviving count, order-free hash of the surviving flat positions).

    Masks with the same count at different positions get different hashes
    (splitmix64-style mixing of each position, summed mod 2**64).
    """
    positions = np.flatnonzero(np.asarray(mask).ravel()).astype(np.uint64)
    with np.errstate(over="ignore"):
        mixed = (positions + np.uint64(1)) * _GOLDEN
        mixed ^= mixed >> np.uint64(31)
        mixed *= _MIX
        mixed ^= mixed >> np.uint64(29)
        digest = int(mixed.sum(dtype=np.uint64))
    return int(positions.size), digest - (1 << 64) if digest >= 1 << 63 else digest


def describe_mismatches(names: Sequence[str], gathered: np.ndarray) -> list[str]:
    """Given fingerprints of every rank, shape (world, len(names), 2), list disagreements."""
    problems = []
    for index, name in enumerate(names):
        per_rank = [tuple(int(x) for x in gathered[rank, index]) for rank in range(gathered.shape[0])]
        reference = per_rank[0]
        odd = [rank for rank, fp in enumerate(per_rank) if fp != reference]
        if odd:
            counts = ", ".join(f"rank {r}: {fp[0]} kept" for r, fp in enumerate(per_rank))
            problems.append(f"{name!r}: ranks {odd} differ from rank 0 ({counts})")
    return problems


def fingerprint_table(masks: Mapping[str, np.ndarray]) -> tuple[list[str], np.ndarray]:
    """Sorted names and their fingerprints, shape (len(names), 2); one dummy row when empty."""
    names = sorted(masks)
    rows = [mask_fingerprint(masks[name]) for name in names] or [(0, 0)]
    return names, np.array(rows, dtype=np.int64)


def check_fingerprints(names: Sequence[str], gathered: np.ndarray, world_size: int, hint: str) -> None:
    """Raise ``MaskMismatchError`` (on every rank: all see the same ``gathered``) on disagreement."""
    problems = describe_mismatches(names, np.asarray(gathered).reshape(world_size, -1, 2))
    if problems:
        raise MaskMismatchError("pruning masks differ across ranks: " + "; ".join(problems) + ". " + hint)
