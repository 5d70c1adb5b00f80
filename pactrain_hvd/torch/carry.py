"""What Horovod's ``broadcast_optimizer_state`` carries of a torch ``PacTrainState``: its Horovod resume idiom.

``export()`` hands out the state as tensors that ``DistributedOptimizer.state_dict()`` puts into the
wrapped optimizer's entries (``checkpoint.py``); Horovod's broadcast writes another rank's values into
them in place, and the state adopts them before its next communication. A mixin of ``PacTrainState``
(``state.py``), whose attributes it reads.
"""

from __future__ import annotations

import numpy as np
import torch

from pactrain_hvd.torch.pruning import host_masks


class BroadcastCarry:
    """The state as broadcastable tensors, and their adoption after a broadcast."""

    def export(self) -> dict:
        """The PacTrain state as tensors: a uint8 mask per prunable tensor (all kept where none) and the
        schedule position, and ternary's held scales. Kept so that what ``hvd.broadcast_optimizer_state``
        writes into them in place reaches this state (``adopt_broadcast``)."""
        names = self.pruner.prunable_names if self.tracking else sorted(self.pruner.masks)
        masks = {name: (self.pruner.masks[name].to(torch.uint8).cpu() if name in self.pruner.masks
                        else torch.ones(self.parameters[name].shape, dtype=torch.uint8)) for name in names}
        self._exported = {"step": torch.tensor([self.cycle.step], dtype=torch.int64), "masks": masks}
        if self.quantized is not None:  # and its snapshot: only a change made by a broadcast is adopted
            scales = self.quantized.scale_vector(list(self.parameters))
            self._exported.update(scales=scales, scales_as_exported=scales.clone())
        return self._exported

    def adopt_broadcast(self) -> None:
        """Local: if the exported tensors changed (Horovod broadcast another rank's state into them), take it.
        Weights are not touched: they came with ``hvd.broadcast_parameters``, and autograd may be reading them."""
        exported, self._exported = self._exported, None
        if exported is None:
            return
        if "scales" in exported and not torch.equal(exported["scales"].nan_to_num(-1),
                                                    exported["scales_as_exported"].nan_to_num(-1)):
            self.quantized.hold_scales(list(self.parameters), exported["scales"], self.devices())
        step = int(exported["step"][0])
        masks = host_masks(exported["masks"], flags=True)
        held = {name: mask.cpu().numpy() for name, mask in self.pruner.masks.items()}
        if step == self.cycle.step and masks.keys() >= held.keys() and all(
                np.array_equal(mask, held[name]) if name in held else mask.all() for name, mask in masks.items()):
            return
        self.cycle.step = step
        self.install_masks(self.pruner.validate(masks), zero_weights=False)
