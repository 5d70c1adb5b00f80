"""Byte accounting: what each step handed to the all-reduce, and what dense would have handed."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


def ring_allreduce_bytes(buffer_bytes: float, world_size: int) -> float:
    """Bytes each worker sends in a ring all-reduce of a ``buffer_bytes`` buffer.

    Args:
        buffer_bytes: size of the all-reduced buffer, in bytes.
        world_size: number of ranks in the ring.

    Returns:
        ``2 * (world_size - 1) / world_size * buffer_bytes``; 0.0 for a single rank.
    """
    return 0.0 if world_size <= 1 else 2.0 * (world_size - 1) / world_size * buffer_bytes


@dataclass
class TensorStats:
    """Wire accounting of one tensor (or one bucket of tensors) at one step.

    Attributes:
        numel: number of coordinates.
        kept: surviving coordinates under the mask (``numel`` when unmasked).
        packed: whether the survivors were sent packed rather than the dense tensor.
        sent_bytes: bytes handed to Horovod's all-reduce.
        dense_bytes: bytes a dense all-reduce would have handed.
    """

    numel: int
    kept: int
    packed: bool
    sent_bytes: int
    dense_bytes: int

    @property
    def density(self) -> float:
        """Fraction of coordinates that survive (1.0 for an empty tensor)."""
        return self.kept / self.numel if self.numel else 1.0

    @property
    def bits_per_value(self) -> float:
        """Wire bits per surviving value (scales and lane padding included)."""
        return 8.0 * self.sent_bytes / self.kept if self.kept else 0.0


@dataclass
class StepStats:
    """Per-step wire accounting. ``sent_bytes`` is what was handed to Horovod.

    Attributes:
        step: the optimizer step the statistics describe.
        tensors: name (or ``bucketN``) -> that tensor's ``TensorStats``.
    """

    step: int = 0
    tensors: dict[str, TensorStats] = field(default_factory=dict)

    @property
    def sent_bytes(self) -> int:
        """Bytes handed to Horovod over all tensors."""
        return sum(t.sent_bytes for t in self.tensors.values())

    @property
    def dense_bytes(self) -> int:
        """Bytes a dense all-reduce would have handed over all tensors."""
        return sum(t.dense_bytes for t in self.tensors.values())

    @property
    def compression_ratio(self) -> float:
        """``dense_bytes / sent_bytes`` (1.0 when nothing was sent)."""
        return self.dense_bytes / self.sent_bytes if self.sent_bytes else 1.0

    @property
    def bits_per_value(self) -> float:
        """Wire bits per surviving value of the packed tensors (0 when none is packed)."""
        packed = [t for t in self.tensors.values() if t.packed]
        kept = sum(t.kept for t in packed)
        return 8.0 * sum(t.sent_bytes for t in packed) / kept if kept else 0.0

    def as_dict(self) -> dict:
        """The statistics as plain Python values (e.g. for JSON).

        Returns:
            The step, its totals and ratios, and per tensor its fields with ``density`` and ``bits_per_value``.
        """
        return {
            "step": self.step,
            "sent_bytes": self.sent_bytes,
            "dense_bytes": self.dense_bytes,
            "compression_ratio": self.compression_ratio,
            "bits_per_value": self.bits_per_value,
            "tensors": {name: dict(asdict(t), density=t.density, bits_per_value=t.bits_per_value)
                        for name, t in self.tensors.items()},
        }
