"""``DistributedOptimizer``'s arguments, checked as Horovod checks them, before anything is created or communicated."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import horovod.torch as hvd
import torch

from pactrain_hvd.core.settings import Settings, resolve
from pactrain_hvd.torch.compression import PACKED_WIRES
from pactrain_hvd.torch.pruning import host_masks

# Horovod's torch all-reduce carries fp16/fp32/fp64 gradients (bf16 travels as fp32, see compression.py);
# complex gradients it rejects mid-step ("Tensor type torch.ComplexFloatTensor is not supported").
_REDUCIBLE_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def checked_parameters(optimizer: torch.optim.Optimizer, named: Iterable | None) -> dict[str, torch.Tensor]:
    """The optimizer's parameters by name, in name order (the same on every rank). Names are validated
    exactly as Horovod does; names of parameters the optimizer does not hold are ignored, as there
    (fine-tuning: ``SGD(model.head.parameters())`` with ``model.named_parameters()``)."""
    optimized = [p for group in optimizer.param_groups for p in group["params"]]
    if named is None:
        return {f"allreduce.noname.{i}.{j}": p for i, g in enumerate(optimizer.param_groups) for j, p in enumerate(g["params"])}
    pairs = list(named)
    if any(not isinstance(pair, tuple) or len(pair) != 2 for pair in pairs):
        raise ValueError("named_parameters should be a sequence of (name, parameter) tuples, usually model.named_parameters()")
    names = [name for name, _ in pairs]
    wrong = [name for name in names if not isinstance(name, str)]
    if wrong:  # Horovod names each all-reduce after its parameter: it fails at the first backward pass
        raise TypeError(f"parameter names in named_parameters must be strings, got {wrong[0]!r} "
                        f"({type(wrong[0]).__name__})")
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"parameter names in named_parameters must be unique; duplicates: {', '.join(duplicates)}")
    named_ids = {id(p) for _, p in pairs}
    unnamed = [i for i, p in enumerate(optimized) if id(p) not in named_ids]
    if unnamed:
        raise ValueError(f"named_parameters was given, but optimizer parameters at positions {unnamed} are not named")
    optimized_ids = {id(p) for p in optimized}
    parameters = dict(sorted(((name, p) for name, p in pairs if id(p) in optimized_ids), key=lambda pair: pair[0]))
    for name, p in parameters.items():  # refused here, not half-way through a backward pass
        if p.requires_grad and p.dtype not in _REDUCIBLE_DTYPES:
            raise TypeError(f"parameter {name!r} has dtype {p.dtype}: Horovod all-reduces float16, bfloat16 (as float32), "
                            "float32 and float64 gradients; convert it or set requires_grad=False")
    return parameters


def checked_arguments(pactrain: dict[str, Any], *, compression: Any, stacklevel: int, **horovod: Any) -> Settings:
    """The settings (``core.settings.resolve``) and what only torch checks: the compressor and given masks.
    ``pactrain``: the PacTrain keywords; ``horovod``: Horovod's reduction arguments; ``stacklevel``: frames from
    here up to the façade's caller."""
    settings = resolve(hvd, pactrain, caller="pactrain_hvd.torch.DistributedOptimizer", tensors="torch.Tensor",
                       wires=PACKED_WIRES, stacklevel=stacklevel + 1, **horovod)
    # a Compressor class or, as Horovod takes it too, an instance of one (its methods are static)
    if not (callable(getattr(compression, "compress", None)) and callable(getattr(compression, "decompress", None))):
        raise TypeError(f"compression must be a Horovod compressor such as hvd.Compression.fp16 or "
                        f"hvd.Compression.none, got {compression!r} ({type(compression).__name__})")
    if isinstance(pactrain["masks"], Mapping):
        host_masks(dict(pactrain["masks"]))  # each mask readable as a tensor, refused by name (not deep in torch)
    return settings
