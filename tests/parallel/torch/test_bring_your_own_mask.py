"""Bring your own mask: models pruned with torch.nn.utils.prune, and masks= dicts, under 2 ranks."""

import horovod.torch as hvd
import pytest
import torch
from conftest import assert_same_on_all_ranks, loss_of, make_model
from torch.nn.utils import prune

import pactrain_hvd.torch as pt

STEPS = 4


class EveryOther(prune.BasePruningMethod):
    """A custom method: prunes every other coordinate of the flattened tensor."""

    PRUNING_TYPE = "unstructured"

    def compute_mask(self, t, default_mask):
        mask = default_mask.clone()
        mask.view(-1)[::2] = 0
        return mask


def l1_unstructured(model):
    prune.l1_unstructured(model.conv2, "weight", amount=0.6)
    prune.l1_unstructured(model.fc, "weight", amount=0.8)


def global_unstructured(model):
    prune.global_unstructured([(model.conv1, "weight"), (model.conv2, "weight"), (model.fc, "weight")],
                              pruning_method=prune.L1Unstructured, amount=0.7)


def ln_structured(model):
    prune.ln_structured(model.conv2, "weight", amount=0.5, n=2, dim=0)
    prune.ln_structured(model.fc, "weight", amount=0.5, n=1, dim=1)


def custom_and_container(model):
    EveryOther.apply(model.conv2, "weight")
    prune.l1_unstructured(model.fc, "weight", amount=0.5)
    prune.random_unstructured(model.fc, "weight", amount=0.3)  # a second method: a PruningContainer


PRUNINGS = [l1_unstructured, global_unstructured, ln_structured, custom_and_container]


def sgd(model):
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3)


def train(model, opt, steps):
    for step in range(steps):
        opt.zero_grad()
        loss_of(model, step).backward()
        opt.step()


def pruned_model(prune_fn):
    model = make_model()
    torch.manual_seed(0)  # random_unstructured: the same masks on every rank
    prune_fn(model)
    return model


def prune_masks(model):
    """{name of *_orig: bool mask} read straight from the prune buffers."""
    return {f"{prefix}.{name[:-5]}_orig": buffer.bool() for prefix, module in model.named_modules()
            for name, buffer in module.named_buffers(recurse=False) if name.endswith("_mask")}


def check_byom_training(model, opt, expected_masks):
    assert set(opt.masks()) == set(expected_masks)
    for name, mask in opt.masks().items():
        assert torch.equal(mask, expected_masks[name]), f"opt.masks()[{name!r}] is not the given mask"
    weights_before = {name: p.detach().clone() for name, p in model.named_parameters()}
    train(model, opt, STEPS)
    assert opt.step_count == STEPS
    assert_same_on_all_ranks(dict(model.named_parameters()))
    for name, mask in opt.masks().items():
        assert torch.equal(mask, expected_masks[name]), f"mask of {name} changed during training"
    params = dict(model.named_parameters())
    model(torch.zeros(1, 3, 16, 16))  # the prune hooks recompute the effective weights
    for name, mask in expected_masks.items():
        assert not params[name][~mask].any(), f"{name} is not 0 at pruned coordinates"
        assert not torch.equal(params[name][mask], weights_before[name][mask]), f"{name} did not train"
        module = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
        effective = getattr(module, name.rsplit(".", 1)[-1][: -len("_orig")], None)
        if effective is not None:
            assert not effective[~mask].any(), f"effective weight of {name} is not 0 at pruned coordinates"
    stats = opt.stats()["tensors"]
    packed = [name for name in expected_masks if stats[name]["packed"]]
    assert packed, "no tensor was packed"
    for name in packed:
        assert stats[name]["sent_bytes"] == int(expected_masks[name].sum()) * 4, name
        assert stats[name]["kept"] == int(expected_masks[name].sum()), name


