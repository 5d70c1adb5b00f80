"""pt.ddp.pactrain_hook on torch DistributedDataParallel: 2 processes, Gloo, under a timeout.

Every scenario runs on both ranks (``torch.multiprocessing``) and asserts values there: equality
with DDP's own all-reduce, ranks bitwise identical, zeros where pruned, survivors equal to a dense
reference, the bytes handed to ``all_reduce``, an exact resume, and one clear error for masks that differ.
"""

import copy
import functools
import os
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from rescale_expectations import assert_rescaled_once
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_wrapper
from torch.nn.parallel import DistributedDataParallel as DDP

import pactrain_hvd.torch as pt
from benchmarks.runner.jobs import free_port
from pactrain_hvd.core import MaskMismatchError, NonFiniteWeightsError, SettingsMismatchError

WORLD = 2
TIMEOUT_S = 240


class Net(torch.nn.Module):
    def __init__(self, unused_branch: bool = False) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.fc1 = torch.nn.Linear(16 * 8 * 8, 64)
        self.fc2 = torch.nn.Linear(64, 10)
        self.unused = torch.nn.Linear(10, 10) if unused_branch else None

    def forward(self, x):
        x = torch.nn.functional.max_pool2d(torch.relu(self.conv(x)), 2)
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


def batch(step: int, channels_last: bool = False):
    generator = torch.Generator().manual_seed(1000 * dist.get_rank() + step)
    inputs = torch.randn(8, 3, 16, 16, generator=generator)
    layout = torch.channels_last if channels_last else torch.contiguous_format
    return inputs.to(memory_format=layout), torch.randint(0, 10, (8,), generator=generator)


def make(hooked: bool = True, unused: bool = False, sparsity: float = 0.9, verify_every: int = 100,
         channels_last: bool = False, **ddp_kwargs):
    """A DDP model in several buckets, SGD + momentum + weight decay, and (``hooked``) PacTrain's hook.
    ``channels_last``: the conv weight's gradient lies in its bucket in NHWC order (DDP follows the strides)."""
    torch.manual_seed(0)
    net = Net(unused).to(memory_format=torch.channels_last) if channels_last else Net(unused)
    model = DDP(net, bucket_cap_mb=0.02, find_unused_parameters=unused, **ddp_kwargs)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3)
    state = None
    if hooked:
        state = pt.ddp.PacTrainHookState(model, opt, sparsity=sparsity, ranking="layer", begin_step=0, end_step=0, pack_min_numel=0,
                                         verify_every=verify_every)
        model.register_comm_hook(state, pt.ddp.pactrain_hook)
    return model, opt, state


def step(model, opt, index, channels_last: bool = False):
    inputs, labels = batch(index, channels_last)
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(inputs), labels).backward()
    opt.step()


def same_on_all_ranks(tensors: dict) -> None:
    for name, tensor in tensors.items():
        gathered = [torch.empty_like(tensor) for _ in range(WORLD)]
        dist.all_gather(gathered, tensor.detach().contiguous())
        assert all(torch.equal(gathered[0], t) for t in gathered), f"{name} differs across ranks"


def scenario_sparsity_zero_is_ddps_allreduce():
    ours, ours_opt, ours_state = make(sparsity=0.0)
    theirs, theirs_opt, _ = make(hooked=False)
    for index in range(4):
        step(ours, ours_opt, index)
        step(theirs, theirs_opt, index)
        for (name, a), b in zip(ours.module.named_parameters(), theirs.module.parameters()):
            assert torch.equal(a, b), f"{name} differs from DDP's default all-reduce at step {index}"
    stats = ours_state.stats()
    assert stats["sent_bytes"] == stats["dense_bytes"] == 4 * sum(p.numel() for p in ours.parameters())


