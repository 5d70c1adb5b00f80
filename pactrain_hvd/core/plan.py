"""The adaptive plan: which tensors travel packed and which dense."""

from __future__ import annotations

# From `python -m benchmarks.micro.micro_pack --plan-sweep --gbits 1` on the 2-core dev CPU
# (docs/how-it-works.md): pack+unpack costs ~25 us per tensor plus ~4 ns per element; on a 1 Gbit/s link it
# is repaid from 4096 elements at density <= 0.5 and from 16k elements at density <= 0.75,
# never at density 0.9. Faster links raise both bounds (pass pack_min_numel / pack_max_density).
DEFAULT_MIN_NUMEL = 4096
DEFAULT_MAX_DENSITY = 0.75


def should_pack(numel: int, kept: int, min_numel: int = DEFAULT_MIN_NUMEL, max_density: float = DEFAULT_MAX_DENSITY) -> bool:
    """Pack a tensor when it is large enough and sparse enough for packing to pay.

    Args:
        numel: number of coordinates of the tensor.
        kept: its surviving coordinates under the mask.
        min_numel: smallest tensor worth packing.
        max_density: largest surviving fraction ``kept / numel`` worth packing.

    Returns:
        True when ``numel >= min_numel`` (and > 0) and ``kept / numel <= max_density``.
    """
    return numel >= min_numel and numel > 0 and kept / numel <= max_density
