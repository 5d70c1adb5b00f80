"""Atomic checkpoints: a crash mid-write never leaves a half-written file under the final name."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from pactrain_hvd.core import CheckpointError


def save_checkpoint(path: str | os.PathLike, state: dict[str, Any]) -> None:
    """``torch.save`` into a temporary file beside ``path``, fsync it, then rename it over ``path``.

    Example::

        >>> if hvd.rank() == 0:
        ...     pt.save_checkpoint("ckpt.pt", {"model": model.state_dict(), "optimizer": opt.state_dict()})
    """
    target = Path(path)
    handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent or ".")
    try:
        with os.fdopen(handle, "wb") as file:
            torch.save(state, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load a checkpoint; a missing, truncated or corrupt file raises ``CheckpointError``."""
    try:
        state = torch.load(path, map_location=map_location)
    except FileNotFoundError:
        raise CheckpointError(f"no checkpoint at {os.fspath(path)!r}") from None
    except Exception as error:  # torch raises several types for damaged archives
        raise CheckpointError(f"checkpoint {os.fspath(path)!r} is truncated or corrupt: {error}") from error
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {os.fspath(path)!r} holds a {type(state).__name__}, expected a dict")
    return state
