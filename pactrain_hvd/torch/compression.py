"""Mask-indexed packing as a Horovod ``Compressor``: only surviving values travel, no indices."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from horovod.torch.compression import Compression, Compressor

from pactrain_hvd.core.lanes import LaneLayout
from pactrain_hvd.torch.lanes import dequantize, encode
from pactrain_hvd.torch.scatter import put_survivors_

# Horovod's torch all-reduce carries int32/int64/fp16/fp32/fp64, not bf16: bf16 gradients
# travel as fp32 (or fp16 when stacked with Compression.fp16) and come back as bf16.
_WIRE_DTYPE = {torch.bfloat16: torch.float32}
# What Horovod's torch all-reduce carries for packed values, by the encoding's wire dtype (None: as
# ``compression`` leaves them). It has no bfloat16 (0.28: float16, float32, float64 and integers).
PACKED_WIRES: dict[str | None, type[Compressor] | None] = {None: None, "float16": Compression.fp16}


def fills_storage(tensor: torch.Tensor) -> bool:
    """Non-overlapping and dense (contiguous, channels_last, any permutation): it fills ``numel`` storage slots."""
    return torch.empty_like(tensor, device="meta").stride() == tensor.stride()


def storage_view(tensor: torch.Tensor) -> torch.Tensor:
    """A dense tensor's storage as a 1-D view, in memory order (row-major only when it is contiguous)."""
    return tensor.view(-1) if tensor.is_contiguous() else tensor.as_strided((tensor.numel(),), (1,), tensor.storage_offset())


class CodesContext(NamedTuple):
    scale: torch.Tensor  # the same on every rank (a MAX over ranks), fp32 scalar
    count: int  # values in the words
    divisor: float  # world size for an average, 1 for a sum


