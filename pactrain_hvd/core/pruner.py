"""The framework-free half of both frontends' ``Pruner``: ranking, validation, the Mask Tracker, sparsity.

One interface for ``pactrain_hvd.torch.pruning.Pruner`` and ``pactrain_hvd.tensorflow.pruning.Pruner``:
``rank(step)`` (new masks, ranked on host copies of the weights and proven equal across ranks; nothing
installed), ``validate(masks)``, ``install(masks)``, ``verify(step)`` and ``sparsity()``. A frontend
supplies its tensor operations: shapes, host copies of weights and masks, weight digests, and the
all-gather that moves fingerprint tables.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from pactrain_hvd.core.fingerprint import check_fingerprints, fingerprint_table, mask_fingerprint
from pactrain_hvd.core.masks import magnitude_masks, not_finite, overall_sparsity, survivor_scales, validate_masks
from pactrain_hvd.core.schedule import Schedule


class HostPruner:
    """Masks of the prunable tensors, computed from host arrays so that every rank and both frontends rank
    alike, and proven equal on every rank: each rank's fingerprints are allgathered and any disagreement
    raises ``MaskMismatchError`` on every rank, naming the tensor, before a value is communicated with it.
    The fingerprints carry ``settings`` too (``core.agreement``): every check proves them equal."""

    framework = ""  # in mismatch messages
    kind = ""  # what the tensors are called in messages ("parameters", "variables")
    masks: dict[str, Any]

    def __init__(self, prunable_names: Sequence[str], schedule: Schedule, ranking: str,
                 settings: Mapping[str, Any] | None) -> None:
        self.prunable_names = list(prunable_names)
        self.schedule = schedule
        self.ranking = ranking
        self.settings = dict(settings or {})

    # -- what a frontend supplies ------------------------------------------------------------------
    def shape(self, name: str) -> tuple[int, ...]:
        raise NotImplementedError

    def host_weights(self) -> dict[str, np.ndarray]:
        """The prunable tensors' weights as host arrays (float32 at least: numpy has no bfloat16)."""
        raise NotImplementedError

    def host_masks(self) -> dict[str, np.ndarray]:
        """The held masks as host arrays."""
        raise NotImplementedError

    def weight_sums(self, weights: Mapping[str, np.ndarray] | None) -> dict[str, float]:
        """A float64 digest per prunable tensor: of ``weights`` (what masks were ranked on), else of the weights now."""
        raise NotImplementedError

    def fingerprint(self, mask: np.ndarray) -> tuple[int, int]:
        """A host mask's hash for the Mask Tracker (``core.fingerprint.mask_fingerprint``)."""
        return mask_fingerprint(mask)

    def held_fingerprints(self) -> dict[str, tuple[int, int]]:
        return {name: self.fingerprint(mask) for name, mask in self.host_masks().items()}

    def communicates(self) -> bool:
        """Whether there are ranks to check with (else ``verify`` does nothing)."""
        return True

    def allgather(self, table: np.ndarray) -> tuple[np.ndarray, int]:
        """Every rank's int64 table, concatenated, and the number of ranks."""
        raise NotImplementedError

    hint = ""  # how a user of this frontend shares masks, in mismatch messages

    # -- the interface -----------------------------------------------------------------------------
    def rank(self, step: int, verify: bool = True) -> dict[str, np.ndarray]:
        """Masks at the schedule's target for ``step``, ranked on the current weights and (``verify``) proven
        equal across ranks; nothing is installed.

        Weights holding NaN or inf raise ``NonFiniteWeightsError`` (with ``verify``: on every rank, whichever
        rank holds them).
        """
        weights = self.host_weights()
        broken = not_finite(weights) if verify else []
        if broken:
            self.verify(step, weights=weights, not_finite=broken)  # raises on every rank
        new_masks = magnitude_masks(weights, self.schedule.target(step), self.host_masks(), self.ranking)
        if verify:
            self.verify(step, new_masks, weights)
        return new_masks

    def validate(self, masks: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Check names, shapes and dtypes of externally supplied masks; nothing is changed."""
        return validate_masks(masks, {name: self.shape(name) for name in self.prunable_names}, self.kind)

    def verify(self, step: int, masks: Mapping[str, np.ndarray] | None = None,
               weights: Mapping[str, np.ndarray] | None = None, not_finite: Sequence[str] = ()) -> None:
        """Mask Tracker: allgather each rank's fingerprint table (masks: ``masks``, else the held ones; schedule
        ``step``; a digest of the weights, see ``weight_sums``; ``settings``) and raise on any disagreement, on
        every rank. ``not_finite``: tensors whose weights cannot be ranked (every rank then raises)."""
        if not self.communicates():
            return
        fingerprints = (self.held_fingerprints() if masks is None
                        else {name: self.fingerprint(mask) for name, mask in masks.items()})
        numels = {name: int(np.prod(self.shape(name), dtype=np.int64)) for name in self.prunable_names}
        local = fingerprint_table(numels, fingerprints, step, self.weight_sums(weights), self.settings, not_finite)
        gathered, size = self.allgather(local)
        check_fingerprints(self.prunable_names, gathered, size, self.framework, self.hint, self.settings)

    def survivor_scales(self, masks: Mapping[str, np.ndarray] | None = None) -> dict[str, float]:
        """``core.survivor_scales`` of ``masks`` (else the held ones) on the weights now, before they are zeroed."""
        return survivor_scales(self.host_weights(), self.host_masks() if masks is None else masks)

    def sparsity(self) -> float:
        """Fraction of pruned coordinates over all prunable tensors."""
        return overall_sparsity({name: int(np.prod(self.shape(name), dtype=np.int64)) for name in self.prunable_names},
                                {name: int(mask.sum()) for name, mask in self.masks.items()})
