"""``hvd.elastic.TorchState`` with ``pt.DistributedOptimizer``: commit/restore and sync carry masks and schedule.

The kill-and-rejoin run under ``horovodrun --min-np`` is tests/elastic; these check the state object's
three operations directly, in seconds, on both ranks.
"""

import horovod.torch as hvd
import pytest
import torch
from conftest import assert_same_on_all_ranks

import pactrain_hvd.torch as pt

SCHEDULE = dict(sparsity=0.9, ranking="layer", begin_step=0, end_step=12, frequency=3, pack_min_numel=0)
OPTIMIZERS = [
    lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=1e-3),
    lambda params: torch.optim.AdamW(params, lr=1e-3, weight_decay=0.05),
]


def build(make_optimizer, seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    opt = pt.DistributedOptimizer(make_optimizer(model.parameters()), named_parameters=model.named_parameters(), **SCHEDULE)
    return model, opt


def train(model, opt, steps: int) -> None:
    for _ in range(steps):
        generator = torch.Generator().manual_seed(10_000 * hvd.rank() + opt.step_count)
        inputs, labels = torch.randn(16, 32, generator=generator), torch.randint(0, 4, (16,), generator=generator)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(inputs), labels).backward()
        opt.step()


def optimizer_tensors(opt) -> dict:
    return {f"{i}.{key}": value for i, p in enumerate(opt.param_groups[0]["params"])
            for key, value in opt.state[p].items() if torch.is_tensor(value)}


def as_bytes(masks: dict) -> dict:
    return {name: mask.to(torch.uint8) for name, mask in masks.items()}


def test_torch_state_picks_the_pactrain_handler():
    model, opt = build(OPTIMIZERS[0])
    state = hvd.elastic.TorchState(model=model, optimizer=opt)
    assert type(state._handlers["optimizer"]) is pt.PacTrainStateHandler
    plain = hvd.elastic.TorchState(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    assert type(plain._handlers["optimizer"]).__name__ == "OptimizerStateHandler"


@pytest.mark.parametrize("make_optimizer", OPTIMIZERS, ids=["sgd-momentum-wd", "adamw"])
def test_restore_rolls_back_masks_schedule_weights_and_state_to_the_commit(make_optimizer):
    model, opt = build(make_optimizer)
    state = hvd.elastic.TorchState(model=model, optimizer=opt, step=0)
    train(model, opt, 4)
    state.step = 4
    state.save()  # what commit() stores
    committed = (opt.masks(), {n: p.clone() for n, p in model.named_parameters()},
                 {k: v.clone() for k, v in optimizer_tensors(opt).items()})
    train(model, opt, 4)  # crosses the mask change at step 6
    assert any(not torch.equal(m, committed[0][n]) for n, m in opt.masks().items())
    state.restore()
    assert state.step == opt.step_count == 4
    for name, mask in opt.masks().items():
        assert torch.equal(mask, committed[0][name]), name
    for name, p in model.named_parameters():
        assert torch.equal(p, committed[1][name]), name
    for key, value in optimizer_tensors(opt).items():
        assert torch.equal(value, committed[2][key]), key
    train(model, opt, 4)  # and training goes on from there, identical on both ranks
    assert_same_on_all_ranks(dict(model.named_parameters()), "restored.parameter")
    assert_same_on_all_ranks(as_bytes(opt.masks()), "restored.mask")


@pytest.mark.parametrize("make_optimizer", OPTIMIZERS, ids=["sgd-momentum-wd", "adamw"])
def test_sync_gives_a_fresh_worker_rank_0s_masks_schedule_weights_and_state(make_optimizer):
    """Rank 1 plays a worker that just joined: new model (other seed), no optimizer state, no masks."""
    model, opt = build(make_optimizer)
    train(model, opt, 7)  # masks changed at 0, 3 and 6
    if hvd.rank() == 1:
        model, opt = build(make_optimizer, seed=1)
    state = hvd.elastic.TorchState(model=model, optimizer=opt, step=7 if hvd.rank() == 0 else 0)
    state.sync()
    positions = hvd.allgather_object((state.step, opt.step_count, sorted(opt.masks())))
    assert positions == [(7, 7, ["0.weight", "2.weight"])] * hvd.size()
    assert_same_on_all_ranks(as_bytes(opt.masks()), "synced.mask")
    assert_same_on_all_ranks(dict(model.named_parameters()), "synced.parameter")
    assert_same_on_all_ranks(optimizer_tensors(opt), "synced.state")
    train(model, opt, 6)  # mask change at 9 and 12 on both, still identical
    assert hvd.allgather_object(opt.step_count) == [13] * hvd.size()
    assert_same_on_all_ranks(dict(model.named_parameters()), "trained.parameter")
    assert_same_on_all_ranks(as_bytes(opt.masks()), "trained.mask")
    for name, mask in opt.masks().items():
        assert torch.count_nonzero(dict(model.named_parameters())[name][~mask]) == 0, name
