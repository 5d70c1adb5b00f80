"""A digest of a checkpoint's content, written into it when it is saved and checked when it is loaded.

Formats that keep no checksum of their own (``torch.save`` stores tensors without one) load a flipped byte
as a different weight. The digest covers every array's dtype, shape and bytes, every number, string and
container in key order; for any other object only its type, whose ``repr`` may hold a memory address.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import numpy as np

from pactrain_hvd.core.errors import CheckpointError

DIGEST_KEY = "pactrain_digest"
_PLAIN = (str, int, float, complex, bool, type(None), bytes)


def ndarray_bytes(obj: Any) -> bytes | None:
    """A NumPy array's dtype, shape and data as bytes, for ``content_digest``; None for anything else."""
    if not isinstance(obj, np.ndarray):
        return None
    return f"{obj.dtype}{obj.shape}".encode() + np.ascontiguousarray(obj).tobytes()


def content_digest(state: Any, array_bytes: Callable[[Any], bytes | None]) -> str:
    """SHA-256 of ``state``; ``array_bytes(obj)`` gives an array's dtype, shape and data as bytes (None: not one)."""
    digest = hashlib.sha256()

    def feed(obj: Any) -> None:
        if isinstance(obj, dict):
            digest.update(b"{")
            for key in sorted(obj, key=repr):
                feed(key)
                feed(obj[key])
            digest.update(b"}")
        elif isinstance(obj, (list, tuple)):
            digest.update(b"(" if isinstance(obj, tuple) else b"[")
            for item in obj:
                feed(item)
            digest.update(b"]")
        elif isinstance(obj, _PLAIN):
            digest.update(f"{type(obj).__name__}:{obj!r};".encode())
        else:
            raw = array_bytes(obj)
            digest.update(b"A" + raw if raw is not None else f"<{type(obj).__qualname__}>".encode())

    feed(state)
    return digest.hexdigest()


def with_digest(state: dict, array_bytes: Callable[[Any], bytes | None]) -> dict:
    """``state`` with its digest under ``DIGEST_KEY`` (a new dict; ``state`` is not changed)."""
    content = {key: value for key, value in state.items() if key != DIGEST_KEY}
    return {**content, DIGEST_KEY: content_digest(content, array_bytes)}


def without_digest(state: dict, array_bytes: Callable[[Any], bytes | None], where: str) -> dict:
    """``state`` less its digest, once the digest matches its content; a state saved without one is returned as
    it is. A mismatch raises ``CheckpointError`` naming ``where``."""
    if DIGEST_KEY not in state:
        return state
    content = {key: value for key, value in state.items() if key != DIGEST_KEY}
    if content_digest(content, array_bytes) != state[DIGEST_KEY]:
        raise CheckpointError(f"checkpoint {where} does not match the digest it was saved with: its content changed "
                              "after it was written (a damaged disk or copy); nothing was loaded")
    return content
