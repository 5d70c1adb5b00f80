"""pt.DistributedOptimizer in one process: argument checks happen before any communication."""

import os
import subprocess
import sys

import horovod.torch as hvd
import numpy as np
import pytest
import torch

import pactrain_hvd.torch as pt


@pytest.fixture(scope="module", autouse=True)
def horovod():
    hvd.init()
    yield


def model_and_sgd():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(sparsity=1.0), ValueError, r"sparsity must be in \[0, 1\)"),
    (dict(sparsity=-0.1), ValueError, r"sparsity must be in \[0, 1\)"),
    (dict(begin_step=10, end_step=5), ValueError, r"end_step \(5\) must be >= begin_step \(10\)"),
    (dict(frequency=0), ValueError, "frequency must be > 0"),
    (dict(op=hvd.Adasum), ValueError, "Adasum is not"),
    (dict(op=hvd.Sum, gradient_predivide_factor=2.0), ValueError, "gradient_predivide_factor not supported"),
    (dict(backward_passes_per_step=0), ValueError, "backward_passes_per_step must be an int > 0"),
    (dict(ranking="row"), ValueError, "ranking must be"),
    (dict(groups=-1), ValueError, "groups should be"),
    (dict(sparsity=float("nan")), ValueError, r"sparsity must be in \[0, 1\), got nan"),
    (dict(sparsity="0.9"), TypeError, r"sparsity must be a number in \[0, 1\), got '0.9'"),
    (dict(frequency=2.5), TypeError, "frequency must be an int, got float"),
    (dict(op=hvd.Product), ValueError, "op=hvd.Product is not supported with packing"),
    (dict(backward_passes_per_step=1.0), ValueError, "backward_passes_per_step must be an int > 0, got 1.0"),
    (dict(verify_every=-1), ValueError, "verify_every must be >= 0"),
    (dict(verify_every=0.5), TypeError, "verify_every must be an int, got 0.5"),
    (dict(pack_min_numel=-1), ValueError, "pack_min_numel must be >= 0, got -1"),
    (dict(pack_max_density=0.0), ValueError, r"pack_max_density must be in \(0, 1\], got 0.0"),
    (dict(pack_max_density=float("nan")), ValueError, r"pack_max_density must be in \(0, 1\], got nan"),
    (dict(prunable=["encoder.*"]), ValueError, r"prunable pattern 'encoder.\*' matches no parameter name \(names look like: 0.bias"),
    (dict(prunable=123), TypeError, r"prunable must be a predicate \(name, tensor\) -> bool or a list of glob patterns"),
    (dict(prunable=["0.*", 7]), TypeError, "prunable patterns must be strings, got 7"),
    (dict(compression="fp16"), TypeError, "compression must be a Horovod compressor such as hvd.Compression.fp16"),
    (dict(gradient_predivide_factor=0), ValueError, r"gradient_predivide_factor must be a finite number > 0 .*, got 0"),
    (dict(gradient_predivide_factor=float("inf")), ValueError, "gradient_predivide_factor must be a finite number > 0"),
    (dict(packed_values=["fp16"]), ValueError, r"packed_values must be one of .*got \['fp16'\]"),
])
def test_bad_arguments_name_what_is_wrong(kwargs, error, message):
    model, sgd = model_and_sgd()
    with pytest.raises(error, match=message):
        pt.DistributedOptimizer(sgd, named_parameters=model.named_parameters(), **kwargs)


def test_numpy_integers_are_accepted_where_horovod_accepts_them():
    model, sgd = model_and_sgd()
    opt = pt.DistributedOptimizer(sgd, named_parameters=model.named_parameters(), backward_passes_per_step=np.int64(2))
    assert opt.backward_passes_per_step == 2 and type(opt.backward_passes_per_step) is int


def test_prunable_patterns_that_match_select_those_tensors():
    model, sgd = model_and_sgd()
    opt = pt.DistributedOptimizer(sgd, named_parameters=model.named_parameters(), prunable=["2.*"], begin_step=0,
                                  end_step=0)
    opt.zero_grad()
    model(torch.randn(4, 64)).sum().backward()
    opt.step()
    assert sorted(opt.masks()) == ["2.bias", "2.weight"]


