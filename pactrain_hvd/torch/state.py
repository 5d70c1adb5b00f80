"""``PacTrainState``: what persists between a torch ``DistributedOptimizer``'s steps.

The torch mirror of ``pactrain_hvd.tensorflow.PacTrainState``: schedule position, masks (by the
``Pruner``), the packing plan (a ``PacTrainCompressor`` per parameter), quantization memory and held
scales, Mask Tracker bookkeeping and wire accounting. It holds no Horovod handles and never
all-reduces gradients (that is ``engine.py``); the only collectives it makes are the Mask
Tracker's. Checkpoint format: ``checkpoint.py``.
"""

from __future__ import annotations

import os
from typing import Any

import horovod.torch as hvd
import numpy as np
import torch
from horovod.torch.compression import Compression, Compressor

from pactrain_hvd.core import PacTrainConfig, StepStats, TensorStats, should_pack
from pactrain_hvd.core.cycle import PruningCycle
from pactrain_hvd.core.encodings import ENCODINGS
from pactrain_hvd.core.lanes import quantized_layout
from pactrain_hvd.core.lifecycle import StepLifecycle
from pactrain_hvd.torch.carry import BroadcastCarry
from pactrain_hvd.torch.compression import PACKED_WIRES, PacTrainCompressor
from pactrain_hvd.torch.outer import OuterSync
from pactrain_hvd.torch.own_masks import resolve_masks, sync_prune_buffers, warn_if_torch_pruned
from pactrain_hvd.torch.pruning import (
    Prunable,
    Pruner,
    PruningReadout,
    SharedMaskOperations,
    host_masks,
    select_prunable,
    zero_stays_zero,
)
from pactrain_hvd.torch.quantized import QuantizedReduction


