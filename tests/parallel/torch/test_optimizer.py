"""pt.DistributedOptimizer against hvd.DistributedOptimizer and a dense all-reduce reference."""

import copy

import horovod.torch as hvd
import pytest
import torch
from conftest import assert_same_on_all_ranks, loss_of, make_model, named

import pactrain_hvd.torch as pt
from pactrain_hvd.core import num_to_keep


def sgd(model):
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3)


def train(model, opt, steps, start=0):
    for step in range(start, start + steps):
        opt.zero_grad()
        loss_of(model, step).backward()
        opt.step()


def dense_reference_grads(model, opt, step, op=hvd.Average):
    """What a dense all-reduce of the masked local gradients gives, computed on a copy."""
    twin = copy.deepcopy(model)
    loss_of(twin, step).backward()
    masks = opt.masks()
    reference = {}
    for name, q in twin.named_parameters():
        key = next(k for k in opt._parameters if k.endswith("." + name))
        grad = q.grad * masks[key] if key in masks else q.grad
        reference[key] = hvd.allreduce(grad, name=f"reference.{key}", op=op)
    return reference


def test_sparsity_zero_is_bitwise_hvd_distributed_optimizer():
    ours_model, theirs_model = make_model(), make_model()
    ours = pt.DistributedOptimizer(sgd(ours_model), named_parameters=named(ours_model, "ours"), sparsity=0.0)
    theirs = hvd.DistributedOptimizer(sgd(theirs_model), named_parameters=named(theirs_model, "theirs"))
    for step in range(4):
        train(ours_model, ours, 1, step)
        train(theirs_model, theirs, 1, step)
        for (name, a), b in zip(ours_model.named_parameters(), theirs_model.parameters()):
            assert torch.equal(a.grad, b.grad), f"gradient of {name} differs at step {step}"
            assert torch.equal(a, b), f"{name} differs at step {step}"
    assert ours.masks() == {}
    assert ours.stats()["sent_bytes"] == ours.stats()["dense_bytes"]


@pytest.mark.parametrize("compression, value_bytes", [(hvd.Compression.none, 4), (hvd.Compression.fp16, 2)])
def test_one_shot_packs_survivors_and_matches_dense_reference(compression, value_bytes):
    model = make_model()
    opt = pt.DistributedOptimizer(sgd(model), named_parameters=named(model, "m"), compression=compression,
                                  sparsity=0.9, ranking="layer", begin_step=0, end_step=0, pack_min_numel=1000)
    train(model, opt, 1)  # step 0 prunes once, from identical weights
    masks = opt.masks()
    assert set(masks) == {"m.conv1.weight", "m.conv2.weight", "m.fc.weight"}
    for name, mask in masks.items():
        assert int(mask.sum()) == num_to_keep(mask.numel(), 0.9), name
    for step in range(1, 4):
        reference = dense_reference_grads(model, opt, step)
        opt.zero_grad()
        loss_of(model, step).backward()
        opt.synchronize()
        tolerance = dict(rtol=1e-6, atol=1e-7) if value_bytes == 4 else dict(rtol=2e-3, atol=1e-4)
        for name, p in opt._parameters.items():
            torch.testing.assert_close(p.grad, reference[name], **tolerance, msg=f"gradient of {name}")
            if name in masks:
                assert torch.all(p.grad[~masks[name]] == 0), f"pruned gradient of {name} is not 0"
        with opt.skip_synchronize():
            opt.step()
        stats = opt.stats()["tensors"]
        for name, mask in masks.items():
            entry = stats[name]
            assert entry["packed"] == (mask.numel() >= 1000), name
            expected = int(mask.sum()) * value_bytes if entry["packed"] else mask.numel() * value_bytes
            assert entry["sent_bytes"] == expected, name
        assert stats["m.fc.bias"]["sent_bytes"] == 10 * value_bytes
    for name, mask in masks.items():
        assert torch.all(opt._parameters[name][~mask] == 0), f"pruned weights of {name} are not 0"
    assert_same_on_all_ranks(dict(model.named_parameters()))


