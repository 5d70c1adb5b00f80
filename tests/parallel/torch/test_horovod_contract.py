"""Horovod's contract, kept: what a Horovod user writes works unchanged with pt.DistributedOptimizer.

Each test follows one idiom of Horovod's examples or of its own optimizer tests (test/parallel/test_torch.py)
and checks values: against an uninterrupted run, against hvd.DistributedOptimizer, or across ranks.
"""

import io
import sys
import warnings

import horovod.torch as hvd
import pytest
import torch
from conftest import amp_step, assert_same_on_all_ranks, loss_of, make_model

import pactrain_hvd.torch as pt

OPTIMIZERS = {
    "sgd-momentum-wd": lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=1e-3),
    "sgd-stateless": lambda params: torch.optim.SGD(params, lr=0.05),
    "adamw": lambda params: torch.optim.AdamW(params, lr=1e-3, weight_decay=0.05),
}


def train(model, opt, steps, start=0):
    for step in range(start, start + steps):
        opt.zero_grad()
        loss_of(model, step).backward()
        opt.step()


def pactrain(model, make_optimizer, sparsity, **kwargs):
    return pt.DistributedOptimizer(make_optimizer(model.parameters()), named_parameters=model.named_parameters(),
                                   sparsity=sparsity, ranking="layer", begin_step=0, end_step=6, frequency=2, pack_min_numel=0, **kwargs)


def horovod_start(model, opt):
    """Horovod's examples (pytorch_imagenet_resnet50.py), verbatim."""
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)


def state_tensors(model, opt):
    return {f"{n}.{k}": v for n, p in model.named_parameters() for k, v in opt.state[p].items() if torch.is_tensor(v)}


@pytest.mark.parametrize("sparsity", [0.0, 0.8])
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_horovods_resume_idiom_is_bitwise_an_uninterrupted_run(optimizer, sparsity):
    """Rank 0 loads the checkpoint, then hvd.broadcast_parameters + hvd.broadcast_optimizer_state: no hang,
    and masks, schedule position, weights and optimizer state are those of a run that never stopped."""
    make_optimizer = OPTIMIZERS[optimizer]
    reference_model = make_model(seed=0)
    reference = pactrain(reference_model, make_optimizer, sparsity)
    horovod_start(reference_model, reference)
    train(reference_model, reference, 8)

    model = make_model(seed=0)
    opt = pactrain(model, make_optimizer, sparsity)
    horovod_start(model, opt)
    train(model, opt, 3)  # stops mid-schedule: masks changed at steps 0 and 2, next at 4
    checkpoint = io.BytesIO()
    if hvd.rank() == 0:
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, checkpoint)

    resumed_model = make_model(seed=100 + hvd.rank())  # other ranks start from other weights
    resumed = pactrain(resumed_model, make_optimizer, sparsity)
    if hvd.rank() == 0:
        saved = torch.load(io.BytesIO(checkpoint.getvalue()), weights_only=False)
        resumed_model.load_state_dict(saved["model"])
        resumed.load_state_dict(saved["optimizer"])
    horovod_start(resumed_model, resumed)
    train(resumed_model, resumed, 5, start=3)

    if sparsity:  # at sparsity 0 the state dict is Horovod's, exactly: nothing of ours travels or needs to
        assert resumed.step_count == reference.step_count == 8
    assert resumed.masks().keys() == reference.masks().keys()
    for name, mask in reference.masks().items():
        assert torch.equal(resumed.masks()[name], mask), f"mask of {name}"
    for (name, p), q in zip(resumed_model.named_parameters(), reference_model.parameters()):
        assert torch.equal(p, q), f"{name} differs from the uninterrupted run"
    expected = state_tensors(reference_model, reference)
    for key, value in state_tensors(resumed_model, resumed).items():
        assert torch.equal(value, expected[key]), f"optimizer state {key}"
    assert_same_on_all_ranks(dict(resumed_model.named_parameters()))


