import numpy as np
import pytest

from pactrain_hvd.core import (
    MaskMismatchError,
    check_fingerprints,
    describe_mismatches,
    erk_sparsities,
    fingerprint_table,
    magnitude_masks,
    mask_fingerprint,
    num_to_keep,
    overall_sparsity,
    survivor_scales,
    validate_mask,
    validate_masks,
)


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
    tables = [fingerprint_table({"fc.weight": 64}, {"fc.weight": mask_fingerprint(m)}, 7) for m in (a, b)]
    (problem,) = describe_mismatches(["fc.weight"], tables)
    assert "'fc.weight'" in problem and "ranks [1]" in problem
    assert describe_mismatches(["fc.weight"], [tables[0]] * 2) == []


def gathered(*tables):
    return np.concatenate(tables)


def test_table_has_one_fixed_row_per_prunable_name_whatever_masks_a_rank_holds():
    prunable = {"a.weight": 8, "b.weight": 4}
    none_held = fingerprint_table(prunable, {}, 0)
    all_kept = fingerprint_table(prunable, {"a.weight": mask_fingerprint(np.ones(8, dtype=bool))}, 0)
    assert none_held.shape == all_kept.shape == (2 + 2, 3)  # two header rows, one row per name
    np.testing.assert_array_equal(none_held, all_kept)
    check_fingerprints(list(prunable), gathered(none_held, all_kept), 2, "torch", "hint")


def test_ranks_pruning_different_tensors_get_one_clear_error():
    mine = fingerprint_table({"a.weight": 8}, {}, 0)
    theirs = fingerprint_table({"a.weight": 8, "b.weight": 4}, {}, 0)
    for names in (["a.weight"], ["a.weight", "b.weight"]):  # each rank parses the same bytes with its own names
        with pytest.raises(MaskMismatchError, match="ranks prune different sets of tensors"):
            check_fingerprints(names, gathered(mine, theirs), 2, "torch", "hint")


def test_differing_weights_are_named_as_the_cause():
    a, b = np.zeros(8, dtype=bool), np.zeros(8, dtype=bool)
    a[:2], b[-2:] = True, True
    tables = [fingerprint_table({"w": 8}, {"w": mask_fingerprint(m)}, 3, {"w": total}) for m, total in ((a, 1.5), (b, -0.25))]
    with pytest.raises(MaskMismatchError, match=r"masks differ across ranks: 'w'.*Weights differ too \('w'\).*hvd.broadcast_parameters"):
        check_fingerprints(["w"], gathered(*tables), 2, "torch", "hint")
    same_weights = [fingerprint_table({"w": 8}, {"w": mask_fingerprint(m)}, 3, {"w": 1.5}) for m in (a, b)]
    with pytest.raises(MaskMismatchError, match="pruning masks differ across ranks: 'w': ranks \\[1\\] differ from rank 0 \\(rank 0: 2 kept, rank 1: 2 kept\\)\\. hint"):
        check_fingerprints(["w"], gathered(*same_weights), 2, "torch", "hint")


def test_differing_schedule_position_is_a_mismatch():
    tables = [fingerprint_table({"w": 8}, {}, step) for step in (0, 500)]
    with pytest.raises(MaskMismatchError, match=r"schedule position differs \(rank 0: 0, rank 1: 500\)\. hint"):
        check_fingerprints(["w"], gathered(*tables), 2, "torch", "hint")


def test_weights_alone_differing_is_not_an_error():
    """Horovod does not check weights (its tests skip broadcast_parameters): only masks are proven."""
    tables = [fingerprint_table({"w": 8}, {}, 0, {"w": total}) for total in (1.0, 2.0)]
    check_fingerprints(["w"], gathered(*tables), 2, "torch", "hint")


def test_validate_mask_names_tensor_and_problem():
    with pytest.raises(ValueError, match=r"'fc.weight' has shape \(2,\), parameter has shape \(3,\)"):
        validate_mask("fc.weight", np.ones(2, dtype=bool), (3,))
    with pytest.raises(TypeError, match="dtype bool"):
        validate_mask("fc.weight", np.ones(3, dtype=np.float32), (3,))
    with pytest.raises(ValueError, match="all zeros"):
        validate_mask("fc.weight", np.zeros(3, dtype=bool), (3,))