class PacTrainState(PruningReadout, SharedMaskOperations, BroadcastCarry):
    """Schedule position, masks, packing plan, quantization memory and wire accounting of one optimizer.

    ``pt.DistributedOptimizer`` makes one from its arguments and exposes it as
    ``opt.pactrain_state``; the optimizer's ``step_count``, ``masks()``, ``stats()`` and
    ``set_masks()`` are this object's. ``verify()`` runs the Mask Tracker now (a collective call:
    every rank of the process set makes it).

    Args:
        parameters: the optimized parameters by name.
        optimizer: the wrapped ``torch.optim`` optimizer (its state at pruned coordinates is cleared).
        config: the checked PacTrain settings (schedule, ranking, packing, Mask Tracker period, local steps).
        prunable: a predicate ``(name, param) -> bool`` or glob patterns on names; None: ``default_prunable``,
            or only the parameters ``masks`` covers.
        masks: the user's own masks, ``{name: bool mask}`` or a model pruned by ``torch.nn.utils.prune``
            (see ``core.own_masks``).
        compression: Horovod compressor of the values that travel (packed ones too with ``"inherit"``).
        packed_values: how packed values travel: ``"inherit"``, ``"fp16"``, ``"bf16"``, ``"ternary"`` or ``"int3"``.
        process_set: the Horovod process set the optimizer reduces over; its ranks prove masks equal.
        settings: further settings (Horovod's reduction) the Mask Tracker proves equal on every rank.

    Example::

        >>> opt = pt.DistributedOptimizer(opt, named_parameters=model.named_parameters(), sparsity=0.9)
        >>> state = opt.pactrain_state
        >>> state.step_count, state.stats()["sparsity"], sorted(state.masks())
        >>> state.verify()   # on every rank: raises MaskMismatchError on every rank if masks differ
    """

    def __init__(self, parameters: dict[str, torch.Tensor], optimizer: torch.optim.Optimizer, config: PacTrainConfig,
                 *, prunable: Prunable = None, masks: dict[str, Any] | torch.nn.Module | None = None,
                 compression: type[Compressor] = Compression.none, packed_values: str = "inherit",
                 process_set: hvd.ProcessSet = hvd.global_process_set, settings: dict[str, Any] | None = None) -> None:
        self.config = config
        self.process_set = process_set
        self.packed_values = packed_values
        self._parameters = parameters
        self._names = {p: name for name, p in parameters.items()}
        self._optimizer = optimizer
        own_masks, self._prune_buffers = resolve_masks(masks, self._names) if masks is not None else ({}, {})
        if masks is None:
            warn_if_torch_pruned(self._names)
        prunable_names = sorted(own_masks) if own_masks and prunable is None else select_prunable(parameters, prunable)
        shared = {**config.shared_settings(), "packed_values": packed_values, **(settings or {})}
        self.pruner = Pruner(parameters, prunable_names, config.schedule, config.ranking, process_set, settings=shared)
        # Horovod's rule: a rank communicates if it is in the process set and there is someone to talk to.
        self.communicating = process_set.included() and (hvd.size() > 1 or os.environ.get("HOROVOD_ELASTIC") == "1")
        # Masks can differ only where some are pruned; then every rank proves them every ``verify_every`` steps.
        self.tracking = bool(prunable_names) and (config.sparsity > 0 or bool(own_masks))
        self.cycle = PruningCycle(config, self.tracking, self.communicating)
        self.lifecycle = StepLifecycle(self.cycle, self)
        self._exported: dict | None = None  # the tensors last handed out by export(), see adopt_broadcast
        self._zero_stays_zero = zero_stays_zero(optimizer)
        self.weights_unmasked = False  # masks changed without zeroing the weights (adopted mid-backward)
        self._stats = StepStats()
        encoding = ENCODINGS[packed_values]
        layout = quantized_layout(process_set.size(), encoding.levels) if encoding.quantized else None
        self._quantized = QuantizedReduction(process_set, encoding.levels) if layout is not None else None
        self._compression = compression
        self._packed_compression = encoding.wire_of(PACKED_WIRES, "horovod.torch") or compression
        self._compressors: dict[torch.Tensor, PacTrainCompressor] = {}
        # With local steps: the anchor and outer momentum (None: every step's gradients are reduced).
        self.outer = OuterSync(parameters, config.outer_lr, config.outer_momentum) if self.cycle.local else None
        self.rebuild_plan()
        if own_masks:
            self.set_masks(own_masks)  # validated; proven equal on all ranks before the first all-reduce

    # -- what users read ------------------------------------------------------------------------
    def stats(self) -> dict:
        """The last step's wire bytes (sent and dense-equivalent), bits per packed value, per-tensor density and plan.

        ``values`` says how packed values travelled: as the ``packed_values`` argument, or ``"fp16"`` where a
        quantized encoding fell back (too many ranks for 3 lanes per word).
        """
        encoding = ENCODINGS[self.packed_values].reported(lanes_fit=self._quantized is not None)
        return dict(self._stats.as_dict(), sparsity=self.pruner.sparsity(), values=encoding)

    def set_masks(self, masks: dict[str, Any]) -> None:
        """Replace the masks (bool tensors or arrays by parameter name); local, no communication.

        Ranks prove they agree at the first step, then every ``verify_every`` steps.
        """
        self.install_masks(self.pruner.validate(host_masks(masks)))

    def verify(self) -> None:
        """Mask Tracker, now: a collective call that raises ``MaskMismatchError`` on every rank."""
        self.pruner.verify(self.cycle.step)

    # -- what checkpoints, broadcasts and the engine read (checkpoint.py, functions.py, engine.py) --------
    @property
    def parameters(self) -> dict[str, torch.Tensor]:
        """The optimized parameters by name, in name order."""
        return self._parameters

    @property
    def names(self) -> dict[torch.Tensor, str]:
        """Each parameter's name."""
        return self._names

    @property
    def quantized(self) -> QuantizedReduction | None:
        """The quantized reduction (error memory, rounding noise, held scales), or None where values are not quantized."""
        return self._quantized

    def fit_masks(self, masks: dict[str, Any]) -> dict[str, np.ndarray]:
        """Masks (bool or uint8 flags, tensors or arrays) as validated host masks of these parameters; raises
        ``TypeError`` or ``ValueError`` where they do not fit."""
        return self.pruner.validate(host_masks(masks, flags=True))

    def load_quantized(self, saved: dict) -> None:
        """This rank's saved error memory (``QuantizedReduction.state_dict``'s, validated; a rounding-noise state
        that checkpoints before keyed noise hold is not needed), for the parameters whose plan rounds them to
        quantized codes."""
        self._quantized.memory.load_state_dict({name: residual for name, residual in saved["residuals"].items()
                                              if self.compressor(self._parameters[name]).lanes is not None},
                                             self.devices())

    # -- masks and plan ---------------------------------------------------------------------------
    def adopt(self, step: int, masks: dict[str, np.ndarray], scales: torch.Tensor | None = None,
              zero_weights: bool = True) -> None:
        """Take another rank's or a checkpoint's schedule position, masks and (quantized) held scales;
        ``scales`` None: none held."""
        self.cycle.step = int(step)
        self.install_masks(masks, zero_weights)
        if self._quantized is not None:
            self._quantized.hold_scales(list(self._parameters), scales if scales is not None
                                      else torch.full((len(self._parameters),), float("nan")), self.devices())

    def install_masks(self, masks: dict[str, np.ndarray], zero_weights: bool = True) -> None:
        self._exported = None
        self.weights_unmasked |= not zero_weights
        self.pruner.install(masks, zero_weights)
        self._after_mask_change()

    def _after_mask_change(self) -> None:
        self.pruner.clear_optimizer_state(self._optimizer.state)
        if self.outer is not None:
            self.outer.mask(self.pruner.masks)
        sync_prune_buffers(self._prune_buffers, self.pruner.masks)
        self.rebuild_plan()

    def rebuild_plan(self) -> None:
        """Per tensor: packed, dense-masked or untouched. Same masks, so same plan on every rank."""
        cfg = self.config
        previous, self._compressors = self._compressors, {}
        for name, p in self._parameters.items():
            mask = self.pruner.masks.get(name)
            packed = mask is not None and should_pack(p.numel(), int(mask.sum()), cfg.pack_min_numel, cfg.pack_max_density)
            lanes = self._quantized.layout if packed and self._quantized is not None else None
            self._compressors[p] = PacTrainCompressor(mask, self._packed_compression if packed else self._compression,
                                                      packed=packed, lanes=lanes)
            if self._quantized is not None and p in previous:
                self._quantized.memory.remap(name, previous[p].surviving_indices,
                                           self._compressors[p].surviving_indices if lanes else None, p.numel())

    def compressor(self, p: torch.Tensor) -> PacTrainCompressor:
        return self._compressors[p]

    def follow_world_size(self) -> None:
        """Digits per word and the average's divisor follow the world size (Horovod elastic changes it)."""
        size = self.process_set.size()
        if size == self._quantized.layout.world_size:
            return
        layout = quantized_layout(size, self._quantized.layout.levels)
        if layout is None:
            raise RuntimeError(f"packed_values={self.packed_values!r}: the world size changed to {size}, where lanes "
                               "no longer pay; recreate the optimizer with packed_values='fp16'")
        self._quantized.layout = layout
        for compressor in self._compressors.values():
            if compressor.lanes is not None:
                compressor.lanes = layout

    # -- the step: ``core.lifecycle.StepLifecycle`` decides the order, these are its mask operations ----
    def before_communication(self) -> None:
        """Before each of the step's communications (from the engine)."""
        self.lifecycle.before_communication()

    def verify_now(self) -> None:
        """After a collective call every rank makes (broadcasts, elastic sync): the check is due everywhere."""
        self.cycle.request_verification()
        self.lifecycle.verify_if_due()

    def before_update(self) -> bool:
        """After the reduction, before the wrapped optimizer's update; returns whether ``after_update`` re-zeroes."""
        remask = self.lifecycle.before_update()
        if self.cycle.local:
            self._stats = StepStats(step=self.cycle.step)  # a local step sends nothing
        return remask

    def after_update(self, remask: bool) -> bool:
        """After the update; returns whether the outer sync of local steps is due now."""
        return self.lifecycle.after_update(remask)

    @property
    def gradients_masked_by_reduction(self) -> bool:
        return self.communicating and not self.cycle.local

    def rank_masks(self, step: int, early: bool) -> None:
        """Ranked from the weights every rank holds (after the user's broadcast; with local steps, the anchor's)
        and proven equal across ranks before anything is packed with them."""
        self.pruner.update(step, verify=self.communicating, zero_weights=not early)
        self._exported = None
        self.weights_unmasked |= early
        self._after_mask_change()

    def needs_remask(self, step: int) -> bool:
        return not self._zero_stays_zero or self.weights_unmasked or self.config.verifies_at(step)

    def commit_codec_memory(self) -> None:
        if self._quantized is not None:
            self._quantized.memory.commit()

    def begin_interval(self) -> None:
        self.outer.take_anchor()

    def synced(self) -> None:
        """The outer sync is done: its quantization residuals are kept."""
        self.commit_codec_memory()

    def discard_step(self) -> None:
        """The step in flight is abandoned (a state dict is loaded): its quantization residuals are not kept."""
        if self._quantized is not None:
            self._quantized.memory.discard()

    def reduced(self) -> None:
        """The step's gradients are reduced: ``stats()`` describes this step."""
        if self.communicating:
            self._stats.step = self.cycle.step

    # -- wire accounting ---------------------------------------------------------------------------
    def record(self, p: torch.Tensor, sent_bytes: int) -> None:
        compressor = self._compressors[p]
        numel = p.numel()
        self._stats.tensors[self._names[p]] = TensorStats(
            numel=numel, kept=numel if compressor.kept is None else compressor.kept, packed=compressor.packed,
            sent_bytes=sent_bytes, dense_bytes=numel * p.element_size())

    def devices(self) -> dict[str, torch.device]:
        """Each parameter's device, by name."""
        return {name: p.device for name, p in self._parameters.items()}
