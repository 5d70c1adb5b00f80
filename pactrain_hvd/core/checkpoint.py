"""PacTrain's checkpoint entry: one format, written and read by every frontend.

The entry is a plain dict; its arrays are the frontend's tensors, or numpy arrays::

    {"step": int,                               the schedule position
     "settings": {...},                         what the masks were reached under (core.resume)
     "world_size": int,                         the ranks it was written on
     "masks": {name: uint8 array},              one per pruned tensor
     "positions": {name: int},                  TensorFlow: each named tensor's position in binding order
     "scales": {name: float},                   held quantization scales (the same on every rank)
     "quantized": {"rank": int, "residuals": {name: float32 array}},   this rank's error memory
     "outer": {"anchor": {name: array}, "momentum": {name: array}}}   local steps

torch's ``DistributedOptimizer`` keeps it under ``"pactrain"`` of its state dict, the DDP hook's
``state_dict()`` is it, and TensorFlow's ``PacTrainState`` stores it as a NumPy ``.npz`` archive
(``to_npz``; tensors by position there, as Keras names layers per process). Entries written by earlier
versions still read: a ``sparsity`` where ``settings`` were not yet recorded, ``ternary`` and
``ternary_scales`` (the quantized entries' earlier names), torch's held scales as one vector over the
parameters (``quantized_scales``), and a saved rounding-noise state (no longer needed: the noise is the
step's, ``core.quantized``).
"""

from __future__ import annotations

import io
import json
import numbers
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pactrain_hvd.core.digest import DIGEST_KEY, ndarray_bytes, with_digest, without_digest
from pactrain_hvd.core.errors import CheckpointError


@dataclass
class SavedState:
    """A checkpoint's PacTrain state (the entry of the module docstring, read)."""

    step: int
    masks: dict[str, Any]
    settings: dict | None = None  # None: written before settings were recorded
    world_size: int | None = None  # None: written before it was recorded
    positions: dict[str, int] | None = None
    scales: dict[str, float] | None = None  # None: no quantized values; {}: none held
    quantized: dict | None = None  # {"rank", "residuals"}: the saving rank's error memory
    outer: dict | None = None


def entry(saved: SavedState) -> dict:
    """The entry of ``saved``: the format every frontend writes."""
    written = {"step": saved.step, "settings": saved.settings, "world_size": saved.world_size, "masks": saved.masks}
    optional = {"positions": saved.positions, "scales": saved.scales, "quantized": saved.quantized,
                "outer": saved.outer}
    return {**written, **{key: value for key, value in optional.items() if value is not None}}


def read_entry(saved: Any, what: str, scale_names: Sequence[str] | None = None) -> SavedState:
    """An entry read and its structure checked (a tensor's fit is the frontend's to check); ``what`` names it in
    messages. ``scale_names``: the tensors an earlier torch entry's vector of held scales is over, in order.

    Raises:
        CheckpointError: ``saved`` is not an entry, naming what is missing or wrong.
    """
    if not isinstance(saved, Mapping) or not {"step", "masks"} <= set(saved):
        raise CheckpointError(f"{what} needs 'step' and 'masks'")
    step = saved["step"]
    if isinstance(step, bool) or not isinstance(step, numbers.Integral) or step < 0:
        raise CheckpointError(f"checkpoint step must be an int >= 0, got {step!r}")
    if not isinstance(saved["masks"], Mapping):
        raise CheckpointError(f"checkpoint masks must be a dict of tensor name to mask, got {type(saved['masks']).__name__}")
    settings = saved.get("settings", {"sparsity": saved["sparsity"]} if "sparsity" in saved else None)
    quantized = saved.get("quantized", saved.get("ternary"))
    if quantized is not None and not (isinstance(quantized, Mapping) and {"rank", "residuals"} <= set(quantized)):
        raise CheckpointError(f"the 'quantized' entry of {what} needs 'rank' and 'residuals'")
    scales = saved.get("scales")
    vector = saved.get("quantized_scales", saved.get("ternary_scales"))
    if scales is None and vector is not None:
        scales = _scales_of_vector(vector, scale_names)
    return SavedState(int(step), dict(saved["masks"]), settings, saved.get("world_size"), saved.get("positions"),
                      scales, None if quantized is None else {"rank": quantized["rank"],
                                                              "residuals": quantized["residuals"]},
                      saved.get("outer"))


def _scales_of_vector(vector: Any, names: Sequence[str] | None) -> dict[str, float]:
    """An earlier torch entry's held scales: one value per parameter, in ``names``' order, NaN where none is held."""
    values = np.asarray(vector.detach().cpu() if hasattr(vector, "detach") else vector, dtype=np.float64)
    if names is None or values.shape != (len(names),):
        count = "its tensors" if names is None else f"{len(names)} values, one per parameter"
        raise CheckpointError(f"checkpoint 'quantized_scales' must be a vector of {count}, got shape {values.shape}")
    return {name: float(value) for name, value in zip(names, values) if not np.isnan(value)}


