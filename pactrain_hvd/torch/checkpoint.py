"""Checkpoints: PacTrain's entries in an optimizer state dict, and atomic checkpoint files.

``DistributedOptimizer.state_dict()`` is the wrapped optimizer's plus ``"pactrain"``, core's checkpoint
entry (``pactrain_hvd.core.checkpoint``: schedule position, settings, masks, held scales, this rank's
quantization memory; with local steps the anchor and outer momentum). Where
the wrapped optimizer has state, each prunable parameter's entry also holds its mask
(``"pactrain.mask"``: uint8, as Horovod broadcasts no bool tensors; the same tensor as in
``["pactrain"]["masks"]``, so a checkpoint stores it once), the first parameter's the schedule
position (``"pactrain.step"``) and held quantization scales (``"pactrain.scales"``), and with local steps
each parameter's its anchor and outer momentum: ``hvd.broadcast_optimizer_state`` broadcasts them
with the rest, so Horovod's own resume idiom carries them (``PacTrainState.export``).
"""

from __future__ import annotations

import os
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pactrain_hvd.core import CheckpointError, saved_by_this_rank, while_running
from pactrain_hvd.core.checkpoint import SavedState, checked_scales, entry, read_entry
from pactrain_hvd.core.digest import ndarray_bytes, with_digest, without_digest
from pactrain_hvd.core.resume import check_resumable, checkpoint_settings
from pactrain_hvd.torch.state import PacTrainState

_MASK_KEY, _STEP_KEY, _SCALES_KEY = "pactrain.mask", "pactrain.step", "pactrain.scales"
_ANCHOR_KEY, _MOMENTUM_KEY = "pactrain.anchor", "pactrain.outer_momentum"
_KEYS = (_MASK_KEY, _STEP_KEY, _SCALES_KEY, _ANCHOR_KEY, _MOMENTUM_KEY)


def with_pactrain(state: PacTrainState, inner: dict, optimized: list[torch.Tensor]) -> dict:
    """``inner`` (the wrapped optimizer's state dict, whose parameters are ``optimized``) plus PacTrain's state."""
    exported = state.export()
    scales = quantized = None
    if state.quantized is not None:
        vector = exported["scales"]
        scales = {name: float(value) for name, value in zip(state.parameters, vector) if not torch.isnan(value)}
        quantized = state.quantized.state_dict()
    inner["pactrain"] = entry(SavedState(
        state.step_count, exported["masks"], checkpoint_settings(state.config, state.packed_values),
        while_running(state.process_set.size), scales=scales, quantized=quantized,
        outer=state.outer.state_dict() if state.outer is not None else None))
    if (state.tracking or state.outer is not None) and inner["state"]:  # Horovod initialises an empty state first
        index = {id(p): i for i, p in enumerate(optimized)}
        additions = {0: {_STEP_KEY: exported["step"]}}
        if "scales" in exported:
            additions[0][_SCALES_KEY] = exported["scales"]
        for name, flags in exported["masks"].items():
            additions.setdefault(index[id(state.parameters[name])], {})[_MASK_KEY] = flags
        if state.outer is not None:  # the live tensors: the broadcast writes the root's into them
            for name, anchor in state.outer.anchor.items():
                additions.setdefault(index[id(state.parameters[name])], {}).update(
                    {_ANCHOR_KEY: anchor, _MOMENTUM_KEY: state.outer.momentum[name]})
        for pid, entries in additions.items():  # new dicts: the wrapped optimizer's own stay as they are
            inner["state"][pid] = {**inner["state"].get(pid, {}), **entries}
    return inner


def without_pactrain(state_dict: dict) -> tuple[dict, Any]:
    """The wrapped optimizer's part of ``state_dict`` (PacTrain's per-parameter entries dropped), and PacTrain's."""
    state_dict = dict(state_dict)
    pactrain = state_dict.pop("pactrain", None)
    if isinstance(state_dict.get("state"), dict):
        state_dict["state"] = {pid: {k: v for k, v in entry.items() if k not in _KEYS}
                               if isinstance(entry, dict) else entry for pid, entry in state_dict["state"].items()}
    return state_dict, pactrain


def validated(state: PacTrainState, pactrain: Any) -> SavedState:
    """``pactrain`` read and checked against ``state``'s parameters, settings, world size and codec (its masks as
    host masks); ``CheckpointError`` if it does not fit."""
    saved = read_entry(pactrain, "the 'pactrain' entry of the optimizer state dict", scale_names=list(state.parameters))
    saved.masks = fitted_masks(state.fit_masks, saved.masks)
    check_resumable(saved, state.config, state.packed_values, while_running(state.process_set.size))
    saved.outer = saved.outer if state.outer is not None else None
    if saved.outer is not None:
        state.outer.validate(saved.outer)
    if state.quantized is None:
        saved.scales = saved.quantized = None
        return saved
    saved.scales = checked_scales(saved.scales or {})
    if saved.quantized is not None and saved_by_this_rank(saved.quantized["rank"], state.process_set.rank,
                                                          holds_state=saved.step > 0):
        state.quantized.memory.validate(saved.quantized["residuals"],
                                        {name: int(mask.sum()) for name, mask in saved.masks.items()})
    else:
        saved.quantized = None
    return saved


