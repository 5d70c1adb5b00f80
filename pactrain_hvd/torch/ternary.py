"""Ternary values for packed tensors: what each rank remembers between steps, and how they travel.

GRACE's split: ``PacTrainCompressor.compress_ternary`` decides what to send, ``ErrorFeedback`` is the
memory, ``TernaryReduction`` moves it: one MAX all-reduce agrees every tensor's scale, then each
tensor's lane-packed int32 words go through an ordinary SUM all-reduce (fused by Horovod). It runs
in ``synchronize()``, once every gradient is ready, so no rank blocks inside a backward hook.
"""

from __future__ import annotations

from typing import Any

import horovod.torch as hvd
import torch
from horovod.torch.mpi_ops import allreduce_async_

from pactrain_hvd.core import CheckpointError
from pactrain_hvd.core.lanes import LaneLayout
from pactrain_hvd.torch.compression import PacTrainCompressor
from pactrain_hvd.torch.lanes import stochastic_ternary

_NOISE_SEED = 0x7E4A  # rounding noise: seeded with this plus the rank, so ranks draw independently


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

    def add(self, name: str, values: torch.Tensor) -> torch.Tensor:
        residual = self.residuals.get(name)
        return values if residual is None else values + residual

    def store(self, name: str, values: torch.Tensor, dequantized: torch.Tensor, scale: torch.Tensor) -> None:
        """What rounding left out, pending; under a non-finite scale (an overflow on some rank, which every
        rank sees through the MAX) the old residual instead of NaN, even if that step is taken."""
        previous = self.residuals.get(name)
        fresh = values - dequantized
        self.pending[name] = torch.where(torch.isfinite(scale), fresh,
                                         previous if previous is not None else torch.zeros_like(fresh))

    def commit(self) -> None:
        """The step was taken: its residuals become the memory."""
        self.residuals.update(self.pending)
        self.pending.clear()

    def remap(self, name: str, old_indices: torch.Tensor | None, new_indices: torch.Tensor | None, numel: int) -> None:
        """Move ``name``'s residual from the old surviving coordinates to the new ones (None: drop it)."""
        residual = self.residuals.pop(name, None)
        if residual is None or old_indices is None or new_indices is None:
            return
        dense = residual.new_zeros(numel)
        dense.index_copy_(0, old_indices, residual)
        self.residuals[name] = dense.index_select(0, new_indices)

    def validate(self, residuals: Any, kept: dict[str, int]) -> dict[str, torch.Tensor]:
        """Saved residuals, checked against the surviving counts of the masks they go with."""
        if not isinstance(residuals, dict):
            raise CheckpointError(f"ternary residuals must be a dict of name -> tensor, got {type(residuals).__name__}")
        for name, residual in residuals.items():
            if not (isinstance(residual, torch.Tensor) and residual.is_floating_point() and residual.dim() == 1):
                raise CheckpointError(f"ternary residual of {name!r} must be a 1-D float tensor")
            if residual.numel() != kept.get(name):
                raise CheckpointError(f"ternary residual of {name!r} has {residual.numel()} values, its mask keeps "
                                      f"{kept.get(name, 'no')} coordinates")
        return residuals


class NoiseSource:
    """Uniform [0, 1) noise for stochastic rounding; one generator per device."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._generators: dict[torch.device, torch.Generator] = {}

    def uniform(self, count: int, device: torch.device) -> torch.Tensor:
        return torch.rand(count, generator=self._generator(device), device=device)

    def _generator(self, device: torch.device) -> torch.Generator:
        generator = self._generators.get(device)
        if generator is None:
            generator = self._generators[device] = torch.Generator(device=device).manual_seed(self.seed)
        return generator

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {str(device): generator.get_state() for device, generator in self._generators.items()}

    def load_state_dict(self, states: dict[str, torch.Tensor]) -> None:
        for device, state in states.items():
            self._generator(torch.device(device)).set_state(state)


class TernaryReduction:
    """Shared-scale stochastic ternary all-reduce of packed tensors, with error feedback.

    Example::

        >>> reduction = TernaryReduction(ternary_layout(hvd.size()), hvd.global_process_set)
        >>> launched = reduction.allreduce_async([(name, grad, compressor)], average=True)
        >>> grad = compressor.decompress(synchronize(launched[0][0]), launched[0][1])
    """

    def __init__(self, layout: LaneLayout, process_set: hvd.ProcessSet) -> None:
        self.layout = layout
        self.process_set = process_set
        self.memory = ErrorFeedback()
        self.noise = NoiseSource(_NOISE_SEED + process_set.rank())

    def state_dict(self) -> dict[str, Any]:
        """This rank's error memory and rounding noise: what an exact resume needs besides the masks."""
        return {"rank": self.process_set.rank(), "noise": self.noise.state_dict(),
                "residuals": {name: r.detach().cpu().clone() for name, r in self.memory.residuals.items()}}

    def allreduce_async(self, tensors: list[tuple[str, torch.Tensor, PacTrainCompressor]],
                        average: bool) -> list[tuple[Any, Any, torch.Tensor]]:
        """Start one int32 SUM all-reduce per ``(name, gradient, compressor)``: ``(handle, ctx, words)`` each.

        Blocks once, on the MAX all-reduce of all scales; every rank must call it with the same names.
        """
        values = [self.memory.add(name, compressor.gather(grad).float()) for name, grad, compressor in tensors]
        if not values:
            return []
        device = values[0].device
        local = torch.stack([(v.abs().max() if v.numel() else v.new_zeros(())).to(device) for v in values])
        scales = hvd.allreduce(local, op=hvd.Max, name="pactrain.ternary.scales", process_set=self.process_set)
        divisor = float(self.layout.world_size) if average else 1.0
        launched = []
        for (name, grad, compressor), value, scale in zip(tensors, values, scales):
            scale = scale.to(value.device)
            ternary = stochastic_ternary(value, scale, self.noise.uniform(value.numel(), value.device))
            self.memory.store(name, value, ternary.to(value.dtype) * scale, scale)
            words, ctx = compressor.compress_ternary(grad, ternary, scale, divisor)
            handle = allreduce_async_(words, name=name, op=hvd.Sum, process_set=self.process_set)
            launched.append((handle, ctx, words))
        return launched