def test_bad_named_parameters():
    model, sgd = model_and_sgd()
    params = list(model.named_parameters())
    with pytest.raises(ValueError, match="duplicates: 0.weight"):
        pt.DistributedOptimizer(sgd, named_parameters=params + [("0.weight", params[0][1])])
    with pytest.raises(ValueError, match=r"positions \[3\] are not named"):
        pt.DistributedOptimizer(sgd, named_parameters=params[:3])
    stray = pt.DistributedOptimizer(sgd, named_parameters=params + [("stray", torch.nn.Parameter(torch.ones(1)))])
    assert sorted(stray._parameters) == sorted(name for name, _ in params), "names the optimizer does not hold: ignored"
    stray._detach()
    with pytest.raises(TypeError, match="torch.optim.Optimizer"):
        pt.DistributedOptimizer(model, named_parameters=params)


def test_bad_masks_change_nothing():
    model, sgd = model_and_sgd()
    opt = pt.DistributedOptimizer(sgd, named_parameters=model.named_parameters(), sparsity=0.5, ranking="layer")
    before = model[0].weight.detach().clone()
    with pytest.raises(ValueError, match=r"'0.weight' has shape \(3, 3\), parameter has shape \(64, 64\)"):
        opt.set_masks({"0.weight": torch.ones(3, 3, dtype=torch.bool)})
    with pytest.raises(ValueError, match="'0.weight' is all zeros"):
        opt.set_masks({"0.weight": torch.zeros(64, 64, dtype=torch.bool)})
    with pytest.raises(ValueError, match="not prunable here: 0.bias"):
        opt.set_masks({"0.bias": torch.ones(64, dtype=torch.bool)})
    with pytest.raises(pt.CheckpointError, match="does not fit this model"):
        opt.load_state_dict(dict(sgd.state_dict(), pactrain={"step": 3, "masks": {"0.weight": torch.ones(2, dtype=torch.bool)}}))
    assert opt.masks() == {} and opt.step_count == 0
    assert torch.equal(model[0].weight, before)


def test_lr_scheduler_and_single_process_training():
    model, sgd = model_and_sgd()
    opt = pt.DistributedOptimizer(sgd, named_parameters=model.named_parameters(), sparsity=0.75, ranking="layer",
                                  begin_step=0, end_step=0)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    for _ in range(4):
        opt.zero_grad()
        model(torch.randn(8, 64)).sum().backward()
        opt.step()
        scheduler.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.025)
    assert int(opt.masks()["0.weight"].sum()) == 1024
    assert torch.count_nonzero(model[0].weight) <= 1024


def test_one_process_communicates_nothing_and_still_prunes_like_horovod():
    """Horovod all-reduces only when size() > 1 (or under elastic); packed_values='ternary' quantises nothing alone."""
    model, sgd = model_and_sgd()
    reference, reference_sgd = model_and_sgd()
    opt = pt.DistributedOptimizer(sgd, named_parameters=model.named_parameters(), sparsity=0.5, ranking="layer", begin_step=0,
                                  end_step=0, pack_min_numel=0, packed_values="ternary")
    for step in range(3):
        inputs = torch.randn(8, 64, generator=torch.Generator().manual_seed(step))
        for net, optimizer in ((model, opt), (reference, reference_sgd)):
            optimizer.zero_grad()
            net(inputs).sum().backward()
            masks = opt.masks()
            if net is reference:  # plain SGD under the same masks, by hand
                for name, p in net.named_parameters():
                    if name in masks:
                        p.grad.mul_(masks[name])
            optimizer.step()
        if step == 0:  # the mask was made from the weights before this step's update
            with torch.no_grad():
                reference[0].weight.mul_(opt.masks()["0.weight"])
                reference[2].weight.mul_(opt.masks()["2.weight"])
    assert opt.stats()["sent_bytes"] == 0 and opt.stats()["tensors"] == {}
    assert opt.masks() and opt.step_count == 3
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert torch.equal(p, q), name


def test_horovods_own_wrapper_is_refused():
    model, sgd = model_and_sgd()
    wrapped = hvd.DistributedOptimizer(sgd, named_parameters=model.named_parameters())
    with pytest.raises(TypeError, match="not one already wrapped in a DistributedOptimizer"):
        pt.DistributedOptimizer(wrapped, named_parameters=model.named_parameters())


