"""Quantized values for packed tensors (ternary, int3): what each rank remembers between steps, and how they travel.

GRACE's split: ``PacTrainCompressor.compress_codes`` decides what to send, ``ErrorFeedback``
(``memory.py``) is the memory, ``QuantizedReduction`` moves it. Each tensor's codes are rounded at a
scale every rank already holds: the MAX over ranks of the previous step's ``local_scale`` (a
multiple of each rank's mean ``|value|``; identical everywhere, since it came from a collective).
So the codes' SUM all-reduce starts from the gradient hook, as fp16 values do, with no blocking
collective in between; beside it, an asynchronous MAX all-reduce of this step's ``local_scale``
gives the next step's scale. A value beyond the held scale is sent as ``sign * scale`` and the rest
stays in the error memory. Only where no scale is held yet (the first step, a new tensor, a
checkpoint without scales) the codes wait for this step's MAX, in ``synchronize()``. Both cases
issue the same two collectives under the same names, so ranks that disagree about a held scale
cannot hang.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import horovod.torch as hvd
import torch
from horovod.torch.mpi_ops import allreduce_async_, synchronize

from pactrain_hvd.core import CheckpointError
from pactrain_hvd.core.lanes import LaneLayout, quantized_layout
from pactrain_hvd.torch.compression import PacTrainCompressor
from pactrain_hvd.torch.lanes import Noise, local_scale, stochastic_codes
from pactrain_hvd.torch.memory import ErrorFeedback


@dataclass
class QuantizedSend:
    """One tensor's ternary all-reduce in flight: this step's MAX, and the codes once a scale is known."""

    name: str
    grad: torch.Tensor
    compressor: PacTrainCompressor
    values: torch.Tensor  # gathered survivors plus the error memory, fp32 (spent once the codes are made)
    divisor: float
    max_handle: Any
    step: int  # the schedule position: the rounding noise's
    words: torch.Tensor | None = None
    words_handle: Any = None
    ctx: Any = None


class QuantizedReduction:
    """Stochastic quantized all-reduce of packed tensors at held scales, with error feedback (``levels`` levels
    each side of 0: 1 for ternary values). The lane layout follows the process set's size (``layout``).

    Example::

        >>> reduction = QuantizedReduction(hvd.global_process_set, levels=1)
        >>> send = reduction.start(name, grad, compressor, average=True)   # from the gradient hook
        >>> grad = reduction.finish(send)                                   # in synchronize()
    """

    def __init__(self, process_set: hvd.ProcessSet, levels: int = 1) -> None:
        layout = quantized_layout(process_set.size(), levels)
        if layout is None:
            raise ValueError(f"{levels}-level codes do not fit int32 lanes on {process_set.size()} ranks: use fp16")
        self.layout: LaneLayout = layout
        self.process_set = process_set
        self.memory = ErrorFeedback()
        self.noise = Noise(process_set.rank())
        self.scales: dict[str, torch.Tensor] = {}  # per tensor, the scale of its next send (fp32 scalar)

    def state_dict(self) -> dict[str, Any]:
        """This rank's error memory: what an exact resume needs besides the masks, the step and the held scales
        (those are the same on every rank: ``scale_vector``; the noise is the step's)."""
        return {"rank": self.process_set.rank(), "residuals": self.memory.state_dict()}

    def scale_vector(self, names: list[str]) -> torch.Tensor:
        """The held scales of ``names`` as one fp32 CPU tensor, NaN where none is held (a sync: checkpoints only)."""
        nan = torch.tensor(float("nan"))
        return torch.stack([self.scales[name].detach().float().cpu() if name in self.scales else nan
                            for name in names]) if names else torch.zeros(0)

    def hold_scales(self, names: list[str], vector: torch.Tensor, devices: dict[str, torch.device]) -> None:
        """Hold the scales of ``scale_vector`` (NaN: none), replacing all others."""
        if vector.shape != (len(names),):
            raise CheckpointError(f"quantization scales must be a vector of {len(names)} values, got shape {tuple(vector.shape)}")
        self.scales = {name: value.to(devices[name]) for name, value in zip(names, vector.float())
                       if not torch.isnan(value)}

    def start(self, name: str, grad: torch.Tensor, compressor: PacTrainCompressor, average: bool,
              step: int) -> QuantizedSend:
        """Launch ``name``'s MAX all-reduce, and its codes' SUM all-reduce where a scale is held, at schedule
        position ``step``. No sync."""
        values, local = self.gather(name, grad, compressor)
        max_handle = allreduce_async_(local.reshape(1), name=f"{name}.pactrain.scale", op=hvd.Max,
                                      process_set=self.process_set)
        send = QuantizedSend(name, grad, compressor, values, float(self.layout.world_size) if average else 1.0,
                             max_handle, step)
        scale = self.scales.get(name)
        if scale is not None:
            self._send_codes(send, scale)
        return send

    def finish(self, send: QuantizedSend) -> torch.Tensor:
        """Wait for ``send``, hold the next scale, and return the reduced gradient in the tensor's shape.

        Every rank gets the same MAX: where it is not finite (an overflow somewhere) the gradient is NaN on
        every rank, so a loss scaler skips the step everywhere, and the held scale stays as it was."""
        step_max = synchronize(send.max_handle).reshape(())
        if send.words_handle is None:  # no scale was held: this step's MAX is the scale
            self._send_codes(send, step_max)
        summed = synchronize(send.words_handle)
        finite = torch.isfinite(step_max)
        held = self.scales.get(send.name)
        self.scales[send.name] = torch.where(finite, step_max, held if held is not None else step_max.new_zeros(()))
        value_ctx, original = send.ctx
        scale = torch.where(finite, value_ctx.scale, torch.full_like(value_ctx.scale, float("nan")))
        return send.compressor.decompress(summed, (value_ctx._replace(scale=scale), original))

    def gather(self, name: str, grad: torch.Tensor, compressor: PacTrainCompressor) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's survivors of ``grad`` plus their error memory (fp32), and its proposal for their scale:
        ``local_scale``, or inf where a value is not finite. No communication."""
        values = self.memory.add(name, compressor.gather(grad).float())
        local = local_scale(values, self.layout.levels)  # not finite where a value is not: the mean of |values|
        # An overflow on any rank makes the MAX inf on every rank (Horovod's MAX may drop a NaN).
        return values, torch.where(torch.isfinite(local), local, torch.full_like(local, float("inf")))

    def quantize(self, send: QuantizedSend, scale: torch.Tensor) -> None:
        """``send``'s codes at ``scale`` lane-packed into ``send.words``, and what rounding left out into the
        error memory (pending). No communication; ``send.values`` is spent."""
        values = send.values
        scale = scale.to(values.device)
        levels = self.layout.levels
        noise = self.noise.uniform(send.name, send.step, values.numel(), values.device)
        codes = stochastic_codes(values, scale, noise, levels)
        send.words, send.ctx = send.compressor.compress_codes(send.grad, codes, scale, send.divisor)
        self.memory.store(send.name, values, codes.mul_(scale / levels))  # both buffers are spent here

    def _send_codes(self, send: QuantizedSend, scale: torch.Tensor) -> None:
        self.quantize(send, scale)
        send.words_handle = allreduce_async_(send.words, name=send.name, op=hvd.Sum, process_set=self.process_set)
