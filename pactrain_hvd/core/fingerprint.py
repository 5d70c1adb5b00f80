"""Mask Tracker fingerprints: a few int64 words per prunable tensor that ranks exchange to prove they agree.

One table per rank: a header row ``(number of prunable tensors, hash of their names, schedule
step)``, a row ``(number of settings, 0, 0)``, one fixed row per prunable name ``(surviving count,
position hash, weight digest)`` (count -1: the weights were not finite at a mask update), then the
settings' rows (``core.agreement``).
A tensor without a mask and a tensor whose mask keeps everything have the same row, so the table's
shape depends only on the names, never on which masks a rank happens to hold. Ranks allgather
their tables (Horovod concatenates tables of any length) and every rank parses the same bytes, so
every disagreement is the same ``MaskMismatchError`` on every rank.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping, Sequence

import numpy as np

from pactrain_hvd.core.agreement import Setting, check_settings, settings_rows
from pactrain_hvd.core.errors import MaskMismatchError, NonFiniteWeightsError

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX = np.uint64(0xBF58476D1CE4E5B9)
_COLUMNS = 3
_HEADER_ROWS = 2
NOT_FINITE = -1  # surviving count of a tensor whose weights held NaN or inf at a mask update

BROADCAST_PARAMETERS_HINT = {
    "torch": "hvd.broadcast_parameters(model.state_dict(), root_rank=0)",
    "tensorflow": "hvd.broadcast_variables(model.variables, root_rank=0) (Keras: BroadcastGlobalVariablesCallback(0))",
}


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def mask_fingerprint(mask: np.ndarray) -> tuple[int, int]:
    """Fingerprint of one mask: its surviving count and an order-free hash of where the survivors are.

    Masks with the same count at different positions get different hashes
    (splitmix64-style mixing of each position, summed mod 2**64).

    Args:
        mask: boolean (or truthy) mask of any shape, True where a weight survives.

    Returns:
        ``(surviving count, hash of the surviving flat positions as a signed int64)``; hash 0 when nothing
        is pruned.
    """
    flat = np.asarray(mask).ravel()
    positions = np.flatnonzero(flat).astype(np.uint64)
    if positions.size == flat.size:
        return int(positions.size), 0
    with np.errstate(over="ignore"):
        mixed = (positions + np.uint64(1)) * _GOLDEN
        mixed ^= mixed >> np.uint64(31)
        mixed *= _MIX
        mixed ^= mixed >> np.uint64(29)
        digest = int(mixed.sum(dtype=np.uint64))
    return int(positions.size), _signed(digest)


def weight_digest(total: float) -> int:
    """A float64 summary of a weight tensor (e.g. its sum) as an int64 word: equal weights, equal word."""
    return struct.unpack("<q", struct.pack("<d", float(total)))[0]


def _names_hash(names: Sequence[str]) -> int:
    digest = hashlib.blake2b("\0".join(names).encode(), digest_size=8).digest()
    return struct.unpack("<q", digest)[0]


def fingerprint_table(
    prunable: Mapping[str, int],
    fingerprints: Mapping[str, tuple[int, int]],
    step: int,
    weight_sums: Mapping[str, float] | None = None,
    settings: Mapping[str, Setting] | None = None,
    not_finite: Sequence[str] = (),
) -> np.ndarray:
    """This rank's fingerprint table, which ranks allgather and compare with ``check_fingerprints``.

    Args:
        prunable: ``{name: numel}`` of every prunable tensor.
        fingerprints: ``mask_fingerprint`` of each mask held (a missing one counts as all kept; frontends may
            cache them per mask).
        step: the schedule step the masks belong to.
        weight_sums: ``{name: float}`` summarising the weights the masks were ranked on (only used to explain
            a disagreement); missing names count as 0.0.
        settings: what every rank must share (``core.agreement``).
        not_finite: tensors whose weights held NaN or inf when masks were to be ranked on them.

    Returns:
        int64 array of shape ``(2 + len(prunable) + len(settings), 3)``: header rows, one row per prunable
        name in sorted order, then the settings' rows.
    """
    names = sorted(prunable)
    weight_sums = weight_sums or {}
    extra = settings_rows(settings or {})
    rows = [(len(names), _names_hash(names), int(step)), (len(extra), 0, 0)]
    for name in names:
        kept, positions = fingerprints.get(name, (int(prunable[name]), 0))
        rows.append((NOT_FINITE if name in not_finite else kept, positions, weight_digest(weight_sums.get(name, 0.0))))
    return np.concatenate([np.array(rows, dtype=np.int64), extra])


def _split_tables(gathered: np.ndarray, world_size: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each rank's (header and tensor rows, settings rows) from the concatenation (each table starts with
    its own row counts)."""
    gathered = np.asarray(gathered, dtype=np.int64).reshape(-1, _COLUMNS)
    tables, start = [], 0
    for _ in range(world_size):
        tensors_end = start + _HEADER_ROWS + int(gathered[start, 0])
        settings_end = tensors_end + int(gathered[start + 1, 0])
        tables.append((gathered[start:tensors_end], gathered[tensors_end:settings_end]))
        start = settings_end
    return tables