COMPILED_PREFIX = "_orig_mod."  # what torch.compile puts before the wrapped module's parameter names


def fitted_masks(fit_masks: Callable[[Any], dict[str, np.ndarray]], masks: Any) -> dict[str, np.ndarray]:
    """A checkpoint's masks checked by ``fit_masks`` (a state's: validated host masks of its tensors, or
    ``TypeError`` / ``ValueError``)."""
    try:
        return fit_masks(masks)
    except (TypeError, ValueError) as error:
        compiled = any(COMPILED_PREFIX in str(name) for name in masks)
        hint = (f". Its names hold {COMPILED_PREFIX!r}: it was saved from a torch.compile'd model; compile this model "
                "the same way before loading, or rename the masks without the prefix") if compiled else ""
        raise CheckpointError(f"checkpoint does not fit this model: {error}{hint}") from error


def restore(state: PacTrainState, saved: SavedState) -> None:
    """Install ``saved`` (``validated``): masks, schedule position and held scales (the same on every rank,
    whichever rank's checkpoint it is), and where this rank saved it, its quantization error memory. With local
    steps: the anchor and outer momentum (a checkpoint without them: the weights now are the anchor, no momentum)."""
    scales = None
    if saved.scales is not None:
        scales = torch.tensor([saved.scales.get(name, float("nan")) for name in state.parameters], dtype=torch.float32)
    state.adopt(saved.step, saved.masks, scales)
    if state.outer is not None:
        if saved.outer is not None:
            state.outer.load_state_dict(saved.outer)
        else:
            state.outer.restart()
    if saved.quantized is not None:
        state.load_quantized(saved.quantized)


def array_bytes(obj: Any) -> bytes | None:
    """A tensor's (or array's) dtype, shape and data as bytes, for ``core.digest``; None for anything else."""
    if not isinstance(obj, torch.Tensor):
        return ndarray_bytes(obj)
    tensor = obj.detach().cpu()
    if tensor.is_sparse:
        tensor = tensor.coalesce()
        return b"sparse" + array_bytes(tensor.indices()) + array_bytes(tensor.values())
    try:
        data = tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    except (RuntimeError, TypeError):  # quantized and other layouts: their shape and dtype only
        data = b""
    return f"{tensor.dtype}{tuple(tensor.shape)}".encode() + data


def save_checkpoint(path: str | os.PathLike, state: dict[str, Any]) -> None:
    """``torch.save`` into a temporary file beside ``path``, fsync it, then rename it over ``path``.

    The file also holds a digest of ``state``'s content (every tensor's bytes, every number and string) under
    ``"pactrain_digest"``; ``load_checkpoint`` checks it and removes it.

    Args:
        path: the checkpoint file; its directory must exist.
        state: what to save, a dict (model and optimizer state dicts, epoch, ...).

    Raises:
        TypeError: ``state`` is not a dict.

    Example::

        >>> if hvd.rank() == 0:
        ...     pt.save_checkpoint("ckpt.pt", {"model": model.state_dict(), "optimizer": opt.state_dict()})
    """
    if not isinstance(state, dict):
        raise TypeError(f"state must be a dict, got {type(state).__name__}")
    target = Path(path)
    handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent or ".")
    try:
        with os.fdopen(handle, "wb") as file:
            torch.save(with_digest(state, array_bytes), file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load a checkpoint written by ``save_checkpoint``, checking its digest.

    Args:
        path: the checkpoint file.
        map_location: where tensors are loaded, as ``torch.load``'s ``map_location``.

    Returns:
        The saved dict, less its digest (a dict saved without one is returned as it is).

    Raises:
        CheckpointError: naming the file, where it is missing, truncated, corrupt or foreign (not a dict, or a
            TensorFlow ``.npz`` state), or its content no longer matches its digest.
    """
    where = repr(os.fspath(path))
    try:
        state = torch.load(path, map_location=map_location)
    except FileNotFoundError:
        raise CheckpointError(f"no checkpoint at {where}") from None
    except Exception as error:  # torch raises several types for damaged archives
        if _is_npz(path):
            raise CheckpointError(f"checkpoint {where} is a NumPy .npz archive (a TensorFlow PacTrain state?), not a "
                                  "torch checkpoint: load it with the frontend that wrote it") from error
        raise CheckpointError(f"checkpoint {where} is truncated or corrupt (torch.load: {error})") from error
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {where} holds a {type(state).__name__}, expected a dict")
    return without_digest(state, array_bytes, where)


def _is_npz(path: str | os.PathLike) -> bool:
    try:
        with zipfile.ZipFile(path) as archive:
            return any(name.endswith(".npy") for name in archive.namelist())
    except (OSError, zipfile.BadZipFile):
        return False
