"""The baselines' compressors and memory, without communication (the harness runs them over Horovod)."""

import pytest
import torch

from benchmarks.baselines.baselines import PowerSGDCompressor, ResidualMemory, TopKCompressor


def _topk_set(flat: torch.Tensor, k: int) -> set[int]:
    return set(torch.topk(flat.abs(), k).indices.tolist())


@pytest.mark.parametrize("numel", [10, 5000, 150_000, 2_359_296])
def test_topk_selects_exactly_the_largest_magnitudes(numel):
    flat = torch.randn(numel, generator=torch.Generator().manual_seed(numel))
    compressor = TopKCompressor(0.01)
    values, indices = compressor.compress(flat)
    k = compressor.k(numel)
    assert values.numel() == indices.numel() == k
    assert indices.dtype == torch.int32
    assert set(indices.tolist()) == _topk_set(flat, k)
    assert torch.equal(values, flat[indices.long()])


def test_topk_falls_back_when_the_sampled_threshold_lets_too_few_through():
    flat = torch.zeros(200_000)
    flat[:7] = torch.arange(1.0, 8.0)  # almost all ties at 0: the sample sees only zeros
    compressor = TopKCompressor(0.01)
    _, indices = compressor.compress(flat)
    assert indices.numel() == compressor.k(flat.numel()) == 2000
    assert set(range(7)) <= set(indices.tolist())


def test_topk_decompress_sums_pairs_gathered_from_two_ranks():
    values = torch.tensor([1.0, 2.0, 10.0, 20.0])
    indices = torch.tensor([0, 3, 3, 5], dtype=torch.int32)  # rank 0: (0, 3), rank 1: (3, 5)
    dense = TopKCompressor.decompress(values, indices, 6)
    assert dense.tolist() == [1.0, 0.0, 0.0, 12.0, 0.0, 20.0]


def test_topk_error_feedback_loses_nothing():
    """After any number of steps: everything sent + the residual == every gradient summed."""
    compressor, memory = TopKCompressor(0.05), ResidualMemory()
    generator = torch.Generator().manual_seed(0)
    total_grad, total_sent = torch.zeros(1000), torch.zeros(1000)
    for _ in range(5):
        grad = torch.randn(1000, generator=generator)
        total_grad += grad
        compensated = memory.compensate("w", grad)
        values, indices = compressor.compress(compensated)
        memory.forget_at("w", indices)
        total_sent += TopKCompressor.decompress(values, indices, 1000)
    torch.testing.assert_close(total_sent + memory.residuals["w"], total_grad)


def test_topk_rejects_bad_density():
    with pytest.raises(ValueError, match="density"):
        TopKCompressor(0.0)


def test_powersgd_compressible_matrices():
    compressor = PowerSGDCompressor(rank=4)
    assert compressor.matrix_shape(torch.Size([512, 256, 3, 3])) == (512, 2304)
    assert compressor.compressible(torch.Size([512, 256, 3, 3]))
    assert not compressor.compressible(torch.Size([64, 3, 3, 3]))  # 1728 elements: sent dense
    assert not compressor.compressible(torch.Size([8, 600]))  # 4800 elements, factors 2 x 4 x 608: not 2x smaller
    assert not compressor.compressible(torch.Size([4096]))  # vectors are never matrices


def _powersgd_step(compressor, memories, grads, q_t):
    """One PowerSGD step of len(grads) ranks, averaging by hand where Horovod would all-reduce."""
    matrices = [m.compensate("w", g).view(g.shape) for m, g in zip(memories, grads)]
    rows, cols = grads[0].shape
    ps = [compressor.project_p([m], [q_t], torch.empty(rows * compressor.rank))[0] for m in matrices]
    p = compressor.orthonormalize_(torch.stack(ps).mean(0))
    q_ts = [compressor.project_q([m], [p], torch.empty(cols * compressor.rank))[0] for m in matrices]
    q_t = torch.stack(q_ts).mean(0)
    approximation = p @ q_t
    for memory in memories:
        memory.subtract("w", approximation)
    return approximation, q_t


def test_powersgd_factors_match_the_dense_products():
    compressor = PowerSGDCompressor(rank=2)
    generator = torch.Generator().manual_seed(0)
    matrices = [torch.randn(6, 5, generator=generator), torch.randn(4, 7, generator=generator)]
    q_ts = [torch.randn(2, 5, generator=generator), torch.randn(2, 7, generator=generator)]
    ps = compressor.project_p(matrices, q_ts, torch.empty(6 * 2 + 4 * 2))
    for m, q_t, p in zip(matrices, q_ts, ps):
        torch.testing.assert_close(p, m @ q_t.t())
    new_q_ts = compressor.project_q(matrices, ps, torch.empty(2 * 5 + 2 * 7))
    for m, p, q_t in zip(matrices, ps, new_q_ts):
        torch.testing.assert_close(q_t, p.t() @ m)


def test_powersgd_recovers_a_low_rank_average_with_warm_start():
    compressor = PowerSGDCompressor(rank=2)
    generator = torch.Generator().manual_seed(1)
    left, right = torch.randn(40, 2, generator=generator), torch.randn(2, 30, generator=generator)
    grads = [left @ right, 3 * left @ right]  # rank 2 on both ranks, average 2 * left @ right
    memories = [ResidualMemory(), ResidualMemory()]
    q_t = compressor.initial_q_t(30, torch.Generator().manual_seed(0))
    for _ in range(3):
        approximation, q_t = _powersgd_step(compressor, memories, grads, q_t)
    # Error feedback resends what earlier steps missed; once converged the approximation is exact.
    torch.testing.assert_close(approximation, 2 * left @ right, rtol=1e-4, atol=1e-4)


def test_powersgd_error_feedback_loses_nothing():
    compressor = PowerSGDCompressor(rank=1)
    generator = torch.Generator().manual_seed(2)
    memories = [ResidualMemory()]
    q_t = compressor.initial_q_t(8, torch.Generator().manual_seed(0))
    total_grad, total_sent = torch.zeros(10, 8), torch.zeros(10, 8)
    for _ in range(4):
        grad = torch.randn(10, 8, generator=generator)
        total_grad += grad
        approximation, q_t = _powersgd_step(compressor, memories, [grad], q_t)
        total_sent += approximation
    torch.testing.assert_close(total_sent + memories[0].residuals["w"].view(10, 8), total_grad, rtol=1e-5, atol=1e-5)