def describe_mismatches(names: Sequence[str], tables: Sequence[np.ndarray]) -> list[str]:
    """List the tensors whose masks disagree across ranks.

    Args:
        names: the prunable names, in the (sorted) order of the tables' rows.
        tables: every rank's table (header and tensor rows), in rank order, all for the same names.

    Returns:
        One message per disagreeing tensor, naming the ranks that differ from rank 0 and each rank's
        surviving count; empty when all masks agree.
    """
    problems = []
    for index, name in enumerate(names, start=_HEADER_ROWS):
        per_rank = [tuple(int(x) for x in table[index, :2]) for table in tables]
        odd = [rank for rank, fp in enumerate(per_rank) if fp != per_rank[0]]
        if odd:
            counts = ", ".join(f"rank {r}: {fp[0]} kept" for r, fp in enumerate(per_rank))
            problems.append(f"{name!r}: ranks {odd} differ from rank 0 ({counts})")
    return problems


def _not_finite(names: Sequence[str], tables: Sequence[np.ndarray]) -> list[str]:
    """``'name' (ranks [...])`` for each tensor some rank could not rank."""
    found = []
    for index, name in enumerate(names, start=_HEADER_ROWS):
        ranks = [rank for rank, table in enumerate(tables) if table[index, 0] == NOT_FINITE]
        if ranks:
            found.append(f"{name!r} (ranks {ranks})" if len(ranks) < len(tables) else repr(name))
    return found


def check_fingerprints(names: Sequence[str], gathered: np.ndarray, world_size: int, frontend: str, hint: str,
                       settings: Mapping[str, Setting] | None = None) -> None:
    """Raise on any disagreement, with its most likely cause; every rank holds the same ``gathered``, so
    every rank raises the same error.

    Args:
        names: the prunable names (any order).
        gathered: every rank's ``fingerprint_table``, concatenated in rank order (Horovod's allgather).
        world_size: number of ranks whose tables ``gathered`` holds.
        frontend: ``"torch"`` or ``"tensorflow"``; picks how the message says to broadcast weights.
        hint: how to share masks, appended when masks differ while the weights agree.
        settings: what every rank must share (``core.agreement``), checked against the other ranks' rows.

    Raises:
        MaskMismatchError: ranks prune different sets of tensors, or masks or the schedule position differ
            (naming what differs and, when the weights differ too, the likely cause: ranks never given one
            rank's weights; else ``hint``).
        SettingsMismatchError: ranks hold different ``settings``.
        NonFiniteWeightsError: weights held NaN or inf at a mask update.
    """
    names = sorted(names)
    split = _split_tables(gathered, world_size)
    tables = [table for table, _ in split]
    headers = [tuple(int(x) for x in table[0]) for table in tables]
    if len({header[:2] for header in headers}) > 1:
        counts = ", ".join(f"rank {r}: {h[0]}" for r, h in enumerate(headers))
        raise MaskMismatchError(f"ranks prune different sets of tensors (prunable tensors per rank: {counts}): "
                                "every rank must build the same model and pass the same prunable= / masks=")
    check_settings(settings or {}, [rows for _, rows in split])
    not_finite = _not_finite(names, tables)
    if not_finite:
        raise NonFiniteWeightsError(
            f"weights hold NaN or inf at a mask update, so magnitudes cannot rank them: {', '.join(not_finite)}. "
            "No mask was changed. Lower the learning rate, clip gradients, or skip non-finite steps (a loss "
            "scaler does) before the next mask update.")
    problems = describe_mismatches(names, tables)
    if len({header[2] for header in headers}) > 1:
        problems.append("schedule position differs (" + ", ".join(f"rank {r}: {h[2]}" for r, h in enumerate(headers)) + ")")
    if not problems:
        return
    message = "pruning masks differ across ranks: " + "; ".join(problems) + "."
    weights_differ = [name for index, name in enumerate(names, start=_HEADER_ROWS)
                      if len({int(table[index, 2]) for table in tables}) > 1]
    if weights_differ:
        shown = ", ".join(repr(name) for name in weights_differ[:5]) + (", ..." if len(weights_differ) > 5 else "")
        raise MaskMismatchError(f"{message} Weights differ too ({shown}), and masks are ranked on them: give every "
                                f"rank one rank's weights, with {BROADCAST_PARAMETERS_HINT[frontend]}.")
    raise MaskMismatchError(f"{message} {hint}")
