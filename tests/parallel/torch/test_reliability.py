"""No silent divergence: long runs stay bitwise identical; drift is caught before it is sent."""

import horovod.torch as hvd
import pytest
import torch
from conftest import assert_same_on_all_ranks

import pactrain_hvd.torch as pt
from pactrain_hvd.torch import pruning


def tiny_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))


def step_on(model, opt, step):
    generator = torch.Generator().manual_seed(10_000 * hvd.rank() + step)
    inputs, labels = torch.randn(16, 32, generator=generator), torch.randint(0, 4, (16,), generator=generator)
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(inputs), labels).backward()
    opt.step()


@pytest.mark.parametrize("make_optimizer", [
    lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=1e-3),
    lambda params: torch.optim.Adam(params, lr=1e-3),
    lambda params: torch.optim.AdamW(params, lr=1e-3, weight_decay=0.05),
], ids=["sgd-momentum-wd", "adam", "adamw"])
def test_200_steps_keep_parameters_and_state_bitwise_identical(make_optimizer):
    model = tiny_model()
    opt = pt.DistributedOptimizer(make_optimizer(model.parameters()), named_parameters=model.named_parameters(),
                                  sparsity=0.9, ranking="layer", begin_step=0, end_step=150, frequency=25, pack_min_numel=0)
    for step in range(200):
        step_on(model, opt, step)
    assert_same_on_all_ranks(dict(model.named_parameters()))
    assert_same_on_all_ranks({f"{n}.{k}": v for n, p in model.named_parameters()
                              for k, v in opt.state[p].items() if torch.is_tensor(v)}, "state")
    for name, mask in opt.masks().items():
        assert int(mask.sum()) == round(mask.numel() * 0.1)
        assert torch.all(dict(model.named_parameters())[name][~mask] == 0), name


def test_silent_mask_drift_is_caught_before_the_next_all_reduce():
    model = tiny_model()
    opt = pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters(),
                                  sparsity=0.5, ranking="layer", begin_step=0, end_step=0, pack_min_numel=0, verify_every=2)
    step_on(model, opt, 0)
    if hvd.rank() == 1:  # corrupt the packing state itself: same count, other positions
        opt.pactrain_state.pruner.masks["2.weight"] = opt.pactrain_state.pruner.masks["2.weight"].flip(1).contiguous()
        opt.pactrain_state.rebuild_plan()
    step_on(model, opt, 1)  # not a verification step: drift is not yet looked for
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    with pytest.raises(pt.MaskMismatchError, match=r"'2.weight': ranks \[1\] differ from rank 0"):
        step_on(model, opt, 2)
    for name, p in model.named_parameters():
        assert torch.equal(p, weights[name]), f"{name} was updated after drift"


@pytest.mark.parametrize("make_optimizer", [
    lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3),
    lambda params: torch.optim.Adam(params, lr=1e-3, amsgrad=True),
    lambda params: torch.optim.AdamW(params, lr=1e-3, weight_decay=0.05),
    lambda params: torch.optim.RMSprop(params, lr=1e-3, momentum=0.9, centered=True, weight_decay=1e-3),
    lambda params: torch.optim.Adagrad(params, lr=1e-2, initial_accumulator_value=0.1),
    lambda params: torch.optim.Rprop(params, lr=1e-3),
    lambda params: torch.optim.NAdam(params, lr=1e-3, weight_decay=1e-3),
], ids=["sgd-nesterov-wd", "adam-amsgrad", "adamw", "rmsprop-centered", "adagrad", "rprop", "nadam"])
def test_pruned_weights_stay_exactly_zero_without_the_re_zeroing_pass(make_optimizer, monkeypatch):
    """For optimizers whose zero weight, gradient and state stay zero, the pass runs only at mask changes."""
    model = tiny_model()
    opt = pt.DistributedOptimizer(make_optimizer(model.parameters()), named_parameters=model.named_parameters(),
                                  sparsity=0.8, ranking="layer", begin_step=0, end_step=4, frequency=2, pack_min_numel=0, verify_every=0)
    passes = []
    original = opt.pactrain_state.pruner.apply_to_weights
    monkeypatch.setattr(opt.pactrain_state.pruner, "apply_to_weights", lambda: passes.append(opt.step_count) or original())
    for step in range(8):
        step_on(model, opt, step)
        for name, mask in opt.masks().items():
            weight = dict(model.named_parameters())[name]
            assert torch.equal(weight[~mask], torch.zeros_like(weight[~mask])), f"{name} at step {step}"
    assert passes == [0, 2, 4], "only the mask changes zero weights (inside install)"
    assert_same_on_all_ranks(dict(model.named_parameters()))


def test_a_check_hashes_a_mask_once_not_at_every_check(monkeypatch):
    """Masks change only at installs: the Mask Tracker reuses each mask's hash until the tensor changes."""
    model = tiny_model()
    opt = pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters(),
                                  sparsity=0.5, ranking="layer", begin_step=0, end_step=0, pack_min_numel=0, verify_every=1)
    hashed = []
    original = pruning.mask_fingerprint
    monkeypatch.setattr(pruning, "mask_fingerprint", lambda mask: hashed.append(mask.size) or original(mask))
    for step in range(4):  # step 0 prunes (hashing the new masks), steps 1-3 each check the held masks
        step_on(model, opt, step)
    assert len(hashed) == 2 * len(opt.masks()), "once at the mask change, once at the first check of each"
    if hvd.rank() == 1:  # an in-place change of a held mask is hashed again, and caught
        mask = opt.pactrain_state.pruner.masks["2.weight"]
        mask.copy_(mask.flip(1))
        opt.pactrain_state.rebuild_plan()
    with pytest.raises(pt.MaskMismatchError, match=r"'2.weight': ranks \[1\] differ"):
        step_on(model, opt, 4)