def test_duplicate_names_are_refused_before_horovod_is_needed():
    """Horovod's test_duplicate_names: the ValueError comes first, initialised or not."""
    code = ("import torch, pactrain_hvd.torch as pt\n"
            "w = torch.nn.Parameter(torch.ones(2))\n"
            "try:\n"
            "    pt.DistributedOptimizer(torch.optim.SGD([w], lr=1), named_parameters=[('w', w), ('w', w)])\n"
            "except ValueError as error:\n"
            "    print(error)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert "duplicates: w" in result.stdout, result.stderr[-2000:]


def test_values_is_the_deprecated_name_of_packed_values():
    """``values=`` and its ``"fp32"`` (which always meant "as compression says") keep working, with a
    DeprecationWarning that points at the caller; the two spellings together are refused."""
    for kwargs, packed in ((dict(values="fp32"), "inherit"), (dict(values="ternary"), "ternary"),
                           (dict(packed_values="fp32"), "inherit")):
        model, sgd = model_and_sgd()
        with pytest.warns(DeprecationWarning, match="deprecated") as caught:
            opt = pt.DistributedOptimizer(sgd, named_parameters=model.named_parameters(), **kwargs)
        assert opt.packed_values == packed and caught[0].filename == __file__
    model, sgd = model_and_sgd()
    with pytest.raises(ValueError, match="give packed_values= or the deprecated values=, not both"):
        pt.DistributedOptimizer(sgd, named_parameters=model.named_parameters(), packed_values="fp16", values="fp16")


@pytest.mark.parametrize("make_inner", [
    lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-3),
    lambda params: torch.optim.Adam(params, lr=1e-2),
    lambda params: torch.optim.AdamW(params, lr=1e-2, weight_decay=0.05),
    lambda params: torch.optim.AdamW(params, lr=1e-2, weight_decay=0.05, fused=True),  # docs/pytorch.md: fused on CPU
    lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-3, fused=True),
], ids=["sgd-momentum-wd", "adam", "adamw", "adamw-fused", "sgd-fused"])
def test_clearing_state_at_newly_pruned_coordinates_changes_no_surviving_weight(make_inner, monkeypatch):
    """The optimizer-state question of the accuracy issue, answered exactly: for per-coordinate optimizers a
    coordinate's state moves only that coordinate, so keeping it (and re-zeroing pruned weights after every
    step instead) trains the same survivors bitwise. Clearing is what lets the re-zeroing pass be skipped.

    One thread: with several, the BLAS may pick its thread count per call (under load, fewer), and a matmul's
    last bits then differ between two otherwise identical runs."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        check_clearing_changes_no_surviving_weight(make_inner, monkeypatch)
    finally:
        torch.set_num_threads(threads)


def check_clearing_changes_no_surviving_weight(make_inner, monkeypatch):
    def train(keep_state):
        model, _ = model_and_sgd()
        opt = pt.DistributedOptimizer(make_inner(model.parameters()), named_parameters=model.named_parameters(),
                                      sparsity=0.8, begin_step=0, end_step=30, frequency=10)
        if keep_state:
            monkeypatch.setattr(opt.pactrain_state.pruner, "clear_optimizer_state", lambda state: None)
            opt.pactrain_state._zero_stays_zero = False  # re-zero pruned weights after every step
        generator = torch.Generator().manual_seed(3)
        for _ in range(40):
            inputs, labels = torch.randn(32, 64, generator=generator), torch.randint(0, 2, (32,), generator=generator)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(inputs), labels).backward()
            opt.step()
        state = [v for p in model.parameters() for v in opt.state[p].values() if torch.is_tensor(v) and v.dim()]
        return dict(model.named_parameters()), opt.masks(), state

    weights, masks, cleared_state = train(keep_state=False)
    kept_weights, kept_masks, kept_state = train(keep_state=True)
    assert masks.keys() == kept_masks.keys() and all(torch.equal(masks[n], kept_masks[n]) for n in masks)
    for name, p in weights.items():
        assert torch.equal(p, kept_weights[name]), f"{name}: survivors differ"
    assert sum(int(s.count_nonzero()) for s in kept_state) > sum(int(s.count_nonzero()) for s in cleared_state), \
        "the kept run does hold state at pruned coordinates"