def test_validate_masks_refuses_names_not_prunable_and_checks_each_mask():
    shapes = {"fc.weight": (3,), "conv.weight": (2, 2)}
    with pytest.raises(ValueError, match="masks given for variables that are not prunable here: bias, fc.bias"):
        validate_masks({"fc.bias": np.ones(3, bool), "bias": np.ones(1, bool)}, shapes, "variables")
    with pytest.raises(ValueError, match=r"'conv.weight' has shape \(4,\)"):
        validate_masks({"conv.weight": np.ones(4, bool)}, shapes, "parameters")
    valid = validate_masks({"fc.weight": [True, False, True]}, shapes, "parameters")
    assert valid["fc.weight"].dtype == np.bool_ and valid["fc.weight"].tolist() == [True, False, True]


def test_overall_sparsity_counts_unmasked_tensors_as_kept():
    assert overall_sparsity({"a": 100, "b": 300}, {"b": 30}) == pytest.approx(1 - 130 / 400)
    assert overall_sparsity({}, {}) == 0.0


def test_erk_prunes_large_tensors_more_and_hits_the_overall_target():
    shapes = {"conv": (64, 32, 3, 3), "fc1": (1024, 3136), "fc2": (10, 1024)}
    shares = erk_sparsities(shapes, 0.9)
    sizes = {name: np.prod(shape) for name, shape in shapes.items()}
    kept = sum(sizes[name] * (1 - shares[name]) for name in shapes)
    assert kept == pytest.approx(0.1 * sum(sizes.values()))
    assert shares["fc1"] > 0.9 > shares["conv"] >= 0.0
    assert shares["fc2"] == 0.0  # its ERK density passes 1: kept dense, the others make up for it
    rng = np.random.default_rng(0)
    weights = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}
    masks = magnitude_masks(weights, 0.9, ranking="erk")
    assert sum(int(m.sum()) for m in masks.values()) == pytest.approx(0.1 * sum(sizes.values()), rel=1e-4)
    assert masks["fc2"].all()


def test_default_ranking_is_erk_in_every_frontend():
    import inspect

    from pactrain_hvd.core.config import PacTrainConfig

    assert PacTrainConfig().ranking == "erk"
    frontends = ["pactrain_hvd.torch.optimizer:DistributedOptimizer", "pactrain_hvd.torch.ddp:PacTrainHookState",
                 "pactrain_hvd.tensorflow.state:PacTrainState",
                 "pactrain_hvd.tensorflow.keras.optimizer:DistributedOptimizer"]
    for path in frontends:
        module, name = path.split(":")
        target = getattr(pytest.importorskip(module), name)
        assert inspect.signature(target).parameters["ranking"].default == "erk", path


def test_survivor_scales_give_the_survivors_their_tensors_norm():
    weight = np.array([[3.0, -4.0], [0.5, 0.0]])
    mask = np.array([[True, True], [False, False]])
    scales = survivor_scales({"w": weight, "dense": weight}, {"w": mask, "dense": np.ones_like(mask)})
    assert scales == {"w": pytest.approx(np.sqrt(25.25 / 25)), "dense": 1.0}
    assert np.linalg.norm(weight * mask * scales["w"]) == pytest.approx(np.linalg.norm(weight))


def test_survivor_scales_of_a_uniform_initialisation_at_0_95_are_about_2_6():
    weight = np.random.default_rng(0).uniform(-1, 1, (512, 512))
    masks = magnitude_masks({"w": weight}, 0.95)
    assert survivor_scales({"w": weight}, masks)["w"] == pytest.approx(2.65, abs=0.02)


def test_survivor_scales_leave_a_tensor_whose_survivors_are_all_zero_alone():
    assert survivor_scales({"w": np.zeros((4, 4))}, {"w": np.eye(4, dtype=bool)}) == {"w": 1.0}