def scenario_pruned(gradient_as_bucket_view: bool, static_graph: bool, unused: bool, channels_last: bool = False):
    model, opt, state = make(unused=unused, gradient_as_bucket_view=gradient_as_bucket_view, static_graph=static_graph,
                             channels_last=channels_last)
    if channels_last:
        assert model.module.conv.weight.is_contiguous(memory_format=torch.channels_last)
    for index in range(5):
        twin = copy.deepcopy(model.module)
        inputs, labels = batch(index, channels_last)
        torch.nn.functional.cross_entropy(twin(inputs), labels).backward()
        step(model, opt, index, channels_last)
        masks = state.masks()  # step 0's: ranked before its first bucket was sent
        for (name, p), q in zip(model.module.named_parameters(), twin.parameters()):
            if q.grad is None:
                assert unused and name.startswith("unused"), name
                continue
            reference = ((q.grad * masks[name] if name in masks else q.grad) / WORLD).contiguous()
            dist.all_reduce(reference)
            assert torch.equal(p.grad, reference), f"gradient of {name} at step {index}"
    masks = state.masks()
    assert masks and state.step_count == 5
    for name, mask in masks.items():
        weight = dict(model.module.named_parameters())[name]
        assert int(mask.sum()) == round(mask.numel() * 0.1), name
        assert torch.equal(weight[~mask], torch.zeros_like(weight[~mask])), f"{name} pruned weights are not 0"
    same_on_all_ranks(dict(model.module.named_parameters()))
    stats = state.stats()
    kept = sum(int(mask.sum()) for mask in masks.values())
    unpruned = sum(p.numel() for name, p in model.module.named_parameters() if name not in masks)
    assert stats["sent_bytes"] == 4 * (kept + unpruned), "every bucket holds pruned weights: packed"
    assert stats["dense_bytes"] == 4 * sum(p.numel() for p in model.module.parameters())


def scenario_sparse_from_the_first_step():
    """Step 0's buckets already carry only survivors, from masks every rank proved equal at step 0."""
    torch.manual_seed(dist.get_rank())  # DDP broadcasts rank 0's weights at construction
    model = DDP(Net(), bucket_cap_mb=0.02)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3)
    state = pt.ddp.PacTrainHookState(model, opt, schedule=pt.ConstantSparsity(0.9), ranking="layer", pack_min_numel=0)
    model.register_comm_hook(state, pt.ddp.pactrain_hook)
    verified, verify = [], state.pruner.verify
    state.pruner.verify = lambda at, *args, **kwargs: (verified.append(at), verify(at, *args, **kwargs))[1]
    for index in range(3):
        step(model, opt, index)
        masks = state.masks()
        stats = state.stats()
        assert stats["step"] == index and stats["tensors"], (index, stats["step"], list(stats["tensors"]))
        assert all(bucket["packed"] for bucket in stats["tensors"].values()), f"a dense bucket at step {index}"
        kept = sum(int(mask.sum()) for mask in masks.values())
        unpruned = sum(p.numel() for name, p in model.module.named_parameters() if name not in masks)
        assert stats["sent_bytes"] == 4 * (kept + unpruned), index
    assert verified == [0]
    assert set(masks) == {"conv.weight", "fc1.weight", "fc2.weight"}
    same_on_all_ranks({name: mask.to(torch.uint8) for name, mask in masks.items()})
    for name, mask in masks.items():
        assert int(mask.sum()) == round(mask.numel() * 0.1), name
        assert torch.all(dict(model.module.named_parameters())[name][~mask] == 0), name
    same_on_all_ranks(dict(model.module.named_parameters()))


def scenario_rescale_survivors():
    """Step 0's survivors take their tensor's norm, once (learning rate 0: nothing else moves the weights)."""
    torch.manual_seed(dist.get_rank())
    model = DDP(Net(), bucket_cap_mb=0.02)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    state = pt.ddp.PacTrainHookState(model, opt, schedule=pt.ConstantSparsity(0.9), ranking="layer", pack_min_numel=0,
                                     rescale_survivors=True)
    model.register_comm_hook(state, pt.ddp.pactrain_hook)
    broadcast = {name: p.detach().numpy().copy() for name, p in model.module.named_parameters()}
    step(model, opt, 0)
    after_step_0 = {name: p.detach().numpy().copy() for name, p in model.module.named_parameters()}
    assert_rescaled_once(broadcast, after_step_0, {n: m.numpy() for n, m in state.masks().items()}, rescale=True)
    step(model, opt, 1)
    for name, weight in model.module.named_parameters():
        assert (weight.detach().numpy() == after_step_0[name]).all(), name
    same_on_all_ranks(dict(model.module.named_parameters()))


