"""How the baselines move what they send (GRACE's communicators): allgather, or one fused all-reduce.
"""

from __future__ import annotations

import horovod.torch as hvd
import torch
from horovod.torch.mpi_ops import allgather_async, allreduce_async_, synchronize


class AllgatherCommunicator:
    """Top-k's transport: index sets differ across ranks, so nothing can be summed in flight."""

    @staticmethod
    def start(name: str, values: torch.Tensor, indices: torch.Tensor) -> tuple[int, int]:
        return (allgather_async(values, name=f"topk.values.{name}"), allgather_async(indices, name=f"topk.indices.{name}"))

    @staticmethod
    def wait(handles: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        return synchronize(handles[0]), synchronize(handles[1])


class FusedAllreduceCommunicator:
    """Many tensors, one averaging all-reduce: callers write into one flat buffer."""

    @staticmethod
    def start(name: str, flat: torch.Tensor) -> int:
        return allreduce_async_(flat, name=name, op=hvd.Average)

    @staticmethod
    def wait(handle: int) -> torch.Tensor:
        return synchronize(handle)
