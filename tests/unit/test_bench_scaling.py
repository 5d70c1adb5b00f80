"""benchmarks/model/scaling_model.py: per-worker bytes vs world size."""

import pytest
import torch

from benchmarks.model import scaling_model as scaling

SHAPES = {"conv": torch.Size([64, 64, 3, 3]), "fc": torch.Size([10, 512]), "bias": torch.Size([64]),
          "tiny": torch.Size([8, 3, 3, 3])}


def test_ring_allreduce_stays_under_twice_the_buffer_allgather_grows():
    packed, topk = scaling.Payload(1000), scaling.Payload(0, 100)
    assert packed.per_worker_bytes(2) == 1000 and packed.per_worker_bytes(1024) == pytest.approx(2 * 1023 / 1024 * 1000)
    assert topk.per_worker_bytes(2) == 100 and topk.per_worker_bytes(1024) == 1023 * 100
    assert scaling.crossover(packed, topk) == 21  # 2 (n-1)/n 1000 < (n-1) 100  <=>  n > 20


def test_payloads_computed_from_shapes():
    dense = scaling.computed_payload("dense", SHAPES)
    assert dense.allreduce_bytes == 4 * (36864 + 5120 + 64 + 216)
    packed = scaling.computed_payload("pactrain-0.9-fp16", SHAPES)
    # conv and fc are packed (3686 + 512 survivors); tiny is too small to pack; bias is never pruned
    assert packed.allreduce_bytes == 2 * (3686 + 512 + 216 + 64)
    topk = scaling.computed_payload("topk", SHAPES)
    assert topk.allgather_bytes == 8 * (369 + 52) and topk.allreduce_bytes == 4 * (64 + 216)
    powersgd = scaling.computed_payload("powersgd", SHAPES)
    # conv (64 x 576) and fc (10 x 512) are at least 2x smaller as rank-4 factors; bias and tiny go dense
    assert powersgd.allreduce_bytes == 4 * (4 * (64 + 576) + 4 * (10 + 512) + 64 + 216)


def test_table_has_a_row_per_world_size():
    text = scaling.table("m", {"dense": scaling.Payload(2_000_000)}, world_sizes=(2, 4), rate_mbit=100)
    assert "| 2 | 2.00 (0.160) |" in text and "| 4 | 3.00 (0.240) |" in text
