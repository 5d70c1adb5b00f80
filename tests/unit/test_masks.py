import numpy as np
import pytest

from pactrain_hvd.core import describe_mismatches, magnitude_masks, mask_fingerprint, num_to_keep, validate_mask


def test_layer_ranking_keeps_the_largest_magnitudes():
    weight = np.array([[0.1, -5.0, 0.3], [2.0, -0.2, 0.05]], dtype=np.float32)
    mask = magnitude_masks({"w": weight}, sparsity=0.5)["w"]
    assert mask.dtype == np.bool_ and mask.shape == weight.shape
    np.testing.assert_array_equal(mask, [[False, True, True], [True, False, False]])


def test_keep_counts_follow_rounding_and_never_empty_a_tensor():
    assert num_to_keep(1000, 0.9) == 100
    assert num_to_keep(10, 0.95) == 1
    assert num_to_keep(0, 0.5) == 0
    rng = np.random.default_rng(0)
    masks = magnitude_masks({"a": rng.normal(size=(37, 11)), "b": rng.normal(size=7)}, sparsity=0.9)
    assert masks["a"].sum() == num_to_keep(37 * 11, 0.9)
    assert masks["b"].sum() == 1


def test_pruned_coordinates_never_come_back():
    rng = np.random.default_rng(1)
    weight = rng.normal(size=1000)
    first = magnitude_masks({"w": weight}, 0.5)["w"]
    grown = weight.copy()
    grown[~first] = 100.0  # large values at pruned positions must not revive them
    second = magnitude_masks({"w": grown}, 0.8, previous={"w": first})["w"]
    assert not (second & ~first).any()
    assert second.sum() == 200


def test_global_ranking_shares_one_threshold():
    small = np.full(100, 0.01)
    large = np.linspace(1.0, 2.0, 100)
    masks = magnitude_masks({"small": small, "large": large}, 0.5, ranking="global")
    assert masks["large"].all()
    assert masks["small"].sum() == 1  # each tensor keeps at least one coordinate
    with pytest.raises(ValueError, match="ranking"):
        magnitude_masks({"w": small}, 0.5, ranking="row")


def test_fingerprint_tells_same_count_at_other_positions_apart():
    a = np.zeros(64, dtype=bool)
    a[[1, 2, 3]] = True
    b = np.zeros(64, dtype=bool)
    b[[1, 2, 4]] = True
    assert mask_fingerprint(a)[0] == mask_fingerprint(b)[0] == 3
    assert mask_fingerprint(a) != mask_fingerprint(b)
    assert mask_fingerprint(a) == mask_fingerprint(a.copy())
    gathered = np.array([[mask_fingerprint(a)], [mask_fingerprint(b)]])
    (problem,) = describe_mismatches(["fc.weight"], gathered)
    assert "'fc.weight'" in problem and "ranks [1]" in problem
    assert describe_mismatches(["fc.weight"], np.array([[mask_fingerprint(a)]] * 2)) == []


def test_validate_mask_names_tensor_and_problem():
    with pytest.raises(ValueError, match=r"'fc.weight' has shape \(2,\), parameter has shape \(3,\)"):
        validate_mask("fc.weight", np.ones(2, dtype=bool), (3,))
    with pytest.raises(TypeError, match="dtype bool"):
        validate_mask("fc.weight", np.ones(3, dtype=np.float32), (3,))
    with pytest.raises(ValueError, match="all zeros"):
        validate_mask("fc.weight", np.zeros(3, dtype=bool), (3,))
