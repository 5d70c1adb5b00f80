"""Survivors written back into a zeroed dense tensor, under torch's deterministic mode too."""

from __future__ import annotations

import torch


def put_survivors_(flat: torch.Tensor, indices: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``flat[indices] = values`` for a zeroed 1-D ``flat`` and unique ``indices``; returns ``flat``.

    ``put_`` is the fastest scatter on CPU but has no deterministic implementation, so
    ``torch.use_deterministic_algorithms(True)`` refuses it. Adding into zeros at unique indices writes the
    same values, and ``put_(..., accumulate=True)`` is allowed in that mode: it runs only there.
    """
    return flat.put_(indices, values, accumulate=torch.are_deterministic_algorithms_enabled())
