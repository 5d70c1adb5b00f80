"""bench.update_cost: the optimizer it times is the workload's own, with one implementation of the update."""

import pytest
import torch

from benchmarks.micro.update_cost import IMPLEMENTATIONS, rebuilt, zero_out


def model_and_optimizer():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    decay, no_decay = [p for p in model.parameters() if p.dim() > 1], [p for p in model.parameters() if p.dim() == 1]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=1e-2, betas=(0.9, 0.99))
    model(torch.randn(4, 8)).sum().backward()
    optimizer.step()
    return model, optimizer


@pytest.mark.parametrize("implementation", sorted(IMPLEMENTATIONS))
def test_rebuilt_keeps_the_groups_and_takes_the_implementation(implementation):
    model, optimizer = model_and_optimizer()
    copy = rebuilt(optimizer, implementation)
    assert type(copy) is torch.optim.AdamW
    assert [g["weight_decay"] for g in copy.param_groups] == [0.1, 0.0]
    assert [g["params"] for g in copy.param_groups] == [g["params"] for g in optimizer.param_groups]
    for key, value in IMPLEMENTATIONS[implementation].items():
        assert all(g[key] is value for g in copy.param_groups)
    copy.step()  # every implementation runs on CPU


def test_zero_out_zeroes_weights_gradients_and_state_of_matrices_only():
    model, optimizer = model_and_optimizer()
    zero_out(model, optimizer, 0.75)
    weight, bias = model[0].weight, model[0].bias
    zeros = weight == 0
    assert 0.6 < zeros.float().mean() < 0.9
    assert bool((weight.grad[zeros] == 0).all())
    for value in ("exp_avg", "exp_avg_sq"):
        assert bool((optimizer.state[weight][value][zeros] == 0).all())
    assert bool((bias != 0).all())
