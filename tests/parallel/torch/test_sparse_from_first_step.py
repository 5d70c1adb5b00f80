"""Sparse from the first step: step 0's all-reduce already carries only survivors, from masks every rank
proved equal (Mask Tracker at step 0) and ranked on the weights the root broadcast."""

import copy

import horovod.torch as hvd
import numpy as np
import pytest
import torch
from conftest import assert_same_on_all_ranks, loss_of, make_model
from rescale_expectations import assert_rescaled_once

import pactrain_hvd.torch as pt
from pactrain_hvd.core import MaskMismatchError, magnitude_masks, num_to_keep
from pactrain_hvd.core.lanes import SCALE_BYTES, quantized_layout

PRUNABLE = ("conv1.weight", "conv2.weight", "fc.weight")


def sgd(model):
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3)


def fresh(seed_by_rank: bool = True, **kwargs):
    """A model initialised differently on every rank, wrapped, then broadcast from the root (Horovod's idiom)."""
    model = make_model(seed=hvd.rank() if seed_by_rank else 0)
    opt = pt.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters(), ranking="layer",
                                  pack_min_numel=0, **kwargs)
    return model, opt


def one_step(model, opt, step):
    opt.zero_grad()
    loss_of(model, step).backward()
    opt.step()


def counting_verifications(opt) -> list:
    steps, verify = [], opt.pactrain_state.pruner.verify

    def counted(step, *args, **kwargs):
        steps.append(step)
        return verify(step, *args, **kwargs)

    opt.pactrain_state.pruner.verify = counted
    return steps


def assert_every_prunable_tensor_packed(opt, kept_by_name=None):
    stats = opt.stats()["tensors"]
    for name in PRUNABLE:
        tensor = stats[name]
        assert tensor["packed"], f"{name} travelled dense at step {opt.stats()['step']}"
        assert tensor["kept"] < tensor["numel"], name
        if kept_by_name is not None:
            assert tensor["kept"] == kept_by_name[name], name


@pytest.mark.parametrize("schedule", [
    {"schedule": pt.ConstantSparsity(0.9)},
    {"sparsity": 0.9, "begin_step": 0, "end_step": 0},
])
def test_step_0_hands_horovod_the_packed_bytes_of_masks_ranked_on_the_broadcast_weights(schedule):
    model, opt = fresh(**schedule)
    verified = counting_verifications(opt)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    broadcast = {name: p.detach().clone() for name, p in model.named_parameters()}
    one_step(model, opt, 0)

    stats = opt.stats()
    assert stats["step"] == 0
    assert verified == [0]  # the Mask Tracker proved the new masks at step 0, before anything was packed
    masks = opt.masks()
    assert set(masks) == set(PRUNABLE)
    assert_same_on_all_ranks({n: m.to(torch.uint8) for n, m in masks.items()}, "mask")
    expected = magnitude_masks({n: broadcast[n].numpy() for n in PRUNABLE}, 0.9, {}, "layer")
    for name in PRUNABLE:
        assert np.array_equal(masks[name].numpy(), expected[name]), f"{name}: not the broadcast weights' magnitudes"
    kept = {name: num_to_keep(broadcast[name].numel(), 0.9) for name in PRUNABLE}
    assert_every_prunable_tensor_packed(opt, kept)
    for name, tensor in stats["tensors"].items():
        packed_bytes = 4 * kept[name] if name in PRUNABLE else 4 * tensor["numel"]
        assert tensor["sent_bytes"] == packed_bytes, name
    assert stats["sent_bytes"] == sum(4 * k for k in kept.values()) + sum(
        4 * p.numel() for n, p in model.named_parameters() if n not in PRUNABLE)
    assert stats["sent_bytes"] < 0.2 * stats["dense_bytes"]
    for name in PRUNABLE:  # zeroed once autograd was done, and kept at 0 by the update
        weight = dict(model.named_parameters())[name]
        assert torch.all(weight[~masks[name]] == 0), name
        assert torch.all(weight.grad[~masks[name]] == 0), name
    assert_same_on_all_ranks(dict(model.named_parameters()))

    for step in range(1, 4):  # and no later step sends a prunable tensor dense
        one_step(model, opt, step)
        assert opt.stats()["step"] == step
        assert_every_prunable_tensor_packed(opt, kept)
    assert verified == [0]
    assert_same_on_all_ranks(dict(model.named_parameters()))