def checked_scales(scales: Mapping[str, float]) -> dict[str, float]:
    """Held scales as read: each >= 0 and finite."""
    bad = {name: value for name, value in scales.items() if not 0 <= value < np.inf}
    if bad:
        raise CheckpointError(f"checkpoint quantization scales must be >= 0 and finite, got {bad}")
    return dict(scales)


def to_npz(saved: SavedState) -> bytes:
    """``saved`` (numpy arrays, every mask with its position) as a NumPy ``.npz`` archive, digest included."""
    names = sorted(saved.masks, key=lambda name: saved.positions[name])
    arrays = dict(step=np.int64(saved.step), world_size=np.int64(saved.world_size),
                  settings=np.array(json.dumps(saved.settings)), names=np.array(names, dtype=np.str_),
                  positions=np.array([saved.positions[name] for name in names], dtype=np.int64),
                  **{f"mask_{i}": saved.masks[name] for i, name in enumerate(names)})
    if saved.quantized is not None:
        held = sorted(saved.scales or {}, key=lambda name: saved.positions[name])
        arrays.update(quantized_rank=np.int64(saved.quantized["rank"]), scale_names=np.array(held, dtype=np.str_),
                      scale_positions=np.array([saved.positions[name] for name in held], dtype=np.int64),
                      quantized_scales=np.array([saved.scales[name] for name in held], np.float32),
                      **{f"residual_{i}": saved.quantized["residuals"][name] for i, name in enumerate(names)})
    if saved.outer is not None:
        held = sorted(saved.outer["anchor"], key=lambda name: saved.positions[name])
        arrays.update(outer_names=np.array(held, dtype=np.str_),
                      outer_positions=np.array([saved.positions[name] for name in held], dtype=np.int64),
                      **{f"anchor_{i}": saved.outer["anchor"][name] for i, name in enumerate(held)},
                      **{f"outer_momentum_{i}": saved.outer["momentum"][name] for i, name in enumerate(held)})
    buffer = io.BytesIO()
    np.savez(buffer, **with_digest({key: np.asarray(value) for key, value in arrays.items()}, ndarray_bytes))
    return buffer.getvalue()


def from_npz(blob: bytes) -> SavedState:
    """A ``to_npz`` archive, read once and checked against its digest (masks and residuals keyed by saved name)."""
    try:
        with np.load(io.BytesIO(blob), allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as error:
        raise CheckpointError(f"not a PacTrain state (a TensorFlow PacTrain state is a NumPy .npz archive; this one "
                              f"is truncated, corrupt or of another kind): {error}") from error
    if DIGEST_KEY in arrays:
        arrays[DIGEST_KEY] = str(arrays[DIGEST_KEY])
    arrays = without_digest(arrays, ndarray_bytes, "(TensorFlow PacTrain state)")
    arrays = {key.replace("ternary_", "quantized_", 1) if key.startswith("ternary_") else key: value
              for key, value in arrays.items()}  # the entries' earlier names
    try:
        names = [str(name) for name in arrays["names"]]
        positions = dict(zip(names, (int(position) for position in arrays["positions"])))
        by_position = {position: name for name, position in positions.items()}
        quantized = scales = None
        if "quantized_rank" in arrays:  # an earlier archive's "quantized_noise" is not needed
            quantized = {"rank": int(arrays["quantized_rank"]),
                         "residuals": {name: arrays[f"residual_{i}"] for i, name in enumerate(names)}}
            held = [int(p) for p in arrays.get("scale_positions", ())]
            held_names = ([str(name) for name in arrays["scale_names"]] if "scale_names" in arrays
                          else [by_position.get(p, f"#{p}") for p in held])  # earlier archives: by position only
            positions.update(zip(held_names, held))
            scales = {name: float(v) for name, v in zip(held_names, arrays.get("quantized_scales", ()))
                      if not np.isnan(v)}  # earlier archives: NaN where none was held
        outer = None
        if "outer_names" in arrays:
            held_names = [str(name) for name in arrays["outer_names"]]
            positions.update(zip(held_names, (int(position) for position in arrays["outer_positions"])))
            outer = {"anchor": {name: arrays[f"anchor_{i}"] for i, name in enumerate(held_names)},
                     "momentum": {name: arrays[f"outer_momentum_{i}"] for i, name in enumerate(held_names)}}
        settings = json.loads(str(arrays["settings"])) if "settings" in arrays else None
        world_size = int(arrays["world_size"]) if "world_size" in arrays else None
        return SavedState(int(arrays["step"]), {name: arrays[f"mask_{i}"] for i, name in enumerate(names)}, settings,
                          world_size, positions, scales, quantized, outer)
    except (OSError, KeyError, ValueError, EOFError) as error:
        raise CheckpointError(f"not a PacTrain state: {error}") from error
