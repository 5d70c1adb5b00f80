"""Checkpoints: PacTrain's entries in an optimizer state dict, and atomic checkpoint files.

``DistributedOptimizer.state_dict()`` is the wrapped optimizer's plus ``"pactrain"`` (schedule
position, masks, quantization memory and scales; with local steps the anchor and outer momentum). Where
the wrapped optimizer has state, each prunable parameter's entry also holds its mask
(``"pactrain.mask"``: uint8, as Horovod broadcasts no bool tensors; the same tensor as in
``["pactrain"]["masks"]``, so a checkpoint stores it once), the first parameter's the schedule
position (``"pactrain.step"``) and held quantization scales (``"pactrain.scales"``), and with local steps
each parameter's its anchor and outer momentum: ``hvd.broadcast_optimizer_state`` broadcasts them
with the rest, so Horovod's own resume idiom carries them (``PacTrainState.export``). Checkpoints that
name the quantization entries ``"ternary"`` and ``"ternary_scales"`` (their earlier names) still load.
"""

from __future__ import annotations

import numbers
import os
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pactrain_hvd.core import CheckpointError, check_saved_world_size, saved_by_this_rank, while_running
from pactrain_hvd.core.digest import ndarray_bytes, with_digest, without_digest
from pactrain_hvd.core.resume import check_saved_settings, checkpoint_settings
from pactrain_hvd.torch.state import PacTrainState

_MASK_KEY, _STEP_KEY, _SCALES_KEY = "pactrain.mask", "pactrain.step", "pactrain.scales"
_ANCHOR_KEY, _MOMENTUM_KEY = "pactrain.anchor", "pactrain.outer_momentum"
_KEYS = (_MASK_KEY, _STEP_KEY, _SCALES_KEY, _ANCHOR_KEY, _MOMENTUM_KEY)


@dataclass
class SavedState:
    """A checkpoint's PacTrain state, validated against the state it is loaded into."""

    step: int
    masks: dict[str, np.ndarray]
    scales: torch.Tensor | None  # held quantization scales, one per parameter (NaN: none)
    quantized: dict | None  # this rank's error memory, if this rank saved it
    outer: dict | None = None  # local steps' anchor and outer momentum


def with_pactrain(state: PacTrainState, inner: dict, optimized: list[torch.Tensor]) -> dict:
    """``inner`` (the wrapped optimizer's state dict, whose parameters are ``optimized``) plus PacTrain's state."""
    exported = state.export()
    inner["pactrain"] = {"step": state.step_count, "sparsity": state.config.sparsity,
                         "settings": checkpoint_settings(state.config, state.packed_values),
                         "world_size": while_running(state.process_set.size), "masks": exported["masks"]}
    if state.outer is not None:
        inner["pactrain"]["outer"] = state.outer.state_dict()
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
    if state.quantized is not None:
        inner["pactrain"]["quantized"] = state.quantized.state_dict()
        inner["pactrain"]["quantized_scales"] = exported["scales"]
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
    """``pactrain`` checked against ``state``'s parameters, world size and codec; ``CheckpointError`` if it does not fit."""
    step, masks = saved_step_and_masks(state.fit_masks, pactrain, "the 'pactrain' entry of the optimizer state dict")
    check_saved_settings(pactrain.get("settings", {"sparsity": pactrain["sparsity"]} if "sparsity" in pactrain else None),
                         checkpoint_settings(state.config, state.packed_values), step, state.config)
    current = while_running(state.process_set.size)
    if current is not None:
        check_saved_world_size(pactrain.get("world_size"), current)
    outer = pactrain.get("outer") if state.outer is not None else None
    if outer is not None:
        state.outer.validate(outer)
    if state.quantized is None:
        return SavedState(step, masks, None, None, outer)
    saved_quantized = _saved_quantized(state, pactrain.get("quantized", pactrain.get("ternary")), masks, step)
    scales = pactrain.get("quantized_scales", pactrain.get("ternary_scales"))
    count = len(state.parameters)
    if scales is not None and (not isinstance(scales, torch.Tensor) or scales.shape != (count,)):
        raise CheckpointError(f"checkpoint 'quantized_scales' must be a tensor of {count} values, one per parameter")
    return SavedState(step, masks, scales, saved_quantized, outer)


COMPILED_PREFIX = "_orig_mod."  # what torch.compile puts before the wrapped module's parameter names


def saved_step_and_masks(fit_masks: Callable[[Any], dict[str, np.ndarray]], saved: Any,
                         what: str) -> tuple[int, dict[str, np.ndarray]]:
    """The schedule position and masks of ``saved`` (``what``, in messages), masks checked by ``fit_masks``
    (a state's: validated host masks of its tensors, or ``TypeError`` / ``ValueError``)."""
    if not isinstance(saved, dict) or not {"step", "masks"} <= set(saved):
        raise CheckpointError(f"{what} needs 'step' and 'masks'")
    step = saved["step"]
    if isinstance(step, bool) or not isinstance(step, numbers.Integral) or step < 0:
        raise CheckpointError(f"checkpoint step must be an int >= 0, got {step!r}")
    try:
        return int(step), fit_masks(saved["masks"])
    except (TypeError, ValueError) as error:
        compiled = isinstance(saved["masks"], dict) and any(COMPILED_PREFIX in str(name) for name in saved["masks"])
        hint = (f". Its names hold {COMPILED_PREFIX!r}: it was saved from a torch.compile'd model; compile this model "
                "the same way before loading, or rename the masks without the prefix") if compiled else ""
        raise CheckpointError(f"checkpoint does not fit this model: {error}{hint}") from error


def _saved_quantized(state: PacTrainState, saved: Any, masks: dict[str, np.ndarray], step: int) -> dict | None:
    """The checkpoint's quantization entry if this rank wrote it (another rank's, from a run that has stepped: a warning)."""
    if saved is None:
        return None
    if not isinstance(saved, dict) or not {"rank", "residuals"} <= set(saved):
        raise CheckpointError("the 'quantized' entry of the 'pactrain' state needs 'rank' and 'residuals'")
    if not saved_by_this_rank(saved["rank"], state.process_set.rank, holds_state=step > 0):
        return None
    state.quantized.memory.validate(saved["residuals"], {name: int(mask.sum()) for name, mask in masks.items()})
    return saved


def restore(state: PacTrainState, saved: SavedState) -> None:
    """Install ``saved``: masks, schedule position and held scales (the same on every rank, whichever rank's
    checkpoint it is), and where this rank saved it, its quantization error memory. With local steps: the
    anchor and outer momentum (a checkpoint without them: the weights now are the anchor, no momentum)."""
    state.adopt(saved.step, saved.masks, saved.scales)
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
