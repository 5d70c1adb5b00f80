"""Checkpoints: ``PacTrainState``'s ``.npz`` blob, the value ``tf.train.Checkpoint`` stores for it.

The blob holds the schedule position, the world size it was written under and the masks; with
quantized ``packed_values`` also the held scales (the same on every rank) and this rank's error memory
(restored only on the same rank, as in torch). Blobs that name those entries ``ternary_*``, their earlier
names, still load; the rounding-noise state earlier blobs hold is not needed (the noise is the step's).
Masks are keyed by the variable's position in binding order (the model's variable order), so they restore
into a rebuilt model whose generated names differ (Keras numbers layers per process); the saved names
serve the error messages.

This module knows the format only: ``PacTrainState.snapshot()`` gives the ``SavedState`` to write,
``PacTrainState.restore()`` takes the one ``parse`` reads.
"""

from __future__ import annotations

import io
import json
import zipfile
from dataclasses import dataclass

import numpy as np

from pactrain_hvd.core import CheckpointError
from pactrain_hvd.core.digest import DIGEST_KEY, ndarray_bytes, with_digest, without_digest


@dataclass
class SavedQuantized:
    """The saving rank, and that rank's residuals by position; the held scales by position."""

    rank: int
    residuals: dict[int, np.ndarray]
    scales: dict[int, float]


@dataclass
class SavedState:
    """What a checkpoint holds of a ``PacTrainState``; residuals and scales are keyed by variable position."""

    step: int
    world_size: int | None  # None: written before it was recorded
    masks: list[tuple[int, str, np.ndarray]]  # (position, saved name, mask)
    quantized: SavedQuantized | None
    settings: dict | None = None  # None: written before they were recorded


def to_bytes(saved: SavedState) -> bytes:
    """The ``.npz`` blob of ``saved`` (a residual for every saved mask where quantization state is saved)."""
    quantized = {}
    if saved.quantized is not None:
        scaled = sorted(saved.quantized.scales)
        quantized = {"quantized_rank": np.int64(saved.quantized.rank),
                     "scale_positions": np.array(scaled, dtype=np.int64),
                     "quantized_scales": np.array([saved.quantized.scales[p] for p in scaled], np.float32),
                     **{f"residual_{i}": saved.quantized.residuals[position]
                        for i, (position, _, _) in enumerate(saved.masks)}}
    arrays = dict(step=np.int64(saved.step), world_size=np.int64(saved.world_size),
                  settings=np.array(json.dumps(saved.settings)),
                  names=np.array([name for _, name, _ in saved.masks], dtype=np.str_),
                  positions=np.array([position for position, _, _ in saved.masks], dtype=np.int64),
                  **{f"mask_{i}": mask for i, (_, _, mask) in enumerate(saved.masks)}, **quantized)
    buffer = io.BytesIO()
    np.savez(buffer, **with_digest({k: np.asarray(v) for k, v in arrays.items()}, ndarray_bytes))
    return buffer.getvalue()


def parse(blob: bytes) -> SavedState:
    """A ``serialize`` blob, read once."""
    try:
        with np.load(io.BytesIO(blob), allow_pickle=False) as archive:
            entries = {name: archive[name] for name in archive.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as error:
        raise CheckpointError(f"not a PacTrain state (a TensorFlow PacTrain state is a NumPy .npz archive; this one "
                              f"is truncated, corrupt or of another kind): {error}") from error
    if DIGEST_KEY in entries:
        entries[DIGEST_KEY] = str(entries[DIGEST_KEY])
    saved = without_digest(entries, ndarray_bytes, "(TensorFlow PacTrain state)")
    saved = {key.replace("ternary_", "quantized_", 1) if key.startswith("ternary_") else key: value
             for key, value in saved.items()}  # the entries' earlier names
    try:
        names = [str(name) for name in saved["names"]]
        positions = [int(position) for position in saved["positions"]]
        masks = [(position, name, saved[f"mask_{i}"]) for i, (position, name) in enumerate(zip(positions, names))]
        quantized = None
        if "quantized_rank" in saved:
            scales = ({int(position): float(scale) for position, scale in
                       zip(saved["scale_positions"], saved["quantized_scales"])} if "quantized_scales" in saved
                      else {})
            quantized = SavedQuantized(int(saved["quantized_rank"]),  # a saved noise state: not needed
                                       {position: saved[f"residual_{i}"] for i, position in enumerate(positions)},
                                       scales)
        world_size = int(saved["world_size"]) if "world_size" in saved else None
        settings = json.loads(str(saved["settings"])) if "settings" in saved else None
        return SavedState(int(saved["step"]), world_size, masks, quantized, settings)
    except (OSError, KeyError, ValueError, EOFError) as error:
        raise CheckpointError(f"not a PacTrain state: {error}") from error


def masks_by_name(saved: SavedState, names: list[str]) -> dict[str, np.ndarray]:
    """The saved masks under the names of the variables bound at their positions (``names``, in binding order)."""
    masks = {}
    for position, saved_name, mask in saved.masks:
        if position >= len(names):
            raise CheckpointError(f"checkpoint has a mask for variable #{position} ({saved_name!r}), but only "
                                  f"{len(names)} variables are bound here")
        masks[names[position]] = mask
    return masks


def scales_by_name(saved: SavedState, names: list[str]) -> dict[str, float]:
    """The held ternary scales by bound variable name (none where the checkpoint holds none), checked."""
    scales = saved.quantized.scales if saved.quantized else {}
    bad = {names[p] if p < len(names) else p: v for p, v in scales.items() if not (np.isnan(v) or 0 <= v < np.inf)}
    if bad:
        raise CheckpointError(f"checkpoint ternary scales must be >= 0 and finite, or NaN (none held), got {bad}")
    return {names[p]: v for p, v in scales.items() if p < len(names)}


def residuals_by_name(saved: SavedQuantized, names: list[str], packed_sizes: dict[str, int]) -> dict[str, np.ndarray]:
    """The saved residuals by bound variable name, each checked against its variable's packed length."""
    residuals = {}
    for position, residual in saved.residuals.items():
        name = names[position]
        expected = packed_sizes[name]
        if residual.ndim != 1 or residual.size != expected:
            raise CheckpointError(f"ternary residual of {name!r} has shape {residual.shape}, its packed values "
                                  f"number {expected}")
        residuals[name] = residual.astype(np.float32)
    return residuals