def test_gradual_schedule_follows_cubic_targets_and_masks_only_shrink():
    model = make_model()
    opt = pt.DistributedOptimizer(sgd(model), named_parameters=named(model, "g"), sparsity=0.9, ranking="layer",
                                  begin_step=0, end_step=6, frequency=2)
    schedule, history = opt.config.schedule, []
    for step in range(9):
        train(model, opt, 1, step)
        history.append(opt.masks())
        if schedule.is_update_step(step):
            for name, mask in history[-1].items():
                assert int(mask.sum()) == num_to_keep(mask.numel(), schedule.target(step)), (name, step)
    for before, after in zip(history, history[1:]):
        for name, mask in after.items():
            if name in before:
                assert not (mask & ~before[name]).any(), f"{name} regrew a pruned coordinate"
    assert all(torch.equal(history[6][n], history[8][n]) for n in history[8])  # frozen after end_step
    assert opt.stats()["sparsity"] == pytest.approx(0.9, abs=0.01)
    assert_same_on_all_ranks(dict(model.named_parameters()))


@pytest.mark.parametrize("make_optimizer", [
    lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=1e-2),
    lambda params: torch.optim.Adam(params, lr=1e-2),
    lambda params: torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1),
], ids=["sgd-momentum-wd", "adam", "adamw"])
def test_pruned_weights_and_state_stay_zero_with_any_optimizer(make_optimizer):
    model = make_model()
    opt = pt.DistributedOptimizer(make_optimizer(model.parameters()), named_parameters=named(model, "o"),
                                  sparsity=0.8, ranking="layer", begin_step=2, end_step=4, frequency=1)
    train(model, opt, 8)
    masks = opt.masks()
    assert masks
    for name, mask in masks.items():
        p = opt._parameters[name]
        assert torch.all(p[~mask] == 0), f"pruned weights of {name} revived"
        for key, value in opt.state[p].items():
            if torch.is_tensor(value) and value.shape == p.shape:
                assert torch.all(value[~mask] == 0), f"optimizer state {key} of {name} is not cleared"
    assert_same_on_all_ranks(dict(model.named_parameters()))
    assert_same_on_all_ranks({f"{n}.{k}": v for n, p in opt._parameters.items()
                              for k, v in opt.state[p].items() if torch.is_tensor(v)}, "state")


def test_backward_passes_per_step_accumulates_before_communicating():
    model = make_model()
    opt = pt.DistributedOptimizer(sgd(model), named_parameters=named(model, "b"), backward_passes_per_step=2,
                                  sparsity=0.5, ranking="layer", begin_step=0, end_step=0, pack_min_numel=0)
    train(model, opt, 1)
    twin = copy.deepcopy(model)
    (loss_of(twin, 10) + loss_of(twin, 11)).backward()
    masks = opt.masks()
    reference = {n: hvd.allreduce(q.grad * masks.get("b." + n, 1), name=f"bpps.{n}") for n, q in twin.named_parameters()}
    opt.zero_grad()
    loss_of(model, 10).backward()
    loss_of(model, 11).backward()
    opt.synchronize()
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, reference[name], rtol=1e-5, atol=1e-6)
    with opt.skip_synchronize():
        opt.step()
    assert_same_on_all_ranks(dict(model.named_parameters()))


def test_groups_sum_and_predivide_match_their_references():
    results = {}
    for label, kwargs in {
        "plain": {},
        "groups": {"groups": 2},
        "predivide": {"gradient_predivide_factor": 2.0},
    }.items():
        model = make_model()
        opt = pt.DistributedOptimizer(sgd(model), named_parameters=named(model, label), sparsity=0.9, ranking="layer",
                                      begin_step=0, end_step=0, pack_min_numel=0, **kwargs)
        train(model, opt, 4)
        results[label] = [p.detach().clone() for p in model.parameters()]
        assert_same_on_all_ranks(dict(model.named_parameters()))
    for a, b in zip(results["plain"], results["groups"]):
        assert torch.equal(a, b)  # the same sums, only grouped differently
    for a, b in zip(results["plain"], results["predivide"]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)

    model = make_model()
    opt = pt.DistributedOptimizer(sgd(model), named_parameters=named(model, "sum"), op=hvd.Sum,
                                  sparsity=0.9, ranking="layer", begin_step=0, end_step=0, pack_min_numel=0)
    train(model, opt, 1)
    reference = dense_reference_grads(model, opt, 5, op=hvd.Sum)
    opt.zero_grad()
    loss_of(model, 5).backward()
    opt.synchronize()
    for name, p in opt._parameters.items():
        torch.testing.assert_close(p.grad, reference[name], rtol=1e-6, atol=1e-7)


