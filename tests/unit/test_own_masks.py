"""The rule for masks brought by the user (core.own_masks), and masks that never grow back."""

import numpy as np
import pytest

from pactrain_hvd.core import magnitude_masks
from pactrain_hvd.core.own_masks import binary_mask, check_mask_names, schedule_sparsity


def test_given_masks_turn_the_schedule_off_unless_continue_pruning():
    assert schedule_sparsity(0.9, masks_given=False, continue_pruning=False) == 0.9
    assert schedule_sparsity(0.9, masks_given=True, continue_pruning=False) == 0.0
    assert schedule_sparsity(0.95, masks_given=True, continue_pruning=True) == 0.95
    with pytest.raises(ValueError, match="needs masks"):
        schedule_sparsity(0.9, masks_given=False, continue_pruning=True)
    with pytest.raises(ValueError, match="needs sparsity > 0"):
        schedule_sparsity(0.0, masks_given=True, continue_pruning=True)
    with pytest.raises(TypeError, match="continue_pruning must be a bool"):
        schedule_sparsity(0.9, masks_given=True, continue_pruning="yes")


def test_binary_mask_accepts_only_zeros_and_ones():
    assert binary_mask("w", np.array([0.0, 1.0, 1.0])).tolist() == [False, True, True]
    with pytest.raises(ValueError, match="'w' holds values other than 0 and 1"):
        binary_mask("w", np.array([0.0, 0.5]))


def test_mask_names_must_be_known_and_present():
    check_mask_names({"a": None}, ["a", "b"], "parameters")
    with pytest.raises(ValueError, match="does not update: c"):
        check_mask_names({"a": None, "c": None}, ["a", "b"], "parameters")
    with pytest.raises(ValueError, match="empty"):
        check_mask_names({}, ["a"], "parameters")


@pytest.mark.parametrize("ranking", ["layer", "global"])
def test_a_target_below_the_given_sparsity_revives_nothing(ranking):
    rng = np.random.default_rng(0)
    weights = {"a": rng.normal(size=(20, 10)), "b": rng.normal(size=50)}
    given = {name: rng.random(w.shape) < 0.2 for name, w in weights.items()}  # ~80 % pruned
    for target in (0.0, 0.5, 0.8):
        masks = magnitude_masks(weights, target, previous=given, ranking=ranking)
        for name in weights:
            assert not (masks[name] & ~given[name]).any(), f"{name} revived at target {target}"
    tighter = magnitude_masks(weights, 0.95, previous=given, ranking=ranking)
    assert sum(int(m.sum()) for m in tighter.values()) < sum(int(m.sum()) for m in given.values())
