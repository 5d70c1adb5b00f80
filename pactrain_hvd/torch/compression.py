"""Mask-indexed packing as a Horovod ``Compressor``: only surviving values travel, no indices."""

from __future__ import annotations

from typing import Any

import torch
from horovod.torch.compression import Compression, Compressor

# Horovod's torch all-reduce carries int32/int64/fp16/fp32/fp64, not bf16: bf16 gradients
# travel as fp32 (or fp16 when stacked with Compression.fp16) and come back as bf16.
_WIRE_DTYPE = {torch.bfloat16: torch.float32}


class PacTrainCompressor(Compressor):
    """Compressor for one tensor of a known mask.

    ``packed=True``: ``compress`` gathers ``tensor.flatten()[surviving_indices]`` into a short
    dense vector (the same length on every rank, because the mask is the same) and
    ``decompress`` scatters the reduced values back into zeros of the original shape, in
    the compressed tensor's own storage (it holds only local values by then).
    ``packed=False``: the tensor travels whole, with pruned coordinates zeroed.
    ``mask=None``: the tensor is not pruned and travels as Horovod would send it.
    Values are then handed to ``value_compression`` (``hvd.Compression.none`` or ``.fp16``).

    Example::

        >>> compressor = PacTrainCompressor(mask, value_compression=hvd.Compression.fp16)
        >>> wire, ctx = compressor.compress(grad)          # wire.numel() == mask.sum()
        >>> grad = compressor.decompress(hvd.allreduce(wire), ctx)
    """

    def __init__(self, mask: torch.Tensor | None = None, value_compression: type[Compressor] = Compression.none, packed: bool = True) -> None:
        if mask is not None and mask.dtype != torch.bool:
            raise TypeError(f"mask must be a bool tensor, got {mask.dtype}")
        self.mask = mask
        self.packed = packed and mask is not None
        self.value_compression = value_compression
        self.pruned = None if mask is None else ~mask
        self.surviving_indices = mask.reshape(-1).nonzero().squeeze(1) if self.packed else None

    @property
    def kept(self) -> int | None:
        """Surviving coordinates, or None for an unmasked tensor."""
        return None if self.mask is None else int(self.surviving_indices.numel() if self.packed else self.mask.sum())

    def compress(self, tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        if self.mask is not None and tensor.shape != self.mask.shape:
            raise ValueError(f"tensor of shape {tuple(tensor.shape)} does not fit mask of shape {tuple(self.mask.shape)}")
        if self.packed:
            values = tensor.reshape(-1).index_select(0, self.surviving_indices)
        elif self.mask is not None:
            values = tensor.masked_fill_(self.pruned, 0)
        else:
            values = tensor
        wire_dtype = _WIRE_DTYPE.get(values.dtype)
        if wire_dtype is not None:
            values = values.to(wire_dtype)
        wire, value_ctx = self.value_compression.compress(values)
        return wire, (value_ctx, tensor)

    def decompress(self, tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        """Scatter into the tensor that was compressed when it is contiguous (no new allocation)."""
        value_ctx, original = ctx
        values = self.value_compression.decompress(tensor, value_ctx).to(original.dtype)
        if not self.packed:
            return values
        dense = original if original.is_contiguous() else torch.empty_like(original, memory_format=torch.contiguous_format)
        dense.zero_().view(-1).index_copy_(0, self.surviving_indices, values)
        return dense
