"""Ternary lanes in torch ops, following the bit layout of ``pactrain_hvd.core.lanes``.

Mirrors the numpy reference functions there, vectorised: codes reshaped to ``[words, lanes]``,
shifted and summed; summed words shifted back and masked.
"""

from __future__ import annotations

import functools

import torch

from pactrain_hvd.core.lanes import CODE_OFFSET, SCALE_OVER_MEAN, LaneLayout


@functools.cache
def _shifts(layout: LaneLayout, device: torch.device) -> torch.Tensor:
    """Each lane's bit offset, made once per layout and device (not a host-to-device copy per tensor and step)."""
    return torch.tensor(layout.shifts, dtype=torch.int32, device=device)


def local_scale(values: torch.Tensor) -> torch.Tensor:
    """This rank's proposal for the tensor's scale, 0 for no values (see core ``local_scale``)."""
    return SCALE_OVER_MEAN * values.abs().mean() if values.numel() else values.new_zeros(())


def stochastic_ternary(values: torch.Tensor, scale: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """``sign(v)`` with probability ``min(1, |v| / scale)``, else 0, as int8 (see core ``stochastic_ternary``)."""
    keep = noise * scale < values.abs()
    return (torch.sign(values) * keep).to(torch.int8)


def pack_codes(codes: torch.Tensor, layout: LaneLayout) -> torch.Tensor:
    """Codes (each < 2**width) -> int32 words, ``layout.lanes`` codes per word."""
    count = codes.numel()
    padded = torch.zeros(layout.words(count) * layout.lanes, dtype=torch.int32, device=codes.device)
    padded[:count] = codes.reshape(-1)
    return (padded.view(-1, layout.lanes) << _shifts(layout, codes.device)).sum(dim=1, dtype=torch.int32)


def unpack_lanes(words: torch.Tensor, layout: LaneLayout, count: int) -> torch.Tensor:
    """int32 words (possibly summed over ranks) -> the first ``count`` lane values, as int32."""
    lanes = (words.reshape(-1, 1) >> _shifts(layout, words.device)) & layout.lane_mask
    return lanes.reshape(-1)[:count]


def encode(ternary: torch.Tensor, layout: LaneLayout) -> torch.Tensor:
    """Ternary values -> int32 words of biased codes."""
    return pack_codes(ternary.to(torch.int32) + CODE_OFFSET, layout)


def decode(words: torch.Tensor, layout: LaneLayout, count: int) -> torch.Tensor:
    """Words summed over ``layout.world_size`` ranks -> the sum of their ternary values, as int32."""
    return unpack_lanes(words, layout, count) - CODE_OFFSET * layout.world_size
