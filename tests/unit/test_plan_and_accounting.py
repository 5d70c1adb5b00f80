import pytest

from pactrain_hvd.core import PacTrainConfig, StepStats, TensorStats, ring_allreduce_bytes, should_pack


def test_plan_packs_only_large_sparse_tensors():
    assert should_pack(100_000, 10_000)
    assert not should_pack(100_000, 90_000)  # too dense to pay
    assert not should_pack(100, 10)  # too small to pay
    assert should_pack(100, 10, min_numel=0)


def test_ring_allreduce_bytes():
    assert ring_allreduce_bytes(1000, 1) == 0
    assert ring_allreduce_bytes(1000, 2) == 1000
    assert ring_allreduce_bytes(1000, 4) == 1500


def test_step_stats_sum_tensors():
    stats = StepStats(step=3, tensors={
        "w": TensorStats(numel=1000, kept=100, packed=True, sent_bytes=400, dense_bytes=4000),
        "b": TensorStats(numel=10, kept=10, packed=False, sent_bytes=40, dense_bytes=40),
    })
    report = stats.as_dict()
    assert report["sent_bytes"] == 440 and report["dense_bytes"] == 4040
    assert report["compression_ratio"] == pytest.approx(4040 / 440)
    assert report["tensors"]["w"]["density"] == pytest.approx(0.1)


@pytest.mark.parametrize("kwargs, message", [
    (dict(sparsity=1.0), "sparsity must be in"),
    (dict(sparsity="0.9"), "sparsity must be a number"),
    (dict(end_step=-1), "end_step"),
    (dict(frequency=0), "frequency"),
    (dict(ranking="row"), "ranking"),
    (dict(pack_max_density=0.0), "pack_max_density"),
    (dict(verify_every=-1), "verify_every"),
])
def test_config_rejects_bad_values(kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        PacTrainConfig.from_arguments(**kwargs)
