"""Error feedback, framework-free: the interface both frontends' ``ErrorFeedback`` share, and its rules.

Per tensor, the memory holds the quantization error of its surviving values (one per surviving
coordinate, in the packed order), added to the next step's values before they are rounded.

The interface (``pactrain_hvd.torch.memory`` and ``pactrain_hvd.tensorflow.memory``):

- ``track(name)``: make room for a tensor's residual (TF: its variable, before any trace; torch: nothing).
- ``add(name, values)``: ``values`` plus the residual (torch: in place, in the caller's buffer).
- ``store(name, values, dequantized)``: this step's error, ``values - dequantized``.
- ``commit()``: the step was taken; its stored errors become the memory.
- ``discard()``: the step in flight is abandoned (a state dict is loaded); its stored errors are dropped.
- ``remap(name, old_indices, new_indices, numel)``: a mask changed; the residual follows the coordinates that
  survive (newly surviving ones start at 0; ``None``: no longer quantized, the residual is dropped).
- ``state_dict()`` / ``load_state_dict(residuals, ...)``: host copies by name, for checkpoints.

One overflow rule: **the memory never takes a value that is not finite, and a step that is not taken leaves it
as it was.** Where an element's error is not finite (an inf value, or a scale that is not finite), the old
residual stays at that element (0 where none is held). A step a loss scaler skips is not taken: in torch
the optimizer's step commits (a skipped step never calls it, so its errors are dropped); in TF a traced step
cannot tell, so a tensor whose error is not finite anywhere, which mixed precision skips on every rank, keeps
its whole old residual (``commit`` is a no-op there: each step's error is the memory at once).
"""

from __future__ import annotations

import numpy as np


def remapped(residual: np.ndarray, old_indices: np.ndarray, new_indices: np.ndarray, numel: int) -> np.ndarray:
    """``residual`` (at flat coordinates ``old_indices`` of a tensor of ``numel``) at ``new_indices``: kept where a
    coordinate survives, 0 where it is newly surviving."""
    dense = np.zeros(numel, np.float32)
    dense[old_indices] = residual
    return dense[new_indices]
