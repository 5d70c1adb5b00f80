"""Under ``torch.use_deterministic_algorithms(True)`` (Lightning's ``deterministic=True``) the optimizer runs,
and its weights are bitwise those of the default mode: the packed scatter is the only op that changes."""

from contextlib import contextmanager

import pytest
import torch
from conftest import assert_same_on_all_ranks, loss_of, make_model

import pactrain_hvd.torch as pt


@contextmanager
def deterministic(enabled: bool):
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(enabled)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before)


def trained(packed_values: str, enabled: bool, steps: int = 4) -> dict:
    model = make_model()
    opt = pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                  named_parameters=[(f"det.{packed_values}.{n}", p)
                                                    for n, p in model.named_parameters()],
                                  sparsity=0.9, ranking="layer", begin_step=0, end_step=0, pack_min_numel=1000,
                                  packed_values=packed_values)
    with deterministic(enabled):
        for step in range(steps):
            opt.zero_grad()
            loss_of(model, step).backward()
            opt.step()
    assert any(t["packed"] for t in opt.stats()["tensors"].values()), "no tensor was packed"
    return {name: p.detach().clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("packed_values", ["inherit", "int3"])
def test_deterministic_mode_gives_the_same_weights(packed_values):
    default = trained(packed_values, enabled=False)
    strict = trained(packed_values, enabled=True)
    for name, weight in default.items():
        assert torch.equal(weight, strict[name]), f"{name} differs under deterministic algorithms"
    assert_same_on_all_ranks(strict, what=f"deterministic.{packed_values}")
