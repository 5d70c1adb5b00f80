"""Local steps (``sync_every``): ranks step alone and every H steps take one outer Nesterov step on the average of
their progress, carried packed like gradients."""

import io

import horovod.torch as hvd
import pytest
import torch
from conftest import assert_same_on_all_ranks, loss_of, make_model, named

import pactrain_hvd.torch as pt
from pactrain_hvd.core import SettingsMismatchError

H, LR, BETA = 3, 0.7, 0.9


def optimizer(model, prefix, **keywords):
    settings = dict(sparsity=0.9, ranking="layer", begin_step=0, end_step=0, pack_min_numel=1000, sync_every=H,
                    outer_lr=LR, outer_momentum=BETA)
    return pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                   named_parameters=named(model, prefix), **{**settings, **keywords})


def gathered(tensor, name):
    """Every rank's ``tensor``, stacked (rank 0 first)."""
    return hvd.allgather(tensor.detach().reshape(1, -1).contiguous(), name=name)


def differs_across_ranks(parameters, name):
    return any(not torch.equal(*gathered(p, f"{name}.{n}")[:2]) for n, p in parameters.items())


def weights(opt):
    return {name: p.detach().clone() for name, p in opt._parameters.items()}


@pytest.mark.parametrize("packed_values", ["inherit", "int3"])
def test_after_each_sync_ranks_hold_the_outer_step_on_their_mean_progress(packed_values):
    model = make_model()
    prefix = f"ls.{packed_values}"
    opt = optimizer(model, prefix, packed_values=packed_values)
    state = opt.pactrain_state
    local = {}
    opt.register_step_post_hook(lambda *_: local.update(weights(opt)))  # after the inner update, before the sync
    momentum = {name: torch.zeros_like(p) for name, p in opt._parameters.items()}
    for step in range(2 * H):
        if step % H == 0:
            anchor = weights(opt)
        opt.zero_grad()
        loss_of(model, step).backward()
        residuals = {name: r.clone() for name, r in state.quantized.memory.residuals.items()} if state.quantized else {}
        opt.step()
        masks = opt.masks()
        if step % H == 0:  # masks ranked at the interval's first step zero the anchor too
            anchor.update({name: anchor[name] * mask for name, mask in masks.items()})
        for name, mask in masks.items():
            assert not opt._parameters[name][~mask].any(), f"{name}: a pruned weight moved at step {step}"
        if (step + 1) % H:
            assert opt.stats()["sent_bytes"] == 0, "a local step communicates nothing"
            assert differs_across_ranks(opt._parameters, f"local.{prefix}.{step}"), "ranks step on their own gradients"
            continue
        assert_same_on_all_ranks(opt._parameters, f"synced.{prefix}.{step}")
        for name, p in opt._parameters.items():
            sent = anchor[name] - local[name]
            compressor = state.compressor(p)
            if compressor.lanes is not None:  # what rounding sent: progress plus memory, less the new memory
                survivors = compressor.surviving_indices
                codes = sent.reshape(-1)[survivors] + residuals.get(name, 0) - state.quantized.memory.residuals[name]
                sent = torch.zeros(p.numel()).index_put_((survivors,), codes).reshape(p.shape)
            mean = gathered(sent, f"ref.{prefix}.{step}.{name}").mean(0).reshape(p.shape)
            momentum[name] = BETA * momentum[name] + mean
            expected = anchor[name] - LR * (mean + BETA * momentum[name])
            assert torch.allclose(p, expected, rtol=1e-5, atol=1e-6), f"{name} after the sync at step {step}"
            assert torch.equal(state.outer.anchor[name], p), "the synced weights are the next anchor"


def test_the_bytes_of_an_interval_are_one_packed_sync_of_the_per_step_optimizer():
    sent = {}
    for sync_every in (1, H):
        model = make_model()
        opt = optimizer(model, f"bytes{sync_every}", packed_values="int3", sync_every=sync_every)
        per_step = []
        for step in range(H):
            opt.zero_grad()
            loss_of(model, step).backward()
            opt.step()
            per_step.append(opt.stats()["sent_bytes"])
        sent[sync_every] = per_step
    assert sent[H][:-1] == [0] * (H - 1)
    assert sent[H][-1] == sent[1][-1] > 0, sent


