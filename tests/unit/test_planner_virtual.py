"""pactrain_hvd.planner.virtual: each method's per-worker arithmetic on N workers in one process."""

import numpy as np
import pytest

from pactrain_hvd.core.lanes import local_scale
from pactrain_hvd.planner import parse_method
from pactrain_hvd.planner.virtual import VirtualWorkers

RNG = np.random.default_rng(0)


def grads(workers, shape=(64, 128)):
    return [RNG.standard_normal(shape).astype(np.float32) for _ in range(workers)]


def test_pactrain_fp32_values_are_the_masked_mean():
    g = grads(4)
    mask = RNG.random((64, 128)) < 0.1
    out = VirtualWorkers(parse_method("pactrain-0.9"), 4).reduce("w", g, mask)
    expected = np.where(mask, (g[0] + g[1] + g[2] + g[3]) / np.float32(4), 0)
    np.testing.assert_array_equal(out, expected.astype(np.float32))


def test_fp16_rounds_each_worker_then_sums():
    g = grads(2, (10,))
    out = VirtualWorkers(parse_method("fp16"), 2).reduce("b", g)
    expected = (g[0].astype(np.float16) + g[1].astype(np.float16)).astype(np.float32) / 2
    np.testing.assert_array_equal(out, expected)


def test_ternary_decodes_the_summed_lanes_at_the_held_scale():
    # noise 0.5 everywhere: a value survives rounding where |v| > scale / 2
    virtual = VirtualWorkers(parse_method("pactrain-0.9-ternary"), 2, noise=lambda rank, name, step, count: np.full(count, 0.5, np.float32))
    mask = np.array([True, True, True, False, True])
    g0 = np.array([1.0, -0.2, 0.0, 9.0, 3.0], np.float32)
    g1 = np.array([0.5, -1.0, 0.1, 9.0, -3.0], np.float32)
    scale = max(local_scale(g0[mask]), local_scale(g1[mask]))  # the first step's MAX: 2 x mean(1, 1, 0.1, 3) / 4
    assert scale == pytest.approx(2.3)
    out = virtual.reduce("w", [g0, g1], mask)
    # rank 0 sends [0, 0, 0, +1], rank 1 [0, 0, 0, -1] (only |3| > 1.15); the pruned coordinate is 0
    np.testing.assert_array_equal(out, np.zeros(5, np.float32))
    np.testing.assert_allclose(virtual.memory[0]["w"], [1.0, -0.2, 0.0, 3.0 - scale], rtol=1e-6)
    assert virtual.scales["w"] == scale  # held for the next step


@pytest.mark.parametrize("method", ["topk", "pactrain-0.9-ternary", "powersgd"])
@pytest.mark.parametrize("workers", [2, 16])
def test_error_feedback_loses_nothing(method, workers):
    """Over T steps: N x (sum of the averaged gradients) + every worker's memory = every gradient summed."""
    virtual = VirtualWorkers(parse_method(method), workers)
    mask = RNG.random((64, 128)) < 0.2 if "pactrain" in method else None
    sent = np.zeros((64, 128), np.float64)
    total = np.zeros((64, 128), np.float64)
    for _ in range(5):
        g = grads(workers)
        total += sum(np.where(mask, x, 0) if mask is not None else x for x in g)
        sent += workers * virtual.reduce("w", g, mask).astype(np.float64)
    memory = sum(m["w"] for m in virtual.memory).astype(np.float64)
    if mask is None:
        memory = memory.reshape(64, 128)
    else:
        full = np.zeros((64, 128))
        full[mask] = memory
        memory = full
    np.testing.assert_allclose(sent + memory, total, atol=1e-3)


def test_topk_on_one_worker_is_plain_topk():
    g = grads(1)
    out = VirtualWorkers(parse_method("topk"), 1).reduce("w", g)
    k = 82  # ceil(0.01 * 8192)
    assert np.count_nonzero(out) == k
    threshold = np.sort(np.abs(g[0]).ravel())[-k]
    np.testing.assert_array_equal(out, np.where(np.abs(g[0]) >= threshold, g[0], 0))


def test_ternary_sends_fp16_where_lanes_do_not_fit():
    g = grads(645, (8, 4))  # sums up to 1290 are base-1291 digits: 2 to a word, no better than fp16
    mask = np.ones((8, 4), bool)
    out = VirtualWorkers(parse_method("pactrain-0.9-ternary"), 645).reduce("w", g, mask)
    fp16 = VirtualWorkers(parse_method("pactrain-0.9-fp16"), 645).reduce("w", g, mask)
    np.testing.assert_array_equal(out, fp16)


def test_bad_use():
    with pytest.raises(ValueError, match="one gradient per worker"):
        VirtualWorkers(parse_method("topk"), 2).reduce("w", grads(3))
    with pytest.raises(ValueError, match="workers"):
        VirtualWorkers(parse_method("topk"), 0)


def test_powersgd_is_the_rank_r_factorisation_of_the_mean_with_shared_factors():
    """Linear in the summed gradient given the shared P and Q: N workers' mean P Q^T equals one worker's on the mean."""
    g = grads(4)
    four = VirtualWorkers(parse_method("powersgd"), 4).reduce("w", g)
    one = VirtualWorkers(parse_method("powersgd"), 1).reduce("w", [sum(g) / np.float32(4)])
    np.testing.assert_allclose(four, one, rtol=1e-4, atol=1e-5)
    assert np.linalg.matrix_rank(four.astype(np.float64), tol=1e-4) == 4
    small = grads(2, (10, 10))  # 100 elements: averaged whole
    np.testing.assert_array_equal(VirtualWorkers(parse_method("powersgd"), 2).reduce("b", small),
                                  (small[0] + small[1]) / np.float32(2))
