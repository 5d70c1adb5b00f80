"""Ternary codes packed into int32 lanes, so that an integer SUM all-reduce adds every lane at once.

The bit layout is defined here, once; the frontends (``pactrain_hvd/torch/lanes.py``) follow it and
a unit test proves they produce the same words as these numpy reference functions.

- A ternary value ``t`` in {-1, 0, +1} (TernGrad: the value is ``t * scale``, one ``scale`` per
  tensor, the MAX over ranks of each rank's ``local_scale``) travels as the biased code ``c = t + 1`` in
  {0, 1, 2}. Biased codes are never negative, so adding words never borrows across lanes.
- The sum of ``N`` ranks' codes lies in [0, 2N]: a lane is ``width = ceil(log2(2N + 1))`` bits.
- ``lanes = 31 // width`` lanes share one int32 word; lane ``j`` holds bits ``[j*width, (j+1)*width)``.
  Bit 31 stays 0, so the summed word is never negative and never overflows.
- Value ``i`` sits in word ``i // lanes``, lane ``i % lanes``; the last word is padded with code 0,
  and unpacking drops the padding.
- Decoding a summed lane ``s``: ``sum of t = s - N``; the averaged value is ``(s - N) * scale / N``.

With fewer than 3 lanes per word the codes cost at least fp16's 16 bits per value and are coarser,
so ``ternary_layout`` returns None there and packed values travel as fp16 instead: from N = 512, where a lane
needs 11 bits (2N = 1024 needs ``(2N).bit_length() = 11``) and only 2 fit in 31; up to N = 511 a lane is at most
10 bits wide and 3 fit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

WORD_BITS = 31  # usable bits of an int32 word: the sign bit is never set
CODE_OFFSET = 1  # code = ternary + CODE_OFFSET
MIN_LANES = 3  # below this, fp16 (2 values per 32 bits) is as small and exact-er
SCALE_BYTES = 4  # one fp32 scale per quantized tensor also crosses the wire
SCALE_OVER_MEAN = 2.0  # a rank proposes this many times its mean |value| as the ternary scale (local_scale)
NOISE_SEED = 0x7E4A  # stochastic rounding's noise is seeded with this plus the rank: ranks draw independently


@dataclass(frozen=True)
class LaneLayout:
    """How ``world_size`` ranks' ternary codes share int32 words."""

    world_size: int
    width: int
    lanes: int

    @property
    def shifts(self) -> tuple[int, ...]:
        return tuple(lane * self.width for lane in range(self.lanes))

    @property
    def lane_mask(self) -> int:
        return (1 << self.width) - 1

    @property
    def bits_per_value(self) -> float:
        return 32.0 / self.lanes

    def words(self, count: int) -> int:
        """int32 words that carry ``count`` codes."""
        return -(-count // self.lanes)


def lane_width(world_size: int) -> int:
    """Bits that hold a sum of ``world_size`` codes in {0, 1, 2}: ceil(log2(2N + 1))."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1, got {world_size!r}")
    return (2 * world_size).bit_length()


def lane_layout(world_size: int) -> LaneLayout:
    """The widest packing whose lane sums cannot carry into a neighbour or into the sign bit."""
    width = lane_width(world_size)
    return LaneLayout(world_size=world_size, width=width, lanes=WORD_BITS // width)


def ternary_layout(world_size: int) -> LaneLayout | None:
    """The layout for ternary values on ``world_size`` ranks, or None: fall back to fp16."""
    layout = lane_layout(world_size)
    return layout if layout.lanes >= MIN_LANES else None


def local_scale(values: np.ndarray) -> np.float32:
    """One rank's proposal for a tensor's ternary scale: ``SCALE_OVER_MEAN`` times the mean ``|value|`` (0 for none).

    Not TernGrad's max: a value ``v`` under the scale ``s`` arrives as ``s`` or 0, so its square has
    mean ``s * |v|``, and Adam divides by that. At the max of a heavy-tailed gradient the second
    moment of nearly every coordinate is inflated many times (the char-GPT with AdamW lost 46 %
    perplexity against fp16 values; reports/accuracy/ternary-mean-scale). At a small multiple of the mean most values
    fall under ``s`` and are rounded without bias; the few beyond it are sent as ``sign * s`` and the
    error memory carries the rest to later steps. The factor 2 was chosen, not swept:
    reports/accuracy/ternary-mean-scale has what it measured on both workloads.
    """
    values = np.abs(np.asarray(values, dtype=np.float32))
    return np.float32(SCALE_OVER_MEAN) * values.mean(dtype=np.float32) if values.size else np.float32(0)


def stochastic_ternary(values: np.ndarray, scale: float, noise: np.ndarray) -> np.ndarray:
    """TernGrad rounding: ``sign(v)`` with probability ``min(1, |v| / scale)``, else 0 (unbiased where
    ``|v| <= scale``; a value beyond the scale is clipped to ``sign(v)``).

    ``noise`` is uniform in [0, 1), one draw per value. ``noise * scale < |v|`` avoids dividing by a
    zero scale (then every value is 0).
    """
    values = np.asarray(values, dtype=np.float32)
    keep = np.asarray(noise, dtype=np.float32) * np.float32(scale) < np.abs(values)
    return (np.sign(values) * keep).astype(np.int8)


def pack_codes(codes: np.ndarray, layout: LaneLayout) -> np.ndarray:
    """Codes (each < 2**width) -> int32 words, ``layout.lanes`` codes per word."""
    codes = np.asarray(codes).reshape(-1)
    padded = np.zeros(layout.words(codes.size) * layout.lanes, dtype=np.int64)
    padded[: codes.size] = codes
    shifted = padded.reshape(-1, layout.lanes) << np.asarray(layout.shifts, dtype=np.int64)
    return shifted.sum(axis=1).astype(np.int32)


def unpack_lanes(words: np.ndarray, layout: LaneLayout, count: int) -> np.ndarray:
    """int32 words (possibly summed over ranks) -> the first ``count`` lane values, as int64."""
    words = np.asarray(words, dtype=np.int64).reshape(-1, 1)
    lanes = (words >> np.asarray(layout.shifts, dtype=np.int64)) & layout.lane_mask
    return lanes.reshape(-1)[:count]


def decode_sums(lane_sums: np.ndarray, world_size: int) -> np.ndarray:
    """Summed biased codes -> sum of the ranks' ternary values."""
    return np.asarray(lane_sums, dtype=np.int64) - CODE_OFFSET * world_size