def test_broadcast_optimizer_state_with_horovods_test_optimizers_at_sparsity_zero():
    """Horovod's test_broadcast_state: fresh optimizers of many kinds, state broadcast, equal everywhere."""
    for make_optimizer in (lambda p: torch.optim.Adam(p, lr=1e-3), lambda p: torch.optim.RMSprop(p, lr=1e-3),
                           lambda p: torch.optim.Adagrad(p, lr=1e-2), lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)):
        model = make_model(seed=hvd.rank())
        opt = pt.DistributedOptimizer(make_optimizer(model.parameters()), named_parameters=model.named_parameters(),
                                      sparsity=0.0)
        horovod_start(model, opt)
        train(model, opt, 2)
        assert_same_on_all_ranks(dict(model.named_parameters()))
        assert_same_on_all_ranks(state_tensors(model, opt), "state")
        assert all(not key.startswith("pactrain") for entry in opt.state_dict()["state"].values() for key in entry)
    stateless_model = make_model()
    stateless = pt.DistributedOptimizer(torch.optim.SGD(stateless_model.parameters(), lr=0.1),
                                        named_parameters=stateless_model.named_parameters(), sparsity=0.0)
    horovod_start(stateless_model, stateless)
    assert len(stateless.state_dict()["state"]) == 0, "SGD without momentum keeps no state, as with Horovod"


def test_checkpoint_loaded_on_one_rank_without_broadcast_is_one_clear_error_everywhere():
    model = make_model()
    opt = pactrain(model, OPTIMIZERS["sgd-momentum-wd"], 0.8)
    horovod_start(model, opt)
    train(model, opt, 3)
    saved = opt.state_dict()
    fresh_model = make_model()
    fresh = pactrain(fresh_model, OPTIMIZERS["sgd-momentum-wd"], 0.8)
    if hvd.rank() == 0:
        fresh.load_state_dict(saved)  # and forgets to broadcast it: a local call, so no rank hangs
    hvd.broadcast_parameters(fresh_model.state_dict(), root_rank=0)
    with pytest.raises(pt.MaskMismatchError, match=r"schedule position differs \(rank 0: 3, rank 1: 0\).*"
                                                   r"hvd.broadcast_optimizer_state"):
        train(fresh_model, fresh, 1, start=3)


def test_masks_set_on_one_rank_mid_run_are_caught_at_the_next_check_on_every_rank():
    model = make_model()
    opt = pactrain(model, OPTIMIZERS["sgd-stateless"], 0.5, verify_every=4)
    horovod_start(model, opt)
    train(model, opt, 4)
    if hvd.rank() == 1:
        opt.set_masks({name: mask.flip(-1) for name, mask in opt.masks().items()})
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    with pytest.raises(pt.MaskMismatchError, match=r"pruning masks differ across ranks: 'conv1.weight': ranks \[1\] "
                                                   r"differ from rank 0"):
        train(model, opt, 1, start=4)  # step 4 is a check every rank knows about: nothing is sent before it
    for name, p in model.named_parameters():
        assert torch.equal(p, weights[name]), f"{name} was updated with disagreeing masks"


def test_ranks_with_different_weights_are_told_to_broadcast_parameters():
    """Horovod's tests skip broadcast_parameters; at a pruning step that is named as the cause."""
    model = make_model(seed=hvd.rank())
    opt = pactrain(model, OPTIMIZERS["sgd-stateless"], 0.5)
    with pytest.raises(pt.MaskMismatchError, match=r"Weights differ too.*hvd.broadcast_parameters"):
        train(model, opt, 3)  # the schedule first prunes at step 2


def test_ranks_pruning_different_tensors_fail_together():
    model = make_model()
    prunable = ["conv1.weight", "fc.weight"] if hvd.rank() == 0 else ["fc.weight"]
    opt = pactrain(model, OPTIMIZERS["sgd-stateless"], 0.5, prunable=prunable)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    with pytest.raises(pt.MaskMismatchError, match="ranks prune different sets of tensors"):
        train(model, opt, 1)


