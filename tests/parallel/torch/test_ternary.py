"""packed_values='ternary' and 'int3': shared-scale codes summed in int32 lanes by Horovod, with error feedback.

The scale of a tensor's codes is the one every rank holds: the MAX over ranks of the previous step's
levels x STEP_OVER_MEAN x mean |value|, so the codes leave from the gradient hook; a tensor without one waits for this
step's MAX."""

import copy

import horovod.torch as hvd
import pytest
import torch
from conftest import amp_step, assert_same_on_all_ranks, loss_of, make_model, named

import pactrain_hvd.torch as pt
from pactrain_hvd.core.lanes import STEP_OVER_MEAN, quantized_layout


def sgd(model, lr=0.05):
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)


def all_true(flag: bool, name: str) -> bool:
    """``flag`` on every rank (so every rank asserts the same thing and none hangs)."""
    return bool(hvd.allreduce(torch.tensor([int(flag)]), op=hvd.Min, name=f"check.{name}").item())


@pytest.mark.parametrize("packed_values, levels", [("ternary", 1), ("int3", 3)])
@pytest.mark.parametrize("op", [hvd.Average, hvd.Sum])
def test_quantized_gradients_are_the_mean_of_each_ranks_dequantized_codes(op, packed_values, levels):
    size = hvd.size()
    model = make_model()
    prefix = f"t{op}{packed_values}"
    opt = pt.DistributedOptimizer(sgd(model), named_parameters=named(model, prefix), op=op, packed_values=packed_values,
                                  sparsity=0.9, ranking="layer", begin_step=0, end_step=0, pack_min_numel=1000)
    layout = quantized_layout(size, levels)
    ternary_names = [f"{prefix}.conv2.weight", f"{prefix}.fc.weight"]  # conv1 (432) stays dense
    for step in range(5):  # step 0 ranks its masks before its reduction: packed from the first step
        twin = copy.deepcopy(model)
        loss_of(twin, step).backward()
        local = dict(zip(opt._parameters, (q.grad for _, q in sorted(twin.named_parameters()))))
        residual_before = {name: opt.pactrain_state.quantized.memory.residuals.get(name) for name in ternary_names}
        held = {name: opt.pactrain_state.quantized.scales.get(name) for name in ternary_names}
        assert (held[ternary_names[0]] is None) == (step == 0), "a scale is held from the second packed step on"
        opt.zero_grad()
        loss_of(model, step).backward()
        masks = opt.masks()
        assert ternary_names == sorted(name for name, p in opt._parameters.items()
                                       if opt.pactrain_state._compressors[p].lanes is not None)
        assert opt.stats()["values"] == packed_values
        for name in ternary_names:  # before synchronize(): with a held scale the codes are on their way
            send = opt._handles[opt._parameters[name]][0]
            assert (send.words_handle is not None) == (held[name] is not None), name
        opt.synchronize()
        stats = opt.stats()
        for name in ternary_names:
            p, compressor = opt._parameters[name], opt.pactrain_state._compressors[opt._parameters[name]]
            indices = compressor.surviving_indices
            values = local[name].reshape(-1)[indices]
            if residual_before[name] is not None:
                values = values + residual_before[name]
            step_max = hvd.allreduce((levels * STEP_OVER_MEAN * values.abs().mean()).reshape(1), op=hvd.Max,
                                     name=f"ref.scale.{name}")[0]
            scale = step_max if held[name] is None else held[name]
            assert torch.equal(opt.pactrain_state.quantized.scales[name], step_max), "the next scale is this step's MAX"
            dequantized = values - opt.pactrain_state.quantized.memory.pending[name]  # what this rank sent: q * step (no
            # step is taken here, so this residual stays pending and the next iteration starts from the same memory)
            codes = torch.round(dequantized / (scale / levels))
            codes_ok = (bool(torch.all(codes.abs() <= levels))
                        and torch.allclose(codes * (scale / levels), dequantized, atol=1e-6))
            assert all_true(codes_ok, f"codes.{name}.{step}"), f"{name}: a rank sent values that are not q * step"
            summed = hvd.allreduce(codes.to(torch.int32), op=hvd.Sum, name=f"ref.sum.{name}")
            expected = summed.float() * scale / levels / (size if op == hvd.Average else 1)
            got = p.grad.reshape(-1)[indices]
            close = torch.allclose(got, expected, rtol=1e-6, atol=0)
            pruned_zero = bool(torch.all(p.grad[~masks[name]] == 0))
            assert all_true(close and pruned_zero, f"grad.{name}.{step}"), f"{name} at step {step}"
            entry = stats["tensors"][name]
            kept = indices.numel()
            assert entry["kept"] == kept and entry["packed"]
            assert entry["sent_bytes"] == -(-kept // layout.lanes) * 4 + 4
            assert entry["bits_per_value"] == pytest.approx(8 * entry["sent_bytes"] / kept)
        for name in sorted(set(opt._parameters) - set(ternary_names)):  # dense, unpruned: fp32, exact average
            reference = local[name] * masks[name] if name in masks else local[name]
            reference = hvd.allreduce(reference, op=op, name=f"ref.dense.{name}.{step}")
            ok = torch.allclose(opt._parameters[name].grad, reference, rtol=1e-6, atol=1e-7)
            assert all_true(ok, f"dense.{name}.{step}"), f"dense tensor {name} at step {step}"
        assert stats["bits_per_value"] < 32 / layout.lanes + 0.5  # ternary: 32 / 13 digits for 2 ranks, plus a scale
        with opt.skip_synchronize():
            opt.step()
    assert_same_on_all_ranks(dict(model.named_parameters()))
    for name, mask in masks.items():
        assert torch.all(opt._parameters[name][~mask] == 0), f"pruned weights of {name} are not 0"


def test_ternary_training_reduces_loss():
    torch.manual_seed(0)
    teacher = torch.randn(64, 4)
    generator = torch.Generator().manual_seed(100 + hvd.rank())
    inputs = torch.randn(256, 64, generator=generator)
    targets = inputs @ teacher
    model = torch.nn.Linear(64, 4, bias=False)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = pt.DistributedOptimizer(sgd(model, lr=0.02), named_parameters=[("w", model.weight)], packed_values="ternary",
                                  sparsity=0.5, ranking="layer", begin_step=0, end_step=0, pack_min_numel=0)
    losses = []
    for _ in range(150):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert opt.stats()["tensors"]["w"]["packed"] and opt.stats()["values"] == "ternary"
    ok = losses[-1] < 0.5 * losses[1]
    assert all_true(ok, "loss"), f"loss went {losses[1]:.3f} -> {losses[-1]:.3f}"
    assert_same_on_all_ranks({"w": model.weight})


@pytest.mark.parametrize("kwargs, message", [
    (dict(packed_values="int8"), "packed_values must be one of"),
    (dict(packed_values="ternary", op=hvd.Max), "op must be hvd.Average or hvd.Sum"),
    (dict(packed_values="ternary", groups=2), "cannot be combined with groups"),
])
def test_bad_values_arguments_are_refused_before_anything(kwargs, message):
    model = make_model()
    with pytest.raises(ValueError, match=message):
        pt.DistributedOptimizer(sgd(model), named_parameters=named(model, "bad"), **kwargs)


def test_ternary_memory_round_trips_and_a_misfit_residual_changes_nothing():
    """Each rank's checkpoint carries its own error memory; a residual that does not fit its mask is refused."""
    model = make_model()
    opt = pt.DistributedOptimizer(sgd(model), named_parameters=named(model, "mem"), packed_values="ternary", sparsity=0.5, ranking="layer",
                                  begin_step=0, end_step=0, pack_min_numel=0)
    for step in range(3):
        opt.zero_grad()
        loss_of(model, step).backward()
        opt.step()
    saved = opt.state_dict()
    residuals = saved["pactrain"]["quantized"]["residuals"]
    assert saved["pactrain"]["quantized"]["rank"] == hvd.rank()
    assert set(residuals) == {name for name, p in opt._parameters.items() if opt.pactrain_state._compressors[p].lanes is not None}
    assert len(residuals) >= 2
    assert all(r.numel() == int(opt.masks()[name].sum()) for name, r in residuals.items())

    model_b = make_model()
    twin = pt.DistributedOptimizer(sgd(model_b), named_parameters=named(model_b, "mem"), packed_values="ternary", sparsity=0.5, ranking="layer",
                                   begin_step=0, end_step=0, pack_min_numel=0)
    first = sorted(residuals)[0]
    broken = {**saved, "pactrain": {**saved["pactrain"], "quantized": {
        **saved["pactrain"]["quantized"], "residuals": {**residuals, first: residuals[first][:-1]}}}}
    with pytest.raises(pt.CheckpointError, match=rf"quantization residual of '{first}' has \d+ values, its mask keeps"):
        twin.load_state_dict(broken)
    assert twin.step_count == 0 and twin.masks() == {}
    twin.load_state_dict(saved)
    assert twin.step_count == 3
    for name, residual in residuals.items():
        assert torch.equal(twin.pactrain_state.quantized.memory.residuals[name], residual), name
    earlier = {**saved, "pactrain": {("ternary" if key == "quantized" else key): value
                                     for key, value in saved["pactrain"].items()}}
    model_d = make_model()
    older = pt.DistributedOptimizer(sgd(model_d), named_parameters=named(model_d, "mem"), packed_values="ternary",
                                    sparsity=0.5, ranking="layer", begin_step=0, end_step=0, pack_min_numel=0)
    older.load_state_dict(earlier)  # the entries' earlier names
    for name, residual in residuals.items():
        assert torch.equal(older.pactrain_state.quantized.memory.residuals[name], residual), name
    other_rank = {**saved, "pactrain": {**saved["pactrain"], "quantized": {**saved["pactrain"]["quantized"], "rank": -1}}}
    model_c = make_model()
    fresh = pt.DistributedOptimizer(sgd(model_c), named_parameters=named(model_c, "mem"), packed_values="ternary",
                                    sparsity=0.5, ranking="layer", begin_step=0, end_step=0, pack_min_numel=0)
    fresh.load_state_dict(other_rank)  # another rank's memory is not this rank's: start from none
    assert fresh.step_count == 3 and fresh.pactrain_state.quantized.memory.residuals == {}


def test_an_overflow_on_one_rank_skips_the_step_everywhere_and_leaves_the_error_memory_finite():
    """torch AMP: GradScaler skips a step whose reduced gradients are not finite. The MAX of the scales
    carries one rank's inf to every rank, so every rank skips, and no residual becomes NaN."""
    model = make_model()
    opt = pt.DistributedOptimizer(sgd(model), named_parameters=named(model, "amp"), packed_values="ternary",
                                  sparsity=0.8, ranking="layer", begin_step=0, end_step=0, pack_min_numel=1000)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8)
    skipped = []
    for step in range(5):
        opt.zero_grad()
        loss = loss_of(model, step)
        if step == 3 and hvd.rank() == 1:  # a surviving coordinate of a ternary tensor overflows, here only
            survivor = tuple(opt.masks()["amp.fc.weight"].nonzero()[0].tolist())
            loss = loss + model.fc.weight[survivor] * float("inf")
        residuals = {n: r.clone() for n, r in opt.pactrain_state.quantized.memory.residuals.items()}
        skipped.append(amp_step(model, opt, scaler, loss))
        if step == 3:
            assert residuals and all(torch.equal(opt.pactrain_state.quantized.memory.residuals[n], r) for n, r in residuals.items())
    assert skipped == [False, False, False, True, False]
    assert all(torch.isfinite(r).all() for r in opt.pactrain_state.quantized.memory.residuals.values())
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert_same_on_all_ranks(dict(model.named_parameters()))


