"""Under mpirun (MPI controller): Horovod shares an mpi4py communicator with other MPI code."""

import horovod.torch as hvd
import pytest
import torch
from mpi4py import MPI

import pactrain_hvd.torch as pt


@pytest.fixture(scope="module", autouse=True)
def horovod():
    hvd.init(comm=MPI.COMM_WORLD)
    assert hvd.size() == MPI.COMM_WORLD.Get_size() >= 2, "run under mpirun -np 2"
    assert hvd.rank() == MPI.COMM_WORLD.Get_rank()
    assert hvd.mpi_enabled()


def test_allreduce_and_mpi4py_agree():
    value = float(hvd.rank() + 1)
    expected = MPI.COMM_WORLD.allreduce(value, op=MPI.SUM)
    total = hvd.allreduce(torch.tensor([value]), op=hvd.Sum, name="mpi.sum")
    assert total.item() == expected == sum(r + 1 for r in range(hvd.size()))


def test_pactrain_step_over_mpi_keeps_ranks_identical():
    torch.manual_seed(0)
    model = torch.nn.Linear(128, 64)
    opt = pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters(),
                                  sparsity=0.9, ranking="layer", begin_step=0, end_step=0)
    for step in range(3):
        opt.zero_grad()
        x = torch.randn(4, 128, generator=torch.Generator().manual_seed(hvd.rank() * 100 + step))
        model(x).square().mean().backward()
        opt.step()
    weights = MPI.COMM_WORLD.allgather(model.weight.detach().numpy().copy())
    assert all((w == weights[0]).all() for w in weights)
    assert int((model.weight != 0).sum()) == 819  # round(8192 * 0.1)
    assert opt.stats()["tensors"]["weight"]["sent_bytes"] == 819 * 4