@pytest.mark.parametrize("rescale", [False, True])
def test_rescale_survivors_gives_step_0s_survivors_their_tensors_norm_once(rescale):
    model = make_model(seed=hvd.rank())
    opt = pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0), named_parameters=model.named_parameters(),
                                  schedule=pt.ConstantSparsity(0.9), ranking="layer", pack_min_numel=0,
                                  rescale_survivors=rescale)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    broadcast = {name: p.detach().numpy().copy() for name, p in model.named_parameters()}
    one_step(model, opt, 0)
    after_step_0 = {name: p.detach().numpy().copy() for name, p in model.named_parameters()}
    assert_rescaled_once(broadcast, after_step_0, {n: m.numpy() for n, m in opt.masks().items()}, rescale)
    for step in range(1, 3):  # once: later steps (learning rate 0) leave the weights as they are
        one_step(model, opt, step)
    for name, weight in model.named_parameters():
        assert np.array_equal(weight.detach().numpy(), after_step_0[name]), name
    assert_same_on_all_ranks(dict(model.named_parameters()))


def test_step_0_reduces_what_a_dense_all_reduce_of_the_masked_gradients_gives():
    model, opt = fresh(schedule=pt.ConstantSparsity(0.8))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    twin = copy.deepcopy(model)
    loss_of(twin, 0).backward()
    opt.zero_grad()
    loss_of(model, 0).backward()
    opt.synchronize()
    masks = opt.masks()
    for name, q in twin.named_parameters():
        grad = q.grad * masks[name] if name in masks else q.grad
        reference = hvd.allreduce(grad, name=f"first.reference.{name}")
        torch.testing.assert_close(dict(model.named_parameters())[name].grad, reference, rtol=1e-6, atol=1e-7)
    with opt.skip_synchronize():
        opt.step()


@pytest.mark.parametrize("packed_values", ["inherit", "ternary"])
def test_a_prunable_tensor_whose_gradient_is_ready_first_travels_packed(packed_values):
    """The plan is read after step 0's masks are ranked, whichever tensor's hook comes first."""
    model = torch.nn.Sequential(torch.nn.Linear(64, 32, bias=False), torch.nn.ReLU(), torch.nn.Linear(32, 4, bias=False))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = pt.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters(), ranking="layer",
                                  pack_min_numel=0, schedule=pt.ConstantSparsity(0.5), packed_values=packed_values)
    inputs = torch.randn(16, 64, generator=torch.Generator().manual_seed(hvd.rank()))
    for step in range(3):
        opt.zero_grad()
        model(inputs).square().mean().backward()
        opt.step()
        for name, tensor in opt.stats()["tensors"].items():
            assert tensor["packed"] and tensor["kept"] == tensor["numel"] // 2, (name, step)
            if packed_values == "inherit":
                assert tensor["sent_bytes"] == 4 * tensor["kept"], (name, step)
    assert_same_on_all_ranks(dict(model.named_parameters()))


def test_ternary_values_from_the_first_step():
    model, opt = fresh(schedule=pt.ConstantSparsity(0.95), packed_values="ternary")
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    layout = quantized_layout(hvd.size())
    for step in range(3):
        one_step(model, opt, step)
        assert_every_prunable_tensor_packed(opt)
        for name in PRUNABLE:
            tensor = opt.stats()["tensors"][name]
            assert tensor["sent_bytes"] == 4 * layout.words(tensor["kept"]) + SCALE_BYTES, name
    assert opt.stats()["values"] == "ternary"
    assert_same_on_all_ranks(dict(model.named_parameters()))


def test_short_ramp_packs_every_step_at_the_density_it_holds():
    model, opt = fresh(schedule=pt.short_ramp(0.9, steps=4, initial_sparsity=0.5))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    schedule, sent = opt.config.schedule, []
    for step in range(7):
        one_step(model, opt, step)
        # step t reduces under the masks ranked for step t - 1 (step 0: ranked before its reduction)
        target = schedule.target(max(step - 1, 0))
        kept = {name: num_to_keep(p.numel(), target) for name, p in model.named_parameters() if name in PRUNABLE}
        assert_every_prunable_tensor_packed(opt, kept)
        sent.append(opt.stats()["sent_bytes"])
    assert sent == sorted(sent, reverse=True) and sent[-1] < sent[0]
    assert opt.stats()["sparsity"] == pytest.approx(0.9, abs=0.01)
    assert_same_on_all_ranks(dict(model.named_parameters()))


def test_weights_not_broadcast_are_caught_at_step_0_on_every_rank():
    model, opt = fresh(schedule=pt.ConstantSparsity(0.9))  # different weights on each rank, no broadcast
    opt.zero_grad()
    with pytest.raises(MaskMismatchError, match="differ"):
        loss_of(model, 0).backward()
    opt._detach()
