"""Settings every rank must share, proven equal with the Mask Tracker's first exchange.

Which collectives a step makes, and when, follows from the settings: the schedule decides at which
steps masks change (each change is a Mask Tracker allgather), the plan thresholds and the value
encoding decide what each all-reduce carries. Ranks that disagree on one of them do not fail: they
wait in different collectives for ever. So every rank encodes its settings as rows of int64 words
``(key hash, kind, value)`` in its fingerprint table, every rank parses every rank's rows, and any
difference is the same ``SettingsMismatchError`` on every rank, naming the setting and each rank's
value, before the first collective that depends on it.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping, Sequence

import numpy as np

from pactrain_hvd.core.errors import SettingsMismatchError

Setting = int | float | str | bool | None

_NONE, _INT, _FLOAT, _TEXT, _HASHED, _BOOL = range(6)
_TEXT_BYTES = 8  # text this short travels as it is (so the error can print it); longer text as a hash

_SCHEDULE_HINT = ("total_steps, begin_step, end_step and frequency must be the same on every rank: derive total_steps "
                  "from a length every rank shares, e.g. epochs * len(train_loader) with a DistributedSampler, which "
                  "gives every rank the same number of batches")
_SCHEDULE = ("total_steps", "begin_step", "end_step", "frequency")

# What the collectives carry, beyond the settings: raised whenever a version changes it (2: ternary codes as
# base-(2N + 1) digits), so that ranks running different versions stop with an error instead of misreading
# each other's words.
WIRE_FORMAT = 2
_VERSION_HINT = "install the same pactrain_hvd version on every rank"
_UNKNOWN = "a setting this rank does not know (different pactrain_hvd versions?)"
_VERSIONED = ("wire_format", _UNKNOWN)  # differences no argument can mend: the hint is _VERSION_HINT


def _word(data: bytes) -> int:
    return struct.unpack("<q", data.ljust(8, b"\0"))[0]


def key_hash(name: str) -> int:
    return _word(hashlib.blake2b(name.encode(), digest_size=8).digest())


def _encode(value: Setting) -> tuple[int, int]:
    if value is None:
        return _NONE, 0
    if isinstance(value, bool):
        return _BOOL, int(value)
    if isinstance(value, int):
        return _INT, value
    if isinstance(value, float):
        return _FLOAT, _word(struct.pack("<d", value))
    text = str(value).encode()
    return (_TEXT, _word(text)) if len(text) <= _TEXT_BYTES else (_HASHED, key_hash(str(value)))


def _decode(kind: int, word: int) -> str:
    if kind == _NONE:
        return "None"
    if kind == _BOOL:
        return str(bool(word))
    if kind == _INT:
        return str(word)
    data = struct.pack("<q", word)
    if kind == _FLOAT:
        return repr(struct.unpack("<d", data)[0])
    if kind == _TEXT:
        return repr(data.rstrip(b"\0").decode(errors="replace"))
    return f"<value with hash {word & (1 << 64) - 1:016x}>"


def settings_rows(settings: Mapping[str, Setting]) -> np.ndarray:
    """This rank's settings as a ``(len(settings), 3)`` int64 array, in name order."""
    rows = [(key_hash(name), *_encode(settings[name])) for name in sorted(settings)]
    return np.array(rows, dtype=np.int64).reshape(-1, 3)


def check_settings(settings: Mapping[str, Setting], per_rank: Sequence[np.ndarray]) -> None:
    """Raise ``SettingsMismatchError`` where ranks' rows differ; ``settings``: this rank's (names the keys
    and orders the message).

    Every rank parses the same rows, so every rank raises the same error.
    """
    names = {key_hash(name): name for name in settings}  # in the order the frontend gives them
    as_dicts = [{int(key): (int(kind), int(word)) for key, kind, word in rows} for rows in per_rank]
    unknown = sorted({key for rows in as_dicts for key in rows} - names.keys())
    problems, differing = [], []
    for key in [*names, *unknown]:
        values = [rows.get(key) for rows in as_dicts]
        if len(set(values)) == 1:
            continue
        name = names.get(key, _UNKNOWN)
        shown = ", ".join(f"rank {rank}: {_decode(*value) if value else 'not set'}" for rank, value in enumerate(values))
        problems.append(f"{name} ({shown})")
        differing.append(name)
    if not problems:
        return
    hints = [_SCHEDULE_HINT] if set(differing) & set(_SCHEDULE) else []
    if set(differing) & set(_VERSIONED):
        hints.append(_VERSION_HINT)
    others = [name for name in differing if name not in (*_SCHEDULE, *_VERSIONED)]
    if others:
        listed = ", ".join(others[:-1]) + " and " + others[-1] if len(others) > 1 else others[0]
        hints.append(f"pass the same {listed} on every rank")
    raise SettingsMismatchError("PacTrain settings differ across ranks, so ranks would wait in different "
                                f"collectives: {'; '.join(problems)}. {'; '.join(hints)}.")


_COMPRESSION_NAMES = {"NoneCompressor": "none", "FP16Compressor": "fp16"}


def horovod_settings(op_name: str, compression: type, groups: int | list | None, backward_passes_per_step: int,
                     gradient_predivide_factor: float) -> dict[str, Setting]:
    """The Horovod arguments that decide what a step's collectives are, as settings (``groups`` as a count)."""
    name = getattr(compression, "__name__", type(compression).__name__)
    return {"op": op_name, "compression": _COMPRESSION_NAMES.get(name, name),
            "groups": len(groups) if isinstance(groups, list) else groups,
            "backward_passes_per_step": backward_passes_per_step,
            "gradient_predivide_factor": float(gradient_predivide_factor)}
