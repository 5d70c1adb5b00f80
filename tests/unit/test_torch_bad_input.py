"""Bad input to pt.DistributedOptimizer in one process: a clear error, before any communication, nothing changed.

Constructor arguments are in test_torch_optimizer_single.py; here: masks, checkpoints, dtypes,
sparse gradients, world size on resume, and use before ``hvd.init()``.
"""

import subprocess
import sys
import warnings

import horovod.torch as hvd
import numpy as np
import pytest
import torch

import pactrain_hvd.torch as pt
from pactrain_hvd.core import WorldSizeChangedWarning


@pytest.fixture(scope="module", autouse=True)
def horovod():
    hvd.init()


def trained(sparsity=0.5):
    """A model pruned once and stepped twice: masks, momentum and a schedule position to protect."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
    opt = pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                  named_parameters=model.named_parameters(), sparsity=sparsity, begin_step=0, end_step=0)
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(8, 64)).sum().backward()
        opt.step()
    return model, opt


def snapshot(model, opt):
    return ({k: v.clone() for k, v in model.state_dict().items()}, opt.masks(), opt.step_count,
            {id(p): {k: v.clone() for k, v in s.items()} for p, s in opt.state.items()})


def assert_unchanged(before, after):
    weights, masks, step, state = before
    weights2, masks2, step2, state2 = after
    assert weights.keys() == weights2.keys() and all(torch.equal(weights[k], weights2[k]) for k in weights)
    assert masks.keys() == masks2.keys() and all(torch.equal(masks[k], masks2[k]) for k in masks)
    assert step == step2
    assert state.keys() == state2.keys()
    assert all(torch.equal(state[p][k], state2[p][k]) for p in state for k in state[p])


def ckpt(opt, **pactrain):
    state = opt.state_dict()
    state["pactrain"] = dict(state["pactrain"], **pactrain)
    return state


BOOL_64 = torch.ones(64, 64, dtype=torch.bool)


@pytest.mark.parametrize("act, error, message", [
    (lambda o: o.set_masks({"0.weight": torch.ones(3, 3, dtype=torch.bool)}), ValueError,
     r"mask for '0.weight' has shape \(3, 3\), parameter has shape \(64, 64\)"),
    (lambda o: o.set_masks({"0.weight": torch.zeros(64, 64, dtype=torch.bool)}), ValueError,
     "mask for '0.weight' is all zeros"),
    (lambda o: o.set_masks({"0.weight": torch.ones(64, 64, dtype=torch.uint8)}), TypeError,
     "mask for '0.weight' must have dtype bool, got uint8"),
    (lambda o: o.set_masks({"0.bias": torch.ones(64, dtype=torch.bool)}), ValueError, "not prunable here: 0.bias"),
    (lambda o: o.set_masks({"enc.weight": BOOL_64}), ValueError, "not prunable here: enc.weight"),
    (lambda o: o.set_masks([BOOL_64]), TypeError, "masks must be a dict of parameter name -> bool tensor, got list"),
    (lambda o: o.set_masks({"0.weight": torch.ones(64, 64, dtype=torch.bool, device="meta")}), TypeError,
     "mask for '0.weight' must be a bool tensor or array with data"),
    (lambda o: o.load_state_dict(ckpt(o, masks={"0.weight": torch.ones(64, 32, dtype=torch.bool)})), pt.CheckpointError,
     r"does not fit this model: mask for '0.weight' has shape \(64, 32\)"),
    (lambda o: o.load_state_dict(ckpt(o, masks={"0.weight": torch.ones(64, 64)})), pt.CheckpointError,
     "does not fit this model: mask for '0.weight' must have dtype bool, got float32"),
    (lambda o: o.load_state_dict(ckpt(o, masks={"encoder.0.weight": BOOL_64})), pt.CheckpointError,
     "not prunable here: encoder.0.weight"),
    (lambda o: o.load_state_dict(ckpt(o, step="7")), pt.CheckpointError, "step must be an int >= 0, got '7'"),
    (lambda o: o.load_state_dict(ckpt(o, step=-1)), pt.CheckpointError, "step must be an int >= 0, got -1"),
    (lambda o: o.load_state_dict(ckpt(o, world_size=0)), pt.CheckpointError, "world_size must be an int >= 1, got 0"),
    (lambda o: o.load_state_dict(dict(o.state_dict(), pactrain={"step": 1})), pt.CheckpointError,
     "needs 'step' and 'masks'"),
], ids=["mask-shape", "mask-all-zeros", "mask-dtype", "mask-unpruned-name", "mask-unknown-name", "masks-not-dict",
        "mask-no-data", "ckpt-mask-shape", "ckpt-mask-dtype", "ckpt-other-model", "ckpt-step-type", "ckpt-step-negative",
        "ckpt-world-size", "ckpt-no-masks"])
def test_bad_masks_and_checkpoints_change_nothing(act, error, message):
    model, opt = trained()
    before = snapshot(model, opt)
    with pytest.raises(error, match=message):
        act(opt)
    assert_unchanged(before, snapshot(model, opt))


def test_checkpoint_from_another_world_size_warns_and_loads():
    """Masks do not depend on the number of ranks: resuming elsewhere (Horovod elastic) is legitimate."""
    model, opt = trained()
    state = opt.state_dict()
    assert state["pactrain"]["world_size"] == hvd.size() == 1
    _, fresh = trained(sparsity=0.5)
    fresh.set_masks({"0.weight": BOOL_64})
    with pytest.warns(WorldSizeChangedWarning, match="saved with world size 4, loading it with 1"):
        fresh.load_state_dict(ckpt(opt, world_size=4))
    assert fresh.step_count == opt.step_count and torch.equal(fresh.masks()["0.weight"], opt.masks()["0.weight"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fresh.load_state_dict(state)  # same world size, or a checkpoint that predates the field: silent
        del state["pactrain"]["world_size"]
        fresh.load_state_dict(state)


def test_checkpoint_saved_at_another_sparsity_is_refused_unless_asked_and_then_said():
    model, opt = trained(sparsity=0.5)
    saved = opt.state_dict()
    other_model, other = trained(sparsity=0.75)
    before = snapshot(other_model, other)
    with pytest.raises(pt.CheckpointError, match=r"other PacTrain settings \(sparsity 0.5 -> 0.75, checkpoint -> this "
                                                 r"optimizer\).*resume_changed_settings=True"):
        other.load_state_dict(saved)
    assert_unchanged(before, snapshot(other_model, other))
    legacy = ckpt(opt)  # a checkpoint from before the settings were recorded: its sparsity only
    legacy["pactrain"]["sparsity"] = legacy["pactrain"].pop("settings")["sparsity"]
    with pytest.raises(pt.CheckpointError, match=r"sparsity 0.5 -> 0.75"):
        other.load_state_dict(legacy)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
    asked = pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                    named_parameters=model.named_parameters(), sparsity=0.75, begin_step=0, end_step=0,
                                    resume_changed_settings=True)
    with pytest.warns(pt.ChangedSettingsWarning, match=r"sparsity 0.5 -> 0.75.*masks stay as saved"):
        asked.load_state_dict(saved)
    assert asked.step_count == opt.step_count and torch.equal(asked.masks()["0.weight"], opt.masks()["0.weight"])


@pytest.mark.parametrize("sparsity", [np.float32(0.5), torch.tensor(0.5), np.array(0.5)])
def test_numpy_scalars_and_0d_tensors_are_accepted_as_numbers(sparsity):
    model = torch.nn.Linear(64, 64)
    opt = pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters(),
                                  sparsity=sparsity, total_steps=np.int64(100), frequency=torch.tensor(5))
    assert opt.config.sparsity == 0.5 and (opt.config.begin_step, opt.config.end_step, opt.config.frequency) == (10, 60, 5)


def test_complex_parameters_are_refused_at_construction():
    weight = torch.nn.Parameter(torch.ones(4, 4, dtype=torch.complex64))
    with pytest.raises(TypeError, match="parameter 'w' has dtype torch.complex64: Horovod all-reduces float16"):
        pt.DistributedOptimizer(torch.optim.SGD([weight], lr=0.1), named_parameters=[("w", weight)])
    frozen = torch.nn.Parameter(torch.ones(4, dtype=torch.int64), requires_grad=False)  # never reduced: fine
    pt.DistributedOptimizer(torch.optim.SGD([frozen], lr=0.1), named_parameters=[("n", frozen)])


def test_constructing_before_hvd_init_names_the_fix():
    code = ("import torch, pactrain_hvd.torch as pt; m = torch.nn.Linear(2, 2); "
            "pt.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), named_parameters=m.named_parameters())")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert ("RuntimeError: Horovod is not initialized: call hvd.init() before creating "
            "pactrain_hvd.torch.DistributedOptimizer") in result.stderr



def test_a_checkpoint_of_a_compiled_model_names_the_prefix():
    model, opt = trained()
    state = opt.state_dict()
    state["pactrain"]["masks"] = {f"_orig_mod.{name}": mask for name, mask in state["pactrain"]["masks"].items()}
    fresh_model, fresh = trained()
    before = snapshot(fresh_model, fresh)
    with pytest.raises(pt.CheckpointError, match=r"Its names hold '_orig_mod\.': it was saved from a torch.compile'd"):
        fresh.load_state_dict(state)
    assert_unchanged(before, snapshot(fresh_model, fresh))
