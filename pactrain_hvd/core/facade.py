"""What an optimizer façade reads of the state it drives, alike in every frontend."""

from __future__ import annotations

from typing import Any


class StateReadings:
    """``step_count``, ``masks()``, ``stats()`` and ``set_masks()`` of a façade, from its ``pactrain_state``
    (torch's and TF's ``PacTrainState``)."""

    pactrain_state: Any

    @property
    def step_count(self) -> int:
        """Optimizer steps taken: the schedule position."""
        return self.pactrain_state.step_count

    def masks(self) -> dict[str, Any]:
        """``{name: bool mask}`` for every pruned tensor (copies: torch tensors in torch, numpy arrays in TF)."""
        return self.pactrain_state.masks()

    def stats(self) -> dict:
        """The last step's wire bytes (sent and dense-equivalent), bits per packed value, per-tensor density and
        plan (``PacTrainState.stats``)."""
        return self.pactrain_state.stats()

    def set_masks(self, masks: dict[str, Any]) -> None:
        """Replace the masks (bool tensors or arrays by name); local, no communication: ranks prove they agree at
        the next step that every rank checks (see ``PacTrainState.set_masks``)."""
        self.pactrain_state.set_masks(masks)
