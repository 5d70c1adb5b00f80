"""Quantized lanes in torch ops, following the digit layout of ``pactrain_hvd.core.lanes``, and the rounding noise.

Mirrors the numpy reference functions there, vectorised: codes reshaped to ``[words, lanes]``,
weighted by the digits' powers and summed; summed words divided by the powers, modulo the radix.
"""

from __future__ import annotations

import functools

import torch

from pactrain_hvd.core.lanes import STEP_OVER_MEAN, LaneLayout
from pactrain_hvd.core.quantized import noise_seed


@functools.cache
def _powers(layout: LaneLayout, device: torch.device) -> torch.Tensor:
    """Each digit's weight, made once per layout and device (not a host-to-device copy per tensor and step)."""
    return torch.tensor(layout.powers, dtype=torch.int32, device=device)


def local_scale(values: torch.Tensor, levels: int = 1) -> torch.Tensor:
    """This rank's proposal for the tensor's scale, 0 for no values (see core ``local_scale``)."""
    return levels * STEP_OVER_MEAN * values.abs().mean() if values.numel() else values.new_zeros(())


def stochastic_codes(values: torch.Tensor, scale: torch.Tensor, noise: torch.Tensor, levels: int = 1) -> torch.Tensor:
    """Codes in [-levels, levels] at the step ``scale / levels`` (see core ``stochastic_codes``), as ``noise``'s
    dtype, written over ``noise``. Ternary values (``levels=1``) take the hot path's one buffer for the draw, the
    test and the sign."""
    if levels == 1:
        return noise.mul_(scale).lt_(values.abs()).copysign_(values)
    step = scale / levels
    magnitude = values.abs()
    whole = torch.where(step > 0, magnitude / step, 0).floor_()
    up = noise.mul_(step).lt_(magnitude.sub_(whole * step))
    return up.add_(whole).clamp_(max=levels).copysign_(values)


def pack_codes(codes: torch.Tensor, layout: LaneLayout, offset: int = 0) -> torch.Tensor:
    """Codes (each ``+ offset`` < ``layout.radix``, any dtype) -> int32 words, ``layout.lanes`` digits per word;
    one int32 buffer, weighted in place (padding digits hold 0)."""
    count = codes.numel()
    buffer = torch.empty(layout.words(count) * layout.lanes, dtype=torch.int32, device=codes.device)
    buffer[count:].zero_()
    buffer[:count].copy_(codes.reshape(-1))
    if offset:
        buffer[:count].add_(offset)
    digits = buffer.view(-1, layout.lanes).mul_(_powers(layout, codes.device))
    return digits.sum(dim=1, dtype=torch.int32)


def unpack_lanes(words: torch.Tensor, layout: LaneLayout, count: int) -> torch.Tensor:
    """int32 words (possibly summed over ranks) -> the first ``count`` digits, as int32 (words are never
    negative, so floor division is exact)."""
    digits = torch.div(words.reshape(-1, 1), _powers(layout, words.device), rounding_mode="floor")
    return digits.remainder_(layout.radix).reshape(-1)[:count]


def encode(codes: torch.Tensor, layout: LaneLayout) -> torch.Tensor:
    """Codes in [-levels, levels] (any dtype) -> int32 words of biased codes."""
    return pack_codes(codes, layout, layout.offset)


def dequantize(words: torch.Tensor, layout: LaneLayout, count: int, scale: torch.Tensor, divisor: float) -> torch.Tensor:
    """Words summed over ``layout.world_size`` ranks -> the sum of their codes ``* scale / (levels * divisor)``,
    as fp32, the arithmetic in one buffer (the sums are small integers, exact in fp32)."""
    summed = unpack_lanes(words, layout, count).to(torch.float32)
    return summed.sub_(layout.offset * layout.world_size).mul_(scale).div_(divisor * layout.levels)


class Noise:
    """Uniform [0, 1) noise for stochastic rounding, drawn for (rank, tensor, step) (``core.quantized``); one
    generator per device, reseeded for every draw."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self._generators: dict[torch.device, torch.Generator] = {}

    def uniform(self, name: str, step: int, count: int, device: torch.device) -> torch.Tensor:
        generator = self._generators.get(device)
        if generator is None:
            generator = self._generators[device] = torch.Generator(device=device)
        generator.manual_seed(noise_seed(self.rank, name, step))
        return torch.rand(count, generator=generator, device=device)
