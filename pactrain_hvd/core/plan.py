"""The adaptive plan: which tensors travel packed and which dense."""

from __future__ import annotations

# Measured on this project's 2-core CPU with scripts/micro_pack.py (see README): below ~4k
# elements a gather/scatter costs more than it saves, and above ~75 % density the saved
# bytes no longer pay for the index pass.
DEFAULT_MIN_NUMEL = 4096
DEFAULT_MAX_DENSITY = 0.75


def should_pack(numel: int, kept: int, min_numel: int = DEFAULT_MIN_NUMEL, max_density: float = DEFAULT_MAX_DENSITY) -> bool:
    """Pack a tensor when it is large enough and sparse enough for packing to pay."""
    return numel >= min_numel and numel > 0 and kept / numel <= max_density