@pytest.mark.parametrize("prune_fn", PRUNINGS, ids=[f.__name__ for f in PRUNINGS])
def test_torch_prune_masks_are_kept_and_packed(prune_fn):
    model = pruned_model(prune_fn)
    expected = prune_masks(model)
    assert expected, "the pruning left no mask"
    opt = pt.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters(), masks=model,
                                  pack_min_numel=0, pack_max_density=0.9)
    assert opt.config.sparsity == 0.0, "given masks are fixed: the schedule is off"
    check_byom_training(model, opt, expected)
    for prefix, module in model.named_modules():  # buffers stay in step; prune.remove leaves a sparse weight
        for name in [n[:-5] for n, _ in module.named_buffers(recurse=False) if n.endswith("_mask")]:
            prune.remove(module, name)
            assert not getattr(module, name)[~expected[f"{prefix}.{name}_orig"]].any(), f"{prefix}.{name}"


def test_masks_dict_is_kept_and_packed():
    model = make_model()
    generator = torch.Generator().manual_seed(7)  # same on every rank
    expected = {name: torch.rand(p.shape, generator=generator) < 0.3
                for name, p in model.named_parameters() if name in ("conv2.weight", "fc.weight", "fc.bias")}
    opt = pt.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters(),
                                  masks={n: m.numpy() if n == "fc.bias" else m for n, m in expected.items()},
                                  pack_min_numel=0)
    assert sorted(opt.pactrain_state.pruner.prunable_names) == sorted(expected), "only tensors with given masks are prunable"
    check_byom_training(model, opt, expected)


def test_continue_pruning_goes_further_from_the_given_masks():
    model = pruned_model(l1_unstructured)
    given = prune_masks(model)
    opt = pt.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters(), masks=model,
                                  continue_pruning=True, sparsity=0.9, ranking="layer", begin_step=0, end_step=2, frequency=1)
    train(model, opt, 3)
    assert_same_on_all_ranks({n: m.to(torch.uint8) for n, m in opt.masks().items()}, "mask")
    for name, mask in opt.masks().items():
        assert not (mask & ~given[name]).any(), f"{name}: a coordinate pruned by torch came back"
        assert int(mask.sum()) == round(mask.numel() * 0.1), f"{name} is not at the target sparsity"
        module = model.get_submodule(name.rsplit(".", 1)[0])
        assert torch.equal(module.weight_mask.bool(), mask), f"{name}: prune buffer not kept in step"


def test_masks_that_differ_across_ranks_raise_on_every_rank():
    model = make_model()
    masks = {"fc.weight": torch.ones(10, 512, dtype=torch.bool)}
    masks["fc.weight"][:, hvd.rank()::2] = False  # same count, other positions on each rank
    opt = pt.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters(), masks=masks)
    with pytest.raises(pt.MaskMismatchError, match=r"'fc.weight': ranks \[1\] differ"):
        loss_of(model, 0).backward()
    assert torch.equal(opt.masks()["fc.weight"], masks["fc.weight"])


@pytest.mark.parametrize("masks, error, message", [
    ({"nope.weight": torch.ones(2, dtype=torch.bool)}, ValueError, "names parameters this optimizer does not update: nope"),
    ({"fc.weight": torch.ones(10, 5, dtype=torch.bool)}, ValueError, r"has shape \(10, 5\), parameter has shape"),
    ({"fc.weight": torch.ones(10, 512)}, TypeError, "must have dtype bool"),
    ({"fc.weight": torch.zeros(10, 512, dtype=torch.bool)}, ValueError, "all zeros"),
    ({}, ValueError, "masks= is empty"),
    (torch.nn.Linear(2, 2), ValueError, "has no tensor pruned with torch.nn.utils.prune"),
    ([1, 2], TypeError, "masks must be a dict"),
])
def test_bad_masks_are_refused_before_anything_changes(masks, error, message):
    model = make_model()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with pytest.raises(error, match=message):
        pt.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters(), masks=masks)
    for name, p in model.named_parameters():
        assert torch.equal(p, before[name]), name


def test_continue_pruning_without_masks_is_refused():
    model = make_model()
    with pytest.raises(ValueError, match="continue_pruning=True needs masks"):
        pt.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters(), continue_pruning=True)


def test_a_pruned_model_without_masks_argument_warns():
    model = pruned_model(l1_unstructured)
    with pytest.warns(UserWarning, match="look pruned with torch.nn.utils.prune: pass masks=model"):
        pt.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters())
