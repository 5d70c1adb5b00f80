"""Quantized codes packed as digits of int32 words, so that an integer SUM all-reduce adds every digit at once.

The layout is defined here, once; the frontends (``pactrain_hvd/torch/lanes.py``) follow it and
a unit test proves they produce the same words as these numpy reference functions.

- A quantized value is an integer code ``q`` in [-levels, levels] times a step, one step per tensor:
  ``scale / levels``, where ``scale`` is the MAX over ranks of each rank's ``local_scale``. Ternary values
  (TernGrad) are ``levels=1``: ``q`` in {-1, 0, +1}. ``q`` travels biased, as ``c = q + levels`` in
  [0, 2 levels]. Biased codes are never negative, so adding words never borrows from a neighbouring digit.
- The sum of ``N`` ranks' codes lies in [0, 2 levels N]: one digit in base ``radix = 2 levels N + 1``, so the
  sum of words is the word of the sums and no digit carries into the next.
- One int32 word holds ``lanes`` digits, the largest ``k`` with ``radix ** k <= 2 ** 31``: value ``i`` is
  digit ``i % lanes`` (weight ``radix ** (i % lanes)``) of word ``i // lanes``. A summed word is at most
  ``radix ** lanes - 1``: never negative, never past int32. The last word is padded with code 0, and
  unpacking drops the padding.
- Decoding a summed digit ``s``: ``sum of q = s - levels N``; the averaged value is ``(s - levels N) * step / N``.

Digits use the word more fully than bit fields of ``ceil(log2(radix))`` bits: for ternary values 13
values per word against 10 at N = 2 (2.46 bits a value), 7 against 6 at N = 8.

With fewer than 3 digits per word the codes cost at least fp16's 16 bits per value and are coarser,
so ``quantized_layout`` returns None there and packed values travel as fp16 instead: for ternary values
from N = 645, where ``radix ** 3`` passes ``2 ** 31`` (1291 ** 3 > 2 ** 31 >= 1289 ** 3).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

WORD_LIMIT = 2**31  # a summed word stays below it: the int32 sign bit is never set
MIN_LANES = 3  # below this, fp16 (2 values per 32 bits) is as small and exact-er
SCALE_BYTES = 4  # one fp32 scale per quantized tensor also crosses the wire
STEP_OVER_MEAN = 2.0  # a code's step is about this many times the mean |value| (local_scale)
NOISE_SEED = 0x7E4A  # stochastic rounding's noise is seeded with this plus the rank: ranks draw independently


@dataclass(frozen=True)
class LaneLayout:
    """How ``world_size`` ranks' codes in [-levels, levels] share int32 words: ``lanes`` digits in base ``radix``."""

    world_size: int
    radix: int
    lanes: int
    levels: int = 1

    @property
    def offset(self) -> int:
        """What biases a code: ``c = q + offset`` is never negative."""
        return self.levels

    @property
    def powers(self) -> tuple[int, ...]:
        """Each digit's weight in its word."""
        return tuple(self.radix**lane for lane in range(self.lanes))

    @property
    def bits_per_value(self) -> float:
        return 32.0 / self.lanes

    def words(self, count: int) -> int:
        """int32 words that carry ``count`` codes."""
        return -(-count // self.lanes)


def _check_levels(levels: int) -> None:
    if isinstance(levels, bool) or not isinstance(levels, int) or levels < 1:
        raise ValueError(f"levels must be an int >= 1, got {levels!r}")


def lane_radix(world_size: int, levels: int = 1) -> int:
    """The base whose digit holds a sum of ``world_size`` codes in [0, 2 levels]: 2 levels N + 1."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1, got {world_size!r}")
    _check_levels(levels)
    return 2 * levels * world_size + 1


def lane_layout(world_size: int, levels: int = 1) -> LaneLayout:
    """The most digits per word whose sums cannot carry into a neighbour or into the sign bit."""
    radix = lane_radix(world_size, levels)
    lanes = 0
    while radix ** (lanes + 1) <= WORD_LIMIT:
        lanes += 1
    return LaneLayout(world_size=world_size, radix=radix, lanes=lanes, levels=levels)


def quantized_layout(world_size: int, levels: int = 1) -> LaneLayout | None:
    """The layout for codes in [-levels, levels] on ``world_size`` ranks, or None: fall back to fp16."""
    layout = lane_layout(world_size, levels)
    return layout if layout.lanes >= MIN_LANES else None


def local_scale(values: np.ndarray, levels: int = 1) -> np.float32:
    """One rank's proposal for a tensor's scale (the largest code's value): ``levels * STEP_OVER_MEAN`` times
    the mean ``|value|`` (0 for none). Every encoding rounds at the same step; more levels clip later.

    Not TernGrad's max: a value ``v`` under the step ``s`` arrives as ``s`` or 0, so its square has
    mean ``s * |v|``, and Adam divides by that. At the max of a heavy-tailed gradient the second
    moment of nearly every coordinate is inflated many times (the char-GPT with AdamW lost 46 %
    perplexity against fp16 values; reports/accuracy/ternary-mean-scale). At a small multiple of the mean most values
    fall under ``s`` and are rounded without bias. The factor 2 was chosen, not swept:
    reports/accuracy/ternary-mean-scale has what it measured on both workloads. A value beyond the scale is
    sent clipped and the error memory carries the rest to later steps: with ternary values that delays the
    largest coordinates of every step, which int3's three levels (a scale of 6 mean ``|value|``) mostly let
    through (bench/results/tta/link-bound/lower-sparsity-loopback and 10mbit-25ms-int3).
    """
    values = np.abs(np.asarray(values, dtype=np.float32))
    return np.float32(levels * STEP_OVER_MEAN) * values.mean(dtype=np.float32) if values.size else np.float32(0)


def stochastic_codes(values: np.ndarray, scale: float, noise: np.ndarray, levels: int = 1) -> np.ndarray:
    """Unbiased stochastic rounding to codes in [-levels, levels] of step ``scale / levels``: ``|v|`` lies
    between ``k`` and ``k + 1`` steps and rounds up with probability (its remainder past ``k`` steps) / step;
    a value beyond the scale is clipped to ``sign(v) * levels``. ``levels=1`` is TernGrad's ``sign(v)`` with
    probability ``min(1, |v| / scale)``.

    ``noise`` is uniform in [0, 1), one draw per value. Rounding up where ``noise * step < remainder``
    avoids dividing by a zero scale (then every value is 0).
    """
    values = np.asarray(values, dtype=np.float32)
    step = np.float32(scale) / np.float32(levels)
    magnitude = np.abs(values)
    whole = np.floor(np.divide(magnitude, step, out=np.zeros_like(magnitude), where=step > 0))
    up = np.asarray(noise, dtype=np.float32) * step < magnitude - whole * step
    return (np.sign(values) * np.minimum(whole + up, levels)).astype(np.int8)


def pack_codes(codes: np.ndarray, layout: LaneLayout) -> np.ndarray:
    """Codes (each < ``layout.radix``) -> int32 words, ``layout.lanes`` digits per word."""
    codes = np.asarray(codes).reshape(-1)
    padded = np.zeros(layout.words(codes.size) * layout.lanes, dtype=np.int64)
    padded[: codes.size] = codes
    return (padded.reshape(-1, layout.lanes) * np.asarray(layout.powers, dtype=np.int64)).sum(axis=1).astype(np.int32)


def unpack_lanes(words: np.ndarray, layout: LaneLayout, count: int) -> np.ndarray:
    """int32 words (possibly summed over ranks) -> the first ``count`` digits, as int64."""
    words = np.asarray(words, dtype=np.int64).reshape(-1, 1)
    digits = words // np.asarray(layout.powers, dtype=np.int64) % layout.radix
    return digits.reshape(-1)[:count]


def decode_sums(lane_sums: np.ndarray, layout: LaneLayout) -> np.ndarray:
    """Summed biased codes -> sum of the ranks' codes."""
    return np.asarray(lane_sums, dtype=np.int64) - layout.offset * layout.world_size
