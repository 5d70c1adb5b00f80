"""Collective helpers on a ``DistributedOptimizer`` (Horovod's module name): broadcast its PacTrain state."""

from __future__ import annotations

import horovod.torch as hvd
import numpy as np
import torch

from pactrain_hvd.torch.optimizer import DistributedOptimizer


def broadcast_masks(optimizer: DistributedOptimizer, root_rank: int = 0) -> None:
    """Give every rank ``root_rank``'s masks, schedule position and held quantization scales (start and resume).

    Use next to ``hvd.broadcast_parameters`` and ``hvd.broadcast_optimizer_state``. Collective: every rank of
    the optimizer's process set calls it; the Mask Tracker then proves the result at once.

    Args:
        optimizer: the ``pt.DistributedOptimizer`` whose PacTrain state is broadcast.
        root_rank: the rank whose masks every rank takes.

    Raises:
        TypeError: ``optimizer`` is not a ``pactrain_hvd.torch.DistributedOptimizer``.
    """
    if not isinstance(optimizer, DistributedOptimizer):
        raise TypeError(f"broadcast_masks needs a pactrain_hvd.torch.DistributedOptimizer, got {type(optimizer).__name__}")
    state, process_set = optimizer.pactrain_state, optimizer.process_set
    held, ternary = state.masks(), state.quantized
    scales = ternary.scale_vector(list(state.parameters)) if ternary is not None else None
    header = hvd.broadcast_object({"step": state.step_count, "masked": sorted(held), "scales": scales},
                                  root_rank, name="pactrain.masks_header", process_set=process_set)
    masks = {}
    for name in header["masked"]:
        param = state.parameters[name]
        local = held.get(name)
        flags = (local if local is not None else torch.ones_like(param, dtype=torch.bool)).to(torch.uint8)
        flags = hvd.broadcast(flags.cpu(), root_rank, name=f"pactrain.mask.{name}", process_set=process_set)
        masks[name] = flags.numpy().astype(np.bool_)
    state.adopt(header["step"], masks, header["scales"])
    state.verify_now()


def broadcast_optimizer_state(optimizer: DistributedOptimizer, root_rank: int = 0) -> None:
    """``hvd.broadcast_optimizer_state``, then the Mask Tracker proves the result at once, not at the next step.

    Horovod's broadcast carries masks and schedule position (see ``state_dict``). Collective: every rank of
    the optimizer's process set calls it.

    Args:
        optimizer: the ``pt.DistributedOptimizer`` whose state (the wrapped optimizer's and PacTrain's) is broadcast.
        root_rank: the rank whose state every rank takes.

    Raises:
        TypeError: ``optimizer`` is not a ``pactrain_hvd.torch.DistributedOptimizer``.
    """
    if not isinstance(optimizer, DistributedOptimizer):
        raise TypeError(f"broadcast_optimizer_state needs a pactrain_hvd.torch.DistributedOptimizer, "
                        f"got {type(optimizer).__name__}")
    hvd.broadcast_optimizer_state(optimizer, root_rank=root_rank)
    optimizer.pactrain_state.verify_now()
