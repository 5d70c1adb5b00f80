"""Inputs Horovod accepts and packing cannot carry as they are, on 2 ranks: same result as Horovod, on every rank."""

import warnings

import horovod.torch as hvd
import pytest
import torch
from conftest import assert_same_on_all_ranks

import pactrain_hvd.torch as pt


@pytest.mark.parametrize("prunable", [None, []], ids=["pruned", "unpruned"])
def test_sparse_embedding_gradients_match_horovod_on_every_rank(prunable):
    """Unpruned: Horovod's sparse allgather, bitwise. Pruned: densified (warned) and packed; ranks agree."""
    torch.manual_seed(0)
    ours, theirs = torch.nn.Embedding(50, 4, sparse=True), torch.nn.Embedding(50, 4, sparse=True)
    theirs.load_state_dict(ours.state_dict())
    opt = pt.DistributedOptimizer(torch.optim.SGD(ours.parameters(), lr=0.1), named_parameters=[("emb", ours.weight)],
                                  sparsity=0.5, begin_step=0, end_step=0, prunable=prunable, pack_min_numel=0)
    reference = hvd.DistributedOptimizer(torch.optim.SGD(theirs.parameters(), lr=0.1),
                                         named_parameters=[("ref", theirs.weight)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for step in range(3):
            tokens = torch.tensor([hvd.rank() + step, 10 + 3 * hvd.rank(), 49])  # different rows on each rank
            for module, optimizer in ((ours, opt), (theirs, reference)):
                optimizer.zero_grad()
                module(tokens).pow(2).sum().backward()
                optimizer.step()
    assert_same_on_all_ranks({"emb": ours.weight})
    if prunable is None:
        mask = opt.masks()["emb"]
        assert int(mask.sum()) == 100 and torch.all(ours.weight[~mask] == 0)
        assert opt.stats()["tensors"]["emb"]["packed"]
    else:
        assert torch.equal(ours.weight, theirs.weight)