@pytest.mark.parametrize("sparsity", [0.0, 0.5])
def test_ranks_outside_the_process_set_do_nothing_collective(sparsity):
    """Horovod's test_optimizer_process_sets: rank 1 is not in the set and steps alone, as with Horovod."""
    process_set = hvd.add_process_set([0])
    try:
        ours_model, theirs_model = make_model(), make_model()
        ours = pt.DistributedOptimizer(OPTIMIZERS["sgd-momentum-wd"](ours_model.parameters()),
                                       named_parameters=ours_model.named_parameters(), process_set=process_set,
                                       sparsity=sparsity, ranking="layer", begin_step=2, end_step=2, pack_min_numel=0)
        theirs = hvd.DistributedOptimizer(OPTIMIZERS["sgd-momentum-wd"](theirs_model.parameters()),
                                          named_parameters=theirs_model.named_parameters(), process_set=process_set)
        for step in range(4):
            train(ours_model, ours, 1, step)
            train(theirs_model, theirs, 1, step)
            if step < 2 or sparsity == 0:  # before pruning: exactly Horovod's numbers, on members and others
                for (name, a), b in zip(ours_model.named_parameters(), theirs_model.parameters()):
                    assert torch.equal(a, b), f"{name} differs from hvd.DistributedOptimizer at step {step}"
        for name, mask in ours.masks().items():
            assert torch.all(dict(ours_model.named_parameters())[name][~mask] == 0), name
        assert ours.step_count == 4
    finally:
        hvd.remove_process_set(process_set)


def test_num_groups_is_horovods_seventh_positional_argument():
    ours_model, theirs_model = make_model(), make_model()
    with pytest.warns(DeprecationWarning, match="num_groups"):
        ours = pt.DistributedOptimizer(OPTIMIZERS["sgd-momentum-wd"](ours_model.parameters()),
                                       ours_model.named_parameters(), hvd.Compression.none, 1, hvd.Average, 1.0, 2,
                                       sparsity=0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        theirs = hvd.DistributedOptimizer(OPTIMIZERS["sgd-momentum-wd"](theirs_model.parameters()),
                                          theirs_model.named_parameters(), hvd.Compression.none, 1, hvd.Average, 1.0, 2)
    assert len(set(ours._groups.values())) == 2
    for step in range(3):
        train(ours_model, ours, 1, step)
        train(theirs_model, theirs, 1, step)
    for (name, a), b in zip(ours_model.named_parameters(), theirs_model.parameters()):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("sparsity", [0.0, 0.5])
def test_fine_tuning_names_more_parameters_than_the_optimizer_holds(sparsity):
    """SGD(model.fc.parameters()) with model.named_parameters(): Horovod ignores the other names."""
    model = make_model()
    opt = pt.DistributedOptimizer(torch.optim.SGD(model.fc.parameters(), lr=0.1), named_parameters=model.named_parameters(),
                                  sparsity=sparsity, ranking="layer", begin_step=0, end_step=0, pack_min_numel=0)
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not n.startswith("fc.")}
    train(model, opt, 2)
    assert sorted(opt._parameters) == ["fc.bias", "fc.weight"]
    for name, p in model.named_parameters():
        if name in frozen:
            assert torch.equal(p, frozen[name]), f"{name} is not optimized and must not move"
    assert_same_on_all_ranks(dict(model.named_parameters()))
    assert sorted(opt.masks()) == (["fc.weight"] if sparsity else [])


def test_sparse_as_dense_gives_sparse_adam_sparse_gradients_like_horovod():
    """Horovod's test_sparse_embeddings: SparseAdam needs the reduced gradient back in sparse form."""
    torch.manual_seed(0)
    ours, theirs = torch.nn.Embedding(50, 4, sparse=True), torch.nn.Embedding(50, 4, sparse=True)
    theirs.load_state_dict(ours.state_dict())
    opt = pt.DistributedOptimizer(torch.optim.SparseAdam(ours.parameters(), lr=0.1),
                                  named_parameters=ours.named_parameters(), sparse_as_dense=True, sparsity=0.0)
    reference = hvd.DistributedOptimizer(torch.optim.SparseAdam(theirs.parameters(), lr=0.1),
                                         named_parameters=[("ref.weight", theirs.weight)], sparse_as_dense=True)
    for step in range(3):
        tokens = torch.tensor([step, 3 * hvd.rank() + 7, 40])
        for module, optimizer in ((ours, opt), (theirs, reference)):
            optimizer.zero_grad()
            module(tokens).sum().backward()
            optimizer.step()
            assert module.weight.grad.is_sparse
    assert torch.equal(ours.weight, theirs.weight)


