"""``DistributedOptimizer``'s arguments, checked as Horovod checks them, before anything is created or communicated."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import horovod.torch as hvd
import torch

from pactrain_hvd.core import PacTrainConfig
from pactrain_hvd.core.config import (
    check_process_set,
    checked_groups,
    passes_per_step,
    reduce_op_name,
    require_initialized,
)
from pactrain_hvd.core.encodings import ENCODINGS
from pactrain_hvd.core.own_masks import schedule_sparsity
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


def checked_arguments(*, backward_passes_per_step: Any, compression: Any, op: Any, gradient_predivide_factor: float,
                      groups: Any, process_set: Any,
                      packed_values: str, sparsity: float, masks: Any, continue_pruning: bool,
                      **schedule_and_plan: Any) -> tuple[PacTrainConfig, int | list | None]:
    """The PacTrain config and ``groups`` (a number as an ``int``); ``packed_values`` as
    ``core.encodings.packed_values_argument`` read it."""
    config = PacTrainConfig.from_arguments(sparsity=schedule_sparsity(sparsity, masks is not None, continue_pruning),
                                           **schedule_and_plan)
    passes_per_step(backward_passes_per_step)
    # a Compressor class or, as Horovod takes it too, an instance of one (its methods are static)
    if not (callable(getattr(compression, "compress", None)) and callable(getattr(compression, "decompress", None))):
        raise TypeError(f"compression must be a Horovod compressor such as hvd.Compression.fp16 or "
                        f"hvd.Compression.none, got {compression!r} ({type(compression).__name__})")
    op_name = reduce_op_name(hvd, op, gradient_predivide_factor)
    if config.sync_every > 1 and op_name != "Average":
        raise ValueError(f"sync_every={config.sync_every} needs op=hvd.Average (the outer sync averages the ranks' "
                         f"progress; local steps reduce no gradients), got op=hvd.{op_name}")
    groups = checked_groups(groups, "torch.Tensor")
    check_process_set(hvd, process_set)
    if isinstance(masks, Mapping):
        host_masks(dict(masks))  # each mask readable as a tensor, refused by name (not deep in torch)
    ENCODINGS[packed_values].check(op_name, groups is not None)
    ENCODINGS[packed_values].wire_of(PACKED_WIRES, "horovod.torch")
    require_initialized(hvd, "pactrain_hvd.torch.DistributedOptimizer")
    return config, groups