class TwoHeads(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = torch.nn.Linear(64, 64)
        self.used = torch.nn.Linear(64, 4)
        self.unused = torch.nn.Linear(64, 4)

    def forward(self, x, use_second):
        h = torch.relu(self.body(x))
        return self.unused(h) if use_second else self.used(h)


def test_parameters_without_gradient_on_one_rank_get_the_others_gradient():
    model = TwoHeads()
    opt = pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=named(model, "u"),
                                  sparsity=0.5, ranking="layer", begin_step=0, end_step=0, pack_min_numel=0)
    before = model.unused.weight.detach().clone()
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(hvd.rank()))
    for step in range(3):
        opt.zero_grad()
        model(x, use_second=(hvd.rank() == 1 and step > 0)).sum().backward()
        opt.step()
    assert not torch.equal(model.unused.weight, before * opt.masks()["u.unused.weight"])
    assert_same_on_all_ranks(dict(model.named_parameters()))


def test_state_dict_round_trip_resumes_bitwise():
    model, resumed_model = make_model(), make_model()
    opt = pt.DistributedOptimizer(sgd(model), named_parameters=named(model, "r"), sparsity=0.9, ranking="layer",
                                  begin_step=0, end_step=6, frequency=2)
    train(model, opt, 3)
    checkpoint = copy.deepcopy({"model": model.state_dict(), "opt": opt.state_dict()})
    assert checkpoint["opt"]["pactrain"]["step"] == 3
    train(model, opt, 5, start=3)

    resumed = pt.DistributedOptimizer(sgd(resumed_model), named_parameters=named(resumed_model, "r"),
                                      sparsity=0.9, ranking="layer", begin_step=0, end_step=6, frequency=2)
    resumed_model.load_state_dict(checkpoint["model"])
    resumed.load_state_dict(checkpoint["opt"])
    assert resumed.step_count == 3
    assert all(torch.equal(resumed.masks()[n], m) for n, m in checkpoint["opt"]["pactrain"]["masks"].items())
    train(resumed_model, resumed, 5, start=3)
    for a, b in zip(model.parameters(), resumed_model.parameters()):
        assert torch.equal(a, b)
    for name, mask in opt.masks().items():
        assert torch.equal(resumed.masks()[name], mask)


def test_broadcast_masks_gives_every_rank_the_root_masks():
    model = make_model()
    opt = pt.DistributedOptimizer(sgd(model), named_parameters=named(model, "bm"), sparsity=0.5, ranking="layer",
                                  begin_step=0, end_step=0)
    train(model, opt, 1)
    rank_masks = opt.masks()
    if hvd.rank() == 1:  # rank 1 drifts: same counts, other positions
        rank_masks = {n: m.flip(0) if m.shape[0] > 1 else m for n, m in rank_masks.items()}
        opt.set_masks(rank_masks)
    pt.broadcast_masks(opt, root_rank=0)
    assert_same_on_all_ranks({n: m.to(torch.uint8) for n, m in opt.masks().items()}, "mask")
    train(model, opt, 1, start=1)


def test_mask_drift_raises_on_every_rank_before_communicating():
    model = make_model()
    opt = pt.DistributedOptimizer(sgd(model), named_parameters=named(model, "drift"), sparsity=0.5, ranking="layer",
                                  begin_step=0, end_step=0, verify_every=2)
    train(model, opt, 2)  # set_masks is local: the check is due at a step every rank knows (here step 2)
    masks = opt.masks()
    if hvd.rank() == 1:
        masks["drift.fc.weight"] = masks["drift.fc.weight"].flip(1)
    opt.set_masks(masks)
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    with pytest.raises(pt.MaskMismatchError, match=r"'drift.fc.weight': ranks \[1\] differ"):
        loss_of(model, 1).backward()
    for name, p in model.named_parameters():
        assert torch.equal(p, weights[name] * masks.get("drift." + name, 1)), name


