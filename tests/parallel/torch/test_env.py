"""The environment itself: Horovod's torch all-reduce over 2 ranks gives the right sums."""

import horovod.torch as hvd
import torch


def test_torch_allreduce_sums_over_ranks():
    tensor = torch.arange(6, dtype=torch.float32) * (hvd.rank() + 1)
    total = hvd.allreduce(tensor, op=hvd.Sum, name="env.sum")
    expected = torch.arange(6, dtype=torch.float32) * sum(r + 1 for r in range(hvd.size()))
    assert torch.equal(total, expected)
    average = hvd.allreduce(tensor, op=hvd.Average, name="env.avg")
    torch.testing.assert_close(average, expected / hvd.size())


def test_build_has_gloo_and_mpi():
    assert hvd.gloo_built() and hvd.mpi_built()
    assert hvd.gloo_enabled()  # these tests run under horovodrun --gloo