@pytest.mark.parametrize("broadcast", ["horovod", "broadcast_masks"])
def test_scales_loaded_on_one_rank_reach_every_rank_and_the_codes_leave_from_the_hook(broadcast):
    """Horovod's resume idiom (rank 0 loads, then broadcasts): every rank holds rank 0's scales, so every
    rank sends the next step's codes from the gradient hook, and the ranks stay identical. Horovod's
    broadcast carries them in the optimizer state's entries, so there SGD has momentum; ``broadcast_masks``
    carries them itself, so there plain SGD (which has no state to broadcast) shows that it does."""
    def inner(model):
        return sgd(model) if broadcast == "horovod" else torch.optim.SGD(model.parameters(), lr=0.05)

    model = make_model()
    opt = pt.DistributedOptimizer(inner(model), named_parameters=named(model, f"sc.{broadcast}"), packed_values="ternary",
                                  sparsity=0.5, ranking="layer", begin_step=0, end_step=0, pack_min_numel=0)
    for step in range(3):
        opt.zero_grad()
        loss_of(model, step).backward()
        opt.step()
    saved = {"model": copy.deepcopy(model.state_dict()), "optimizer": opt.state_dict()}
    held = saved["optimizer"]["pactrain"]["scales"]
    scales = torch.tensor([held.get(name, float("nan")) for name in opt._parameters])
    ternary = [name for name, p in opt._parameters.items() if opt.pactrain_state._compressors[p].lanes is not None]
    assert len(ternary) >= 2 and not scales.isnan().all()
    assert_same_on_all_ranks({"scales": scales.nan_to_num(-1)}, "held scales")  # NaN: no scale held

    resumed_model = make_model(seed=hvd.rank() + 1)  # other weights on every rank until the broadcast
    resumed = pt.DistributedOptimizer(inner(resumed_model), named_parameters=named(resumed_model, f"sc.{broadcast}"),
                                      packed_values="ternary", sparsity=0.5, ranking="layer", begin_step=0, end_step=0, pack_min_numel=0)
    if hvd.rank() == 0:
        resumed_model.load_state_dict(saved["model"])
        resumed.load_state_dict(saved["optimizer"])
    if broadcast == "horovod":
        hvd.broadcast_optimizer_state(resumed, root_rank=0)
    else:
        pt.broadcast_masks(resumed, root_rank=0)
    hvd.broadcast_parameters(resumed_model.state_dict(), root_rank=0)
    resumed.zero_grad()
    loss_of(resumed_model, 3).backward()
    for name in ternary:  # every rank asserts the same verdict (a rank that failed alone would leave the others waiting)
        send, held = resumed._handles[resumed._parameters[name]][0], resumed.pactrain_state.quantized.scales.get(name)
        ok = send.words_handle is not None and torch.equal(held, scales[list(resumed._parameters).index(name)])
        assert all_true(ok, f"held.{broadcast}.{name}"), f"{name}: rank 0's scale is not held on every rank"
    resumed.step()
    assert_same_on_all_ranks(dict(resumed_model.named_parameters()))