def test_sync_every_1_is_the_per_step_optimizer_bitwise():
    results = []
    for keywords in ({}, {"sync_every": 1, "outer_lr": 0.3, "outer_momentum": 0.5}):
        model = make_model()
        opt = pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                      named_parameters=named(model, "one"), sparsity=0.9,
                                      begin_step=0, end_step=0, packed_values="int3", **keywords)
        for step in range(3):
            opt.zero_grad()
            loss_of(model, step).backward()
            opt.step()
        assert opt.pactrain_state.outer is None
        results.append(weights(opt))
    assert all(torch.equal(a, b) for a, b in zip(results[0].values(), results[1].values()))


def _train(model, opt, steps):
    for step in steps:
        opt.zero_grad()
        loss_of(model, step).backward()
        opt.step()


def test_resume_mid_interval_from_each_ranks_own_checkpoint_is_exact():
    model = make_model()
    opt = optimizer(model, "resume", packed_values="int3")
    _train(model, opt, range(2 * H + 1))
    uninterrupted = weights(opt)

    model = make_model()
    opt = optimizer(model, "resume", packed_values="int3")
    _train(model, opt, range(H + 1))  # one step into the second interval
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer)
    model = make_model(seed=1)
    opt = optimizer(model, "resume", packed_values="int3")
    model.load_state_dict(saved["model"])
    opt.load_state_dict(saved["optimizer"])
    assert opt.step_count == H + 1
    _train(model, opt, range(H + 1, 2 * H + 1))
    assert all(torch.equal(uninterrupted[name], p) for name, p in opt._parameters.items())


def test_horovods_resume_idiom_carries_the_anchor_and_outer_momentum():
    model = make_model()
    opt = optimizer(model, "idiom")
    _train(model, opt, range(2 * H + 1))  # outer momentum is held; one step into the third interval
    saved = {name: (t.clone(), opt.pactrain_state.outer.momentum[name].clone())
             for name, t in opt.pactrain_state.outer.anchor.items()}
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, buffer)

    model = make_model(seed=1 + hvd.rank())
    opt = optimizer(model, "idiom")
    if hvd.rank() == 0:
        buffer.seek(0)
        checkpoint = torch.load(buffer)
        model.load_state_dict(checkpoint["model"])
        opt.load_state_dict(checkpoint["optimizer"])
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    outer = opt.pactrain_state.outer
    assert_same_on_all_ranks(outer.anchor, "idiom.anchor")
    assert_same_on_all_ranks(outer.momentum, "idiom.momentum")
    if hvd.rank() == 0:
        assert all(torch.equal(outer.anchor[n], a) and torch.equal(outer.momentum[n], m) for n, (a, m) in saved.items())
    _train(model, opt, range(2 * H + 1, 3 * H))
    assert opt.step_count == 3 * H
    assert_same_on_all_ranks(opt._parameters, "idiom.synced")


@pytest.mark.parametrize("keywords, message", [
    ({"sync_every": 0}, "sync_every must be an int >= 1"),
    ({"sync_every": 2.5}, "sync_every must be an int >= 1"),
    ({"outer_lr": 0.0}, "outer_lr must be > 0"),
    ({"outer_momentum": 1.0}, r"outer_momentum must be in \[0, 1\)"),
    ({"op": hvd.Sum}, "sync_every=3 needs op=hvd.Average"),
])
def test_bad_local_step_arguments_are_refused_before_anything_is_communicated(keywords, message):
    model = make_model()
    with pytest.raises(ValueError, match=message):
        optimizer(model, "bad", **keywords)


def test_ranks_that_disagree_on_sync_every_fail_on_every_rank_at_the_first_step():
    model = make_model()
    opt = optimizer(model, "disagree", sync_every=H + hvd.rank())
    opt.zero_grad()
    loss_of(model, 0).backward()
    with pytest.raises(SettingsMismatchError, match=r"sync_every \(rank 0: 3, rank 1: 4\)"):
        opt.step()