@pytest.mark.parametrize("prunable", [None, []], ids=["pruned", "unpruned"])
def test_sparse_embedding_gradients(prunable):
    """Unpruned: sparse all-reduce exactly as hvd.DistributedOptimizer. Pruned: densified, with a warning."""
    torch.manual_seed(0)
    ours, theirs = torch.nn.Embedding(100, 8, sparse=True), torch.nn.Embedding(100, 8, sparse=True)
    theirs.load_state_dict(ours.state_dict())
    opt = pt.DistributedOptimizer(torch.optim.SGD(ours.parameters(), lr=0.1), named_parameters=ours.named_parameters(),
                                  sparsity=0.5, ranking="layer", begin_step=0, end_step=0, prunable=prunable)
    reference = hvd.DistributedOptimizer(torch.optim.SGD(theirs.parameters(), lr=0.1),
                                         named_parameters=[("ref.weight", theirs.weight)])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(3):
            tokens = torch.tensor([step, 2 * step + 1, 40])
            for module, optimizer in ((ours, opt), (theirs, reference)):
                optimizer.zero_grad()
                module(tokens).sum().backward()
                optimizer.step()
    sparse_warnings = [str(w.message) for w in caught if "sparse gradient" in str(w.message)]
    if prunable is None:
        assert int(opt.masks()["weight"].sum()) == 400
        assert ours.weight.grad.layout == torch.strided
        assert sparse_warnings == ["parameter 'weight' has a sparse gradient and it is pruned: it travels dense "
                                   "(pass sparse_as_dense=True to silence this)"]
        assert torch.count_nonzero(ours.weight) <= 400
    else:
        assert opt.masks() == {} and sparse_warnings == []
        assert ours.weight.grad.is_sparse
        assert torch.equal(ours.weight, theirs.weight)
        assert opt.stats()["tensors"]["weight"]["sent_bytes"] == 3 * 8 + 3 * 8 * 4  # int64 indices + fp32 rows


def test_groups_honour_gradient_predivide_factor():
    """fp16 on the wire: 2 x 40000 overflows fp16 unless the predivide factor splits the average."""
    results = {}
    for groups in (None, 1):
        weights = [torch.nn.Parameter(torch.zeros(4)) for _ in range(2)]
        opt = pt.DistributedOptimizer(torch.optim.SGD(weights, lr=1.0), named_parameters=[("a", weights[0]), ("b", weights[1])],
                                      compression=hvd.Compression.fp16, gradient_predivide_factor=2.0, groups=groups,
                                      sparsity=0.0)
        ((weights[0].sum() + weights[1].sum()) * 40000.0).backward()  # the hooks start the (grouped) all-reduce
        opt.synchronize()
        results[groups] = [w.grad.clone() for w in weights]
    for grouped, ungrouped in zip(results[1], results[None]):
        assert torch.isfinite(grouped).all()
        assert torch.equal(grouped, ungrouped)
        assert torch.equal(grouped, torch.full((4,), 40000.0))


def test_wrapping_again_hands_the_hooks_over():
    model = make_model()
    first = pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters(),
                                    sparsity=0.0)
    with pytest.warns(UserWarning, match="wrapped by another pt.DistributedOptimizer"):
        second = pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters(), sparsity=0.0)
    reference_model = make_model()
    reference = hvd.DistributedOptimizer(torch.optim.SGD(reference_model.parameters(), lr=0.1),
                                         named_parameters=reference_model.named_parameters())
    train(model, second, 2)
    train(reference_model, reference, 2)
    assert first._handles == {}, "the replaced optimizer must not all-reduce any more"
    with pytest.raises(RuntimeError, match="was replaced"):
        first.step()
    for (name, a), b in zip(model.named_parameters(), reference_model.parameters()):
        assert torch.equal(a, b), name