def scenario_masks_that_differ_are_one_error_everywhere():
    model, opt, state = make(verify_every=2)
    step(model, opt, 0)
    step(model, opt, 1)  # step 2 is a check every rank knows about
    saved = state.state_dict()
    if dist.get_rank() == 1:
        saved = dict(saved, masks={name: mask.flip(-1) for name, mask in saved["masks"].items()})
    state.load_state_dict(saved)  # local: rank 1 now disagrees; caught at that check, not a hang
    weights = {name: p.detach().clone() for name, p in model.module.named_parameters()}
    with pytest.raises(MaskMismatchError, match=r"ranks \[1\] differ from rank 0"):
        step(model, opt, 2)
    for name, p in model.module.named_parameters():
        assert torch.equal(p, weights[name]), f"{name} was updated with masks that differ"


def scenario_settings_that_differ_are_one_error_everywhere():
    torch.manual_seed(0)
    model = DDP(Net(), bucket_cap_mb=0.02)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    state = pt.ddp.PacTrainHookState(model, opt, sparsity=0.9, total_steps=(110, 109)[dist.get_rank()], frequency=5)
    model.register_comm_hook(state, pt.ddp.pactrain_hook)
    with pytest.raises(SettingsMismatchError, match=r"total_steps \(rank 0: 110, rank 1: 109\).*"
                                                    r"end_step \(rank 0: 66, rank 1: 65\).*DistributedSampler"):
        step(model, opt, 0)


def scenario_nan_at_a_mask_update_changes_no_mask():
    torch.manual_seed(0)
    model = DDP(Net(), bucket_cap_mb=0.02)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    state = pt.ddp.PacTrainHookState(model, opt, sparsity=0.9, ranking="layer", begin_step=0, end_step=2, frequency=2,
                                     pack_min_numel=0)
    model.register_comm_hook(state, pt.ddp.pactrain_hook)
    step(model, opt, 0)
    masks = state.masks()
    with torch.no_grad():
        if dist.get_rank() == 1:
            model.module.fc1.weight[0, 0] = float("inf")
    step(model, opt, 1)  # the all-reduce spreads it: every rank's weights are non-finite now
    with pytest.raises(NonFiniteWeightsError, match=r"'fc1.weight'.*No mask was changed"):
        step(model, opt, 2)
    assert all(torch.equal(state.masks()[name], mask) for name, mask in masks.items())


