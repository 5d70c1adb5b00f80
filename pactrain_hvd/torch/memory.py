"""Error feedback: what rounding left out of a tensor's packed values, added back at its next send.

The interface and its overflow rule are ``core.memory``'s, shared with the TF frontend."""

from __future__ import annotations

from typing import Any

import torch

from pactrain_hvd.core import CheckpointError


class ErrorFeedback:
    """Per tensor, the quantization error of the surviving values, added to the next step's values.

    Residuals have the packed length (one per surviving coordinate): they are masked like the
    gradient. When a mask changes, ``remap`` keeps the residual of the coordinates that survive.
    A step's residuals are ``pending`` until the optimizer takes that step (``commit``): a step a
    loss scaler skips leaves the memory as it was, so what was sent plus what is remembered stays
    the sum of the gradients that were applied.
    """

    def __init__(self) -> None:
        self.residuals: dict[str, torch.Tensor] = {}
        self.pending: dict[str, torch.Tensor] = {}

    def track(self, name: str) -> None:
        """Nothing to prepare: a residual appears at its tensor's first ``store``."""

    def add(self, name: str, values: torch.Tensor) -> torch.Tensor:
        """``values`` plus ``name``'s residual, in place: ``values`` is the caller's own buffer (the gathered survivors)."""
        residual = self.residuals.get(name)
        return values if residual is None else values.add_(residual)

    add_ = add  # the in-place spelling

    def store(self, name: str, values: torch.Tensor, dequantized: torch.Tensor) -> None:
        """What rounding left out, pending, computed in ``values``' buffer (consumed); where that is not finite (an
        overflow: inf values, or a non-finite scale) the old residual instead, so that the memory never turns NaN,
        even if that step is taken."""
        previous = self.residuals.get(name)
        fresh = values.sub_(dequantized)
        self.pending[name] = (fresh.nan_to_num_(0.0, 0.0, 0.0) if previous is None else
                              torch.where(torch.isfinite(fresh), fresh, previous, out=fresh))

    def commit(self) -> None:
        """The step was taken: its residuals become the memory."""
        self.residuals.update(self.pending)
        self.pending.clear()

    def discard(self) -> None:
        """The step in flight is abandoned (a state dict is loaded): its errors are not kept."""
        self.pending.clear()

    def remap(self, name: str, old_indices: torch.Tensor | None, new_indices: torch.Tensor | None, numel: int) -> None:
        """Move ``name``'s residual from the old surviving coordinates to the new ones (None: drop it)."""
        residual = self.residuals.pop(name, None)
        if residual is None or old_indices is None or new_indices is None:
            return
        dense = residual.new_zeros(numel)
        dense.index_copy_(0, old_indices, residual)
        self.residuals[name] = dense.index_select(0, new_indices)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The residuals, as host copies by name."""
        return {name: r.detach().cpu().clone() for name, r in self.residuals.items()}

    def load_state_dict(self, residuals: dict[str, torch.Tensor], devices: dict[str, torch.device]) -> None:
        """Residuals checked by ``validate``, each moved to its tensor's device; nothing pending."""
        self.residuals = {name: residual.to(devices[name]) for name, residual in residuals.items()}
        self.pending.clear()

    def validate(self, residuals: Any, kept: dict[str, int]) -> dict[str, torch.Tensor]:
        """Saved residuals, checked against the surviving counts of the masks they go with."""
        if not isinstance(residuals, dict):
            raise CheckpointError(f"quantization residuals must be a dict of name -> tensor, got {type(residuals).__name__}")
        for name, residual in residuals.items():
            if not (isinstance(residual, torch.Tensor) and residual.is_floating_point() and residual.dim() == 1):
                raise CheckpointError(f"quantization residual of {name!r} must be a 1-D float tensor")
            if residual.numel() != kept.get(name):
                raise CheckpointError(f"quantization residual of {name!r} has {residual.numel()} values, its mask keeps "
                                      f"{kept.get(name, 'no')} coordinates")
        return residuals