class PacTrainCompressor(Compressor):
    """Compressor for one tensor of a known mask.

    ``packed=True``: ``compress`` gathers ``tensor.flatten()[surviving_indices]`` into a short
    dense vector (the same length on every rank, because the mask is the same) and
    ``decompress`` scatters the reduced values back into zeros of the original shape, in
    the compressed tensor's own storage (it holds only local values by then).
    Values travel in logical (row-major, mask) order whatever the gradient's memory format, and a
    channels_last (or otherwise permuted but dense) gradient is gathered from and scattered back into its
    own storage, so it keeps the parameter's layout.

    Args:
        mask: bool tensor of the compressed tensor's shape, True where values survive; None: the tensor is not
            pruned and travels as Horovod would send it.
        value_compression: the Horovod compressor the travelling values are handed to (``hvd.Compression.none``
            or ``.fp16``).
        packed: True: only surviving values travel; False: the tensor travels whole, with pruned coordinates zeroed.
        lanes: packed values are rounded to shared-scale codes (ternary, int3) and lane-packed into int32 words
            instead (``compress_codes``; layout in ``pactrain_hvd.core.lanes``); needs ``mask`` and ``packed=True``.
            None: values are not quantized.

    Raises:
        TypeError: ``mask`` is not a bool tensor.
        ValueError: ``lanes`` is given without a mask or with ``packed=False``.

    Example::

        >>> compressor = PacTrainCompressor(mask, value_compression=hvd.Compression.fp16)
        >>> wire, ctx = compressor.compress(grad)          # wire.numel() == mask.sum()
        >>> grad = compressor.decompress(hvd.allreduce(wire), ctx)
    """

    def __init__(self, mask: torch.Tensor | None = None, value_compression: type[Compressor] = Compression.none,
                 packed: bool = True, lanes: LaneLayout | None = None) -> None:
        if mask is not None and mask.dtype != torch.bool:
            raise TypeError(f"mask must be a bool tensor, got {mask.dtype}")
        if lanes is not None and not (packed and mask is not None):
            raise ValueError("lanes (quantized values) needs a mask and packed=True: only packed values are quantized")
        self.mask = mask
        self.packed = packed and mask is not None
        self.value_compression = value_compression
        self.lanes = lanes
        self.pruned = None if mask is None else ~mask
        self.surviving_indices = mask.reshape(-1).nonzero().squeeze(1) if self.packed else None
        # Surviving coordinates (None: unmasked), counted once here: read on every step, it must not sync.
        self.kept = None if mask is None else int(self.surviving_indices.numel() if self.packed else mask.sum())
        self._positions_by_stride: dict[tuple[int, ...], torch.Tensor | None] = {}

    def _positions(self, tensor: torch.Tensor) -> torch.Tensor | None:
        """Where the survivors lie in ``storage_view(tensor)``; None when ``tensor`` is not dense (an expanded or sliced view).

        A permuted layout's positions are found once per strides (a dense tensor's elements are ``arange(numel)`` laid
        out with its strides), so that its survivors are still read and written in mask order, without a copy.
        """
        if tensor.is_contiguous():
            return self.surviving_indices
        strides = tensor.stride()
        if strides not in self._positions_by_stride:
            offsets = torch.arange(tensor.numel(), device=self.surviving_indices.device)
            self._positions_by_stride[strides] = (offsets.as_strided(tensor.shape, strides).reshape(-1)[self.surviving_indices]
                                                  if fills_storage(tensor) else None)
        return self._positions_by_stride[strides]

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """The values that travel, before value compression: survivors, the masked tensor, or the tensor."""
        if self.mask is not None and tensor.shape != self.mask.shape:
            raise ValueError(f"tensor of shape {tuple(tensor.shape)} does not fit mask of shape {tuple(self.mask.shape)}")
        if self.packed:
            positions = self._positions(tensor)
            # take / put_: the 1-D gather and scatter whose CPU kernels beat index_select / index_copy_ (reports/fast_path)
            values = (torch.take(tensor, self.surviving_indices) if positions is None
                      else torch.take(storage_view(tensor), positions))
        elif self.mask is not None:
            values = tensor.masked_fill_(self.pruned, 0)
        else:
            values = tensor
        wire_dtype = _WIRE_DTYPE.get(values.dtype)
        values = values if wire_dtype is None else values.to(wire_dtype)
        return values.contiguous()  # Horovod all-reduces contiguous tensors only: a permuted one travels row-major

    def compress(self, tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        if self.lanes is not None:
            raise RuntimeError("a quantized PacTrainCompressor needs the agreed scale: use gather() then compress_codes()")
        wire, value_ctx = self.value_compression.compress(self.gather(tensor))
        return wire, (value_ctx, tensor)

    def compress_codes(self, tensor: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor,
                       divisor: float = 1.0) -> tuple[torch.Tensor, Any]:
        """Lane-pack ``codes`` (the survivors of ``tensor`` rounded to [-levels, levels] steps of ``scale / levels``).

        The words must be all-reduced with op=Sum; ``decompress`` then yields ``sum * scale / (levels * divisor)``
        (``divisor=world size`` for an average).
        """
        words = encode(codes, self.lanes)
        return words, (CodesContext(scale, codes.numel(), divisor), tensor)

    def decompress(self, tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        """Write into the tensor that was compressed, in its own layout, when it is dense (no new allocation)."""
        value_ctx, original = ctx
        if isinstance(value_ctx, CodesContext):
            values = dequantize(tensor, self.lanes, value_ctx.count, value_ctx.scale, value_ctx.divisor)
            values = values.to(original.dtype)
        else:
            values = self.value_compression.decompress(tensor, value_ctx).to(original.dtype)
        if not self.packed:  # a permuted gradient travelled as a row-major copy: back into its storage
            return values if original.is_contiguous() or not fills_storage(original) else original.copy_(values)
        positions = self._positions(original)
        if positions is None:  # not dense: a new contiguous gradient
            dense = torch.empty_like(original, memory_format=torch.contiguous_format)
            put_survivors_(dense.zero_().view(-1), self.surviving_indices, values)
            return dense
        put_survivors_(storage_view(original.zero_()), positions, values)
        return original