def assert_resume_is_exact(make_run, steps: int = 6) -> None:
    """``steps`` steps without a stop against half of them, a checkpoint, a fresh model, DDP, optimizer and
    state loading it on every rank, and the other half: bitwise the same weights and schedule position."""
    reference, reference_opt, reference_state = make_run()
    for index in range(steps):
        step(reference, reference_opt, index)
    model, opt, state = make_run()
    for index in range(steps // 2):
        step(model, opt, index)
    saved = copy.deepcopy({"model": model.module.state_dict(), "opt": opt.state_dict(), "pactrain": state.state_dict()})
    model, opt, state = make_run()
    model.module.load_state_dict(saved["model"])
    opt.load_state_dict(saved["opt"])
    state.load_state_dict(saved["pactrain"])
    for index in range(steps // 2, steps):
        step(model, opt, index)
    assert state.step_count == reference_state.step_count == steps
    for (name, a), b in zip(model.module.named_parameters(), reference.module.parameters()):
        assert torch.equal(a, b), f"{name} differs from the uninterrupted run"


def scenario_exact_resume():
    assert_resume_is_exact(make)


def fp16_run(hook, rtol=2e-3, **state_kwargs):
    """Two SGD steps under ``hook``; each reduced gradient checked against the fp32 reference's, masked and
    averaged, to ``rtol`` (fp16 precision by default) of the values and of the tensor's largest value (where
    the ranks' values cancel, the sum keeps the rounding of the values, not of the sum). The hook state, for
    its bytes."""
    torch.manual_seed(0)
    model = DDP(Net(), bucket_cap_mb=0.02)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    state = pt.ddp.PacTrainHookState(model, opt, sparsity=0.9, ranking="layer", begin_step=0, end_step=0, **state_kwargs)
    model.register_comm_hook(state, hook)
    step(model, opt, 0)
    twin = copy.deepcopy(model.module)
    inputs, labels = batch(1)
    torch.nn.functional.cross_entropy(twin(inputs), labels).backward()
    step(model, opt, 1)
    masks = state.masks()
    for (name, p), q in zip(model.module.named_parameters(), twin.parameters()):
        assert p.grad.dtype == torch.float32
        reference = (q.grad * masks[name] if name in masks else q.grad) / WORLD
        dist.all_reduce(reference)
        atol = max(1e-5, rtol * float(reference.abs().max()))
        torch.testing.assert_close(p.grad, reference, rtol=rtol, atol=atol, msg=f"gradient of {name}")
    same_on_all_ranks(dict(model.module.named_parameters()))
    return state, model


def scenario_half_precision_values(packed_values: str, rtol: float):
    """``packed_values="fp16"`` or ``"bf16"``: survivors travel in 16 bits (half the bytes), averaged like the fp32
    reference to that precision."""
    state, model = fp16_run(pt.ddp.pactrain_hook, rtol, pack_min_numel=0, packed_values=packed_values)
    kept = sum(int(mask.sum()) for mask in state.masks().values())
    unpruned = sum(p.numel() for name, p in model.module.named_parameters() if name not in state.masks())
    assert state.stats()["sent_bytes"] == 2 * (kept + unpruned)


def scenario_fp16_wrapper_sends_dense_buckets_in_fp16():
    """Under torch's ``fp16_compress_wrapper`` (the fp16 of DDP's dense path) a dense-plan bucket travels as fp16
    too, with its pruned coordinates zeroed, and packed ``"inherit"`` values (the default) keep the bucket's fp16:
    2 bytes for every value sent, against the fp32 gradients' 4."""
    state, _ = fp16_run(fp16_compress_wrapper(pt.ddp.pactrain_hook),
                        pack_min_numel=20000)  # fc1's bucket packs, the smaller ones stay dense
    buckets = list(state.stats()["tensors"].values())
    assert {b["packed"] for b in buckets} == {True, False}
    assert all(b["sent_bytes"] == 2 * (b["kept"] if b["packed"] else b["numel"]) for b in buckets)
    assert all(b["dense_bytes"] == 4 * b["numel"] for b in buckets)


def scenario_quantized_values_and_their_exact_resume(packed_values, levels, lanes_per_word):
    """``packed_values="ternary"`` or ``"int3"``: each survivor's reduced gradient is the mean of the ranks' codes
    times the shared step; int32 lane words plus one scale per bucket on the wire; error memory and noise (drawn for
    the step) resume exactly."""
    def make_quantized():
        torch.manual_seed(0)
        model = DDP(Net(), bucket_cap_mb=0.02)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        state = pt.ddp.PacTrainHookState(model, opt, sparsity=0.9, ranking="layer", begin_step=0, end_step=0, pack_min_numel=0,
                                         packed_values=packed_values)
        model.register_comm_hook(state, pt.ddp.pactrain_hook)
        return model, opt, state

    reference, reference_opt, reference_state = make_quantized()
    for index in range(6):
        step(reference, reference_opt, index)
    masks, lanes = reference_state.masks(), reference_state.lanes
    assert lanes is not None and lanes.lanes == lanes_per_word  # 2 ranks: ternary 13 base-5 digits, int3 8 base-13
    buckets = reference_state.stats()["tensors"].values()
    assert all(b["packed"] for b in buckets)
    scales = len(list(reference.module.parameters()))  # one fp32 scale per parameter
    assert sum(b["sent_bytes"] for b in buckets) == 4 * sum(lanes.words(b["kept"]) for b in buckets) + 4 * scales
    grads = {name: p.grad for name, p in reference.module.named_parameters() if name in masks}
    for name, grad in grads.items():  # mean of 2 ranks' codes in [-levels, levels] times a step: 2 levels + 1 magnitudes
        magnitudes = torch.unique(grad[masks[name]].abs())
        assert 1 < len(magnitudes) <= 2 * levels + 1, f"{name}: {len(magnitudes)} magnitudes, not codes times one step"
    assert all(torch.isfinite(r).all() for r in reference_state.memory.residuals.values())
    same_on_all_ranks(dict(reference.module.named_parameters()))

    assert_resume_is_exact(make_quantized)


def scenario_deterministic_mode_gives_the_same_weights():
    """Under torch.use_deterministic_algorithms(True) the hook runs, and its weights are the default mode's."""
    weights = []
    for enabled in (False, True):
        model, opt, _ = make()
        torch.use_deterministic_algorithms(enabled)
        try:
            for index in range(4):
                step(model, opt, index)
        finally:
            torch.use_deterministic_algorithms(False)
        weights.append({name: p.detach().clone() for name, p in model.module.named_parameters()})
    for name, weight in weights[0].items():
        assert torch.equal(weight, weights[1][name]), f"{name} differs under deterministic algorithms"
    same_on_all_ranks(weights[1])


def _forward_backward(model, opt, inputs, labels):
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(inputs), labels)
    loss.backward()
    return loss


def scenario_a_closure_takes_a_mask_update_before_the_steps_forward():
    """Under ``optimizer.step(closure)`` (Lightning's loop) the state's pre-step hook runs before the closure: a mask
    update due at a step is ranked from the same weights as in a plain loop, and takes effect before that step's
    buckets are sent (a plain loop sends them first). Steps before it are a plain loop's; every rank agrees."""
    runs = {}
    for closure in (False, True):
        torch.manual_seed(0)
        model = DDP(Net(), bucket_cap_mb=0.02)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        state = pt.ddp.PacTrainHookState(model, opt, sparsity=0.9, ranking="layer", begin_step=2, end_step=2,
                                         pack_min_numel=0)
        model.register_comm_hook(state, pt.ddp.pactrain_hook)
        weights, sent = [], []
        for index in range(4):
            forward_backward = functools.partial(_forward_backward, model, opt, *batch(index))
            if closure:
                opt.step(forward_backward)
            else:
                forward_backward()
                opt.step()
            weights.append({name: p.detach().clone() for name, p in model.module.named_parameters()})
            sent.append(state.stats()["sent_bytes"])
        runs[closure] = weights, sent, state.masks()
        same_on_all_ranks(weights[-1])
        for name, mask in state.masks().items():
            assert not weights[-1][name][~mask].any(), f"{name}: pruned weights are not 0"
    (plain, plain_sent, plain_masks), (closed, closed_sent, closed_masks) = runs[False], runs[True]
    for index in (0, 1):
        assert all(torch.equal(plain[index][n], closed[index][n]) for n in plain[index]), f"step {index} differs"
    assert plain_masks.keys() == closed_masks.keys() and all(
        torch.equal(plain_masks[n], closed_masks[n]) for n in plain_masks), "the masks were ranked from other weights"
    dense = 4 * sum(t.numel() for t in plain[0].values())
    assert plain_sent[:3] == closed_sent[:2] + [dense] == [dense] * 3, "a plain loop sends step 2's buckets dense"
    assert closed_sent[2] == plain_sent[3] == closed_sent[3] < dense, "the closure's step 2 is packed"
    assert any(not torch.equal(plain[2][n], closed[2][n]) for n in plain[2])


def scenario_an_optimizer_without_the_models_parameters_is_refused():
    model = DDP(Net(), bucket_cap_mb=0.02)
    other = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    try:
        pt.ddp.PacTrainHookState(model, other, sparsity=0.9)
    except ValueError as error:
        assert "optimizer holds none of the model's parameters" in str(error), str(error)
    else:
        raise AssertionError("a hook state over an optimizer of other parameters was accepted")


def scenario_a_shared_checkpoint_of_quantized_values_says_the_resume_is_inexact():
    """One checkpoint saved by rank 0 (as Lightning and Accelerate save): rank 1 resumes without its own error
    memory and is told so; rank 0 loads its own, quietly."""
    import warnings

    from pactrain_hvd.core import InexactResumeWarning

    torch.manual_seed(0)
    model = DDP(Net(), bucket_cap_mb=0.02)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    state = pt.ddp.PacTrainHookState(model, opt, sparsity=0.9, ranking="layer", begin_step=0, end_step=0,
                                     pack_min_numel=0, packed_values="int3")
    model.register_comm_hook(state, pt.ddp.pactrain_hook)
    for index in range(3):
        step(model, opt, index)
    shared = [state.state_dict() if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(shared, src=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        state.load_state_dict(shared[0])
    inexact = [w for w in caught if issubclass(w.category, InexactResumeWarning)]
    assert len(inexact) == (dist.get_rank() != 0), [str(w.message) for w in caught]


SCENARIOS = {
    "ternary_values": (scenario_quantized_values_and_their_exact_resume, ("ternary", 1, 13)),
    "int3_values": (scenario_quantized_values_and_their_exact_resume, ("int3", 3, 8)),
    "fp16_values": (scenario_half_precision_values, ("fp16", 2e-3)),
    "bf16_values": (scenario_half_precision_values, ("bf16", 1.6e-2)),
    "fp16_wrapper": (scenario_fp16_wrapper_sends_dense_buckets_in_fp16, ()),
    "sparsity_zero": (scenario_sparsity_zero_is_ddps_allreduce, ()),
    "pruned_bucket_view": (scenario_pruned, (True, False, False)),
    "pruned_copy_static_graph": (scenario_pruned, (False, True, False)),
    "pruned_unused_parameters": (scenario_pruned, (False, False, True)),
    "pruned_channels_last_bucket_view": (scenario_pruned, (True, False, False, True)),
    "pruned_channels_last_copy": (scenario_pruned, (False, False, False, True)),
    "mismatch": (scenario_masks_that_differ_are_one_error_everywhere, ()),
    "settings_mismatch": (scenario_settings_that_differ_are_one_error_everywhere, ()),
    "nan_at_mask_update": (scenario_nan_at_a_mask_update_changes_no_mask, ()),
    "sparse_from_the_first_step": (scenario_sparse_from_the_first_step, ()),
    "rescale_survivors": (scenario_rescale_survivors, ()),
    "resume": (scenario_exact_resume, ()),
    "deterministic": (scenario_deterministic_mode_gives_the_same_weights, ()),
    "closure": (scenario_a_closure_takes_a_mask_update_before_the_steps_forward, ()),
    "foreign_optimizer": (scenario_an_optimizer_without_the_models_parameters_is_refused, ()),
    "shared_checkpoint": (scenario_a_shared_checkpoint_of_quantized_values_says_the_resume_is_inexact, ()),
}


def _worker(rank: int, name: str, port: int, results) -> None:
    """Run one scenario; report ``(rank, None)`` or ``(rank, traceback)``, then leave without the
    interpreter's teardown (Gloo's threads sometimes abort there, after everything was checked)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    outcome = None
    try:
        function, args = SCENARIOS[name]
        function(*args)
        dist.barrier()  # no rank tears the group down while another still talks to it
    except BaseException:  # noqa: BLE001 - reported to the parent, which fails the test
        outcome = traceback.format_exc()
    results.put((rank, outcome))
    results.close()
    results.join_thread()
    os._exit(0)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_ddp_hook(name):
    context = mp.get_context("spawn")
    results = context.Queue()
    port = free_port()
    processes = [context.Process(target=_worker, args=(rank, name, port, results)) for rank in range(WORLD)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(TIMEOUT_S)
    hung = [p.pid for p in processes if p.is_alive()]
    for process in processes:
        if process.is_alive():
            process.kill()
    assert not hung, f"scenario {name!r} hung (no result after {TIMEOUT_S} s): a collective some ranks never reached"
    reported = {}
    while not results.empty():
        rank, outcome = results.get()
        reported[rank] = outcome
    failures = {rank: trace for rank, trace in reported.items() if trace is not None}
    assert not failures, "\n".join(f"rank {rank}:\n{trace}" for rank, trace in failures.items())
    assert sorted(reported) == list(range(WORLD)), f"scenario {name!r}: ranks {sorted(reported)} reported, exit codes " \
                                                   f"{[p.exitcode for p in processes]}"