def test_step_hooks_run_once_per_step_after_the_reduction():
    model = make_model()
    opt = pactrain(model, OPTIMIZERS["sgd-stateless"], 0.5)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    seen = []
    opt.register_step_pre_hook(lambda optimizer, args, kwargs: seen.append(("pre", model.fc.weight.grad.clone())))
    opt.register_step_post_hook(lambda optimizer, args, kwargs: seen.append(("post", None)))
    train(model, opt, 2)
    assert [kind for kind, _ in seen] == ["pre", "post", "pre", "post"]
    assert_same_on_all_ranks({"pre-hook grad": seen[2][1]})  # the hook sees the reduced gradient


def test_bfloat16_parameters_prune_and_stay_identical():
    model = make_model().to(torch.bfloat16)  # the same seed everywhere: Horovod cannot broadcast bf16 tensors
    opt = pactrain(model, OPTIMIZERS["sgd-momentum-wd"], 0.8)
    for step in range(5):
        inputs, labels = torch.randn(8, 3, 16, 16, generator=torch.Generator().manual_seed(hvd.rank() * 100 + step)), \
            torch.randint(0, 10, (8,))
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(inputs.to(torch.bfloat16)).float(), labels).backward()
        opt.step()
    assert opt.masks(), "bf16 weights were pruned"
    for name, mask in opt.masks().items():
        assert torch.all(dict(model.named_parameters())[name][~mask] == 0), name
    assert_same_on_all_ranks({n: p.float() for n, p in model.named_parameters()})


def test_grad_scaler_skipping_an_overflowed_step_keeps_every_rank_consistent():
    """torch AMP with Horovod's idiom (synchronize, unscale_, step in skip_synchronize): an inf on one rank
    reaches every rank through the all-reduce, so every rank skips the same step."""
    model = make_model()
    opt = pactrain(model, OPTIMIZERS["sgd-momentum-wd"], 0.8)
    horovod_start(model, opt)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8)
    skipped = []
    for step in range(4):
        opt.zero_grad()
        loss = loss_of(model, step)
        if step == 2 and hvd.rank() == 1:  # in the loss: the hooks send gradients while backward runs
            loss = loss + model.fc.bias[0] * float("inf")
        skipped.append(amp_step(model, opt, scaler, loss))
    assert skipped == [False, False, True, False]
    assert opt.step_count == 3, "the skipped step does not move the schedule"
    assert_same_on_all_ranks(dict(model.named_parameters()))
    assert_same_on_all_ranks({n: m.to(torch.uint8) for n, m in opt.masks().items()}, "mask")


SYNCING = ("item", "tolist", "cpu", "numpy", "__int__", "__float__", "__bool__")


@pytest.mark.parametrize("values", ["inherit", "fp16"])
def test_steady_state_steps_make_no_host_syncs(values, monkeypatch):
    """Between mask changes and checks, nothing in pactrain_hvd reads a tensor back to the host (a
    device sync on a GPU): counted by wrapping every Tensor method that does, as called from our code."""
    model = make_model()
    opt = pt.DistributedOptimizer(OPTIMIZERS["sgd-momentum-wd"](model.parameters()),
                                  named_parameters=model.named_parameters(), sparsity=0.9, ranking="layer", begin_step=0, end_step=0,
                                  verify_every=1000, packed_values=values)
    horovod_start(model, opt)
    train(model, opt, 2)  # step 0 prunes, step 1 is the first check
    plan = {name: tensor["packed"] for name, tensor in opt.stats()["tensors"].items()}
    assert True in plan.values() and False in plan.values(), plan  # packed and dense-plan masked tensors both run

    calls = []
    for method in SYNCING:
        original = getattr(torch.Tensor, method)

        def counted(self, *args, _original=original, _method=method, **kwargs):
            caller = sys._getframe(1).f_globals.get("__name__", "")
            if caller.startswith("pactrain_hvd"):
                calls.append(f"{_method} from {caller}:{sys._getframe(1).f_lineno}")
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, method, counted)
    train(model, opt, 3, start=2)
    monkeypatch.undo()
    assert calls == []
    assert_same_on_all_ranks(dict(model.named_parameters()))
