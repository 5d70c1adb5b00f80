"""What the examples report on rank 0: TensorBoard scalars and wire bytes."""

from __future__ import annotations

import sys
import types

import horovod.torch as hvd
import torch

from pactrain_hvd.core import ring_allreduce_bytes


def tensorboard_writer(logdir: str):
    """A SummaryWriter on rank 0 (None elsewhere, or with no logdir).

    TensorBoard imports TensorFlow when it can, which costs seconds and memory in a PyTorch
    script; the ``notf`` marker module makes it use its own file writer instead.
    """
    if hvd.rank() != 0 or not logdir:
        return None
    sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("tensorboard.compat.notf"))
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(logdir)


def global_sum(values: list[float], name: str) -> list[float]:
    """Sum of each value over all workers."""
    return hvd.allreduce(torch.tensor(values, dtype=torch.float64), op=hvd.Sum, name=name).tolist()


class WireTally:
    """Bytes each worker handed to the all-reduce, summed over the steps of a run or an epoch."""

    def __init__(self) -> None:
        self.steps = self.sent_bytes = self.dense_bytes = 0

    def add(self, stats: dict) -> None:
        self.steps += 1
        self.sent_bytes += stats["sent_bytes"]
        self.dense_bytes += stats["dense_bytes"]

    def as_dict(self, world_size: int) -> dict:
        return {
            "steps": self.steps,
            "sent_bytes": self.sent_bytes,
            "dense_bytes": self.dense_bytes,
            "compression_ratio": self.dense_bytes / self.sent_bytes if self.sent_bytes else 1.0,
            "ring_bytes_per_worker": ring_allreduce_bytes(self.sent_bytes, world_size),
        }


def log_step(writer, step: int, loss: float, accuracy: float, stats: dict) -> None:
    writer.add_scalar("train/loss", loss, step)
    writer.add_scalar("train/accuracy", accuracy, step)
    log_wire(writer, step, stats)


def log_wire(writer, step: int, stats: dict) -> None:
    """Sparsity and the bytes of ``opt.stats()`` as TensorBoard scalars."""
    writer.add_scalar("pactrain/sparsity", stats["sparsity"], step)
    writer.add_scalar("wire/sent_bytes_per_step", stats["sent_bytes"], step)
    writer.add_scalar("wire/dense_bytes_per_step", stats["dense_bytes"], step)
    ring_bytes = ring_allreduce_bytes(stats["sent_bytes"], hvd.size())
    writer.add_scalar("wire/ring_bytes_per_worker_per_step", ring_bytes, step)
    writer.add_scalar("wire/compression_ratio", stats["compression_ratio"], step)