def test_stats_report_bytes_handed_to_horovod():
    model = make_model()
    opt = pt.DistributedOptimizer(sgd(model), named_parameters=named(model, "s"), sparsity=0.9, ranking="layer",
                                  begin_step=0, end_step=0, pack_min_numel=0)
    train(model, opt, 2)
    stats = opt.stats()
    prunable = sum(m.numel() for m in opt.masks().values())
    kept = sum(int(m.sum()) for m in opt.masks().values())
    others = sum(p.numel() for n, p in opt._parameters.items() if n not in opt.masks())
    assert stats["sent_bytes"] == 4 * (kept + others)
    assert stats["dense_bytes"] == 4 * (prunable + others)
    assert stats["compression_ratio"] > 3


def test_horovod_broadcast_helpers_work_on_the_wrapper():
    model = make_model(seed=hvd.rank())  # ranks start different, as in a real job
    opt = pt.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=1e-2), named_parameters=named(model, "hb"),
                                  sparsity=0.9, ranking="layer", begin_step=0, end_step=0)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)  # its zero-gradient step on a fresh optimizer is local, uncounted
    pt.broadcast_masks(opt, root_rank=0)
    train(model, opt, 3)
    assert opt.masks() and opt.step_count == 3
    assert_same_on_all_ranks(dict(model.named_parameters()))
    assert_same_on_all_ranks({f"{n}.{k}": v for n, p in opt._parameters.items()
                              for k, v in opt.state[p].items() if torch.is_tensor(v)}, "state")


def test_pt_broadcast_optimizer_state_is_local_and_does_not_count_a_step():
    model = make_model(seed=hvd.rank())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)

    def wrap():
        inner = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.1)
        return pt.DistributedOptimizer(inner, named_parameters=named(model, "bo"), sparsity=0.9, ranking="layer", begin_step=0, end_step=0)

    opt = wrap()
    train(model, opt, 1)  # both ranks: state and masks exist
    if hvd.rank() == 1:  # a rank that just joined: fresh optimizer, no state, no masks
        opt = wrap()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    pt.broadcast_optimizer_state(opt, root_rank=0)
    assert opt.step_count == 1 and len(opt.masks()) > 0
    for name, p in model.named_parameters():  # the local init step's weight decay was undone
        assert torch.equal(p, before[name]), name
    assert_same_on_all_ranks({n: m.to(torch.uint8) for n, m in opt.masks().items()}, "masks")
    assert_same_on_all_ranks({f"{n}.{k}": v for n, p in opt._parameters.items()
                              for k, v in opt.state[p].items() if torch.is_tensor(v)}, "state")


def test_pactrain_state_is_the_optimizers_state_and_verifies_on_demand():
    """``opt.pactrain_state`` (torch's explicit state, as TF's) answers for the optimizer; ``verify()`` is the
    Mask Tracker now, on every rank."""
    model = make_model()
    opt = pt.DistributedOptimizer(sgd(model), named_parameters=named(model, "state"), sparsity=0.5, ranking="layer",
                                  begin_step=0, end_step=0, verify_every=0)
    train(model, opt, 2)
    state = opt.pactrain_state
    assert isinstance(state, pt.PacTrainState) and state.step_count == opt.step_count == 2
    assert state.masks().keys() == opt.masks().keys() and all(
        torch.equal(mask, opt.masks()[name]) for name, mask in state.masks().items())
    assert state.stats() == opt.stats()
    state.verify()  # the same masks: no error, on either rank
    masks = state.masks()
    if hvd.rank() == 1:
        masks["state.fc.weight"] = masks["state.fc.weight"].flip(1)
    state.set_masks(masks)
    with pytest.raises(pt.MaskMismatchError, match=r"'state.fc.weight': ranks \[1\] differ"):
        state.verify()
