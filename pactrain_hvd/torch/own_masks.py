"""Bring your own mask (torch): masks from ``torch.nn.utils.prune`` or a dict, keyed by parameter name.

``torch.nn.utils.prune`` (any method, ``PruningContainer`` included) replaces ``<name>`` by a
parameter ``<name>_orig``, a buffer ``<name>_mask`` and a forward pre-hook computing
``<name> = <name>_orig * <name>_mask``. The optimizer updates ``<name>_orig``, so that is the
tensor PacTrain masks and packs; the rule for given masks is in ``pactrain_hvd.core.own_masks``.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch.nn.utils import prune

from pactrain_hvd.core.own_masks import binary_mask, check_mask_names

logger = logging.getLogger("pactrain_hvd")


def torch_prune_masks(model: torch.nn.Module) -> dict[torch.Tensor, tuple[str, torch.Tensor]]:
    """``{<name>_orig parameter: (its name in model, <name>_mask buffer)}`` for every tensor pruned in ``model``."""
    found = {}
    for prefix, module in model.named_modules():
        for hook in module._forward_pre_hooks.values():
            if isinstance(hook, prune.BasePruningMethod):  # PruningContainer is one too
                tensor_name = hook._tensor_name
                name = f"{prefix}.{tensor_name}_orig" if prefix else f"{tensor_name}_orig"
                found[getattr(module, f"{tensor_name}_orig")] = (name, getattr(module, f"{tensor_name}_mask"))
    return found


def resolve_masks(masks: Mapping[str, Any] | torch.nn.Module, names: Mapping[torch.Tensor, str],
                  ) -> tuple[dict[str, np.ndarray], dict[str, torch.Tensor]]:
    """``masks=`` as host masks by optimizer name, plus the prune buffers to keep in step with them."""
    if isinstance(masks, torch.nn.Module):
        found = torch_prune_masks(masks)
        if not found:
            raise ValueError(f"masks={type(masks).__name__}(...) has no tensor pruned with torch.nn.utils.prune: "
                             "prune it first, or give masks as {parameter name: bool mask}")
        stray = sorted(name for p, (name, _) in found.items() if p not in names)
        if stray:
            raise ValueError(f"masks=model: pruned parameters {', '.join(stray)} are not in named_parameters")
        buffers = {names[p]: buffer for p, (_, buffer) in found.items()}
        host = {name: binary_mask(name, buffer.detach().cpu().numpy()) for name, buffer in buffers.items()}
        logger.info("pactrain_hvd: masks of %d tensors taken from torch.nn.utils.prune: %s", len(host), ", ".join(host))
        return host, buffers
    if not isinstance(masks, Mapping):
        raise TypeError(f"masks must be a dict {{parameter name: bool mask}} or a module pruned with "
                        f"torch.nn.utils.prune, got {type(masks).__name__}")
    check_mask_names(masks, names.values(), "parameters")
    return {name: torch.as_tensor(mask).cpu().numpy() for name, mask in masks.items()}, {}


def warn_if_torch_pruned(names: Mapping[torch.Tensor, str]) -> None:
    """Parameters named ``*_orig`` without ``masks=``: the schedule would re-prune them from scratch."""
    pruned = sorted(name for name in names.values() if name.endswith("_orig"))
    if pruned:
        warnings.warn(f"parameters {', '.join(pruned[:3])}{'...' if len(pruned) > 3 else ''} look pruned with "
                      "torch.nn.utils.prune: pass masks=model to keep those masks (otherwise the schedule prunes anew)",
                      stacklevel=3)


@torch.no_grad()
def sync_prune_buffers(buffers: Mapping[str, torch.Tensor], masks: Mapping[str, torch.Tensor]) -> None:
    """Write PacTrain's masks into the prune buffers, so ``prune.remove`` and the forward hook agree with them."""
    for name, buffer in buffers.items():
        if name in masks:
            buffer.copy_(masks[name].to(buffer.dtype))
