"""PacTrainCompressor alone: pack then unpack is the identity on survivors and zero elsewhere."""

import horovod.torch as hvd
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pactrain_hvd.torch import PacTrainCompressor

shapes = st.lists(st.integers(0, 6), min_size=0, max_size=3).map(tuple)


@settings(max_examples=60, deadline=None)
@given(shape=shapes, density=st.floats(0, 1), dtype=st.sampled_from([torch.float16, torch.float32, torch.float64]),
       transpose=st.booleans(), seed=st.integers(0, 2**16))
def test_pack_unpack_identity_on_survivors(shape, density, dtype, transpose, seed):
    generator = torch.Generator().manual_seed(seed)
    tensor = torch.randn(shape, generator=generator).to(dtype)
    if transpose and tensor.dim() >= 2:
        tensor = tensor.transpose(0, 1)  # non-contiguous input
    mask = torch.rand(tensor.shape, generator=generator) < density
    original = tensor.clone()
    compressor = PacTrainCompressor(mask)
    wire, ctx = compressor.compress(tensor)
    assert wire.dim() == 1 and wire.numel() == int(mask.sum()) and wire.dtype == dtype
    assert torch.equal(wire, original.reshape(-1)[mask.reshape(-1)])
    restored = compressor.decompress(wire * 2, ctx)  # as if a Sum over two equal ranks
    assert restored.shape == original.shape and restored.dtype == dtype
    assert torch.equal(restored[mask], original[mask] * 2)
    assert torch.all(restored[~mask] == 0)


def test_fp16_values_halve_the_bytes_and_come_back_as_fp32():
    tensor = torch.linspace(-1, 1, 1000).reshape(10, 100)
    mask = tensor.abs() > 0.9
    compressor = PacTrainCompressor(mask, value_compression=hvd.Compression.fp16)
    wire, ctx = compressor.compress(tensor.clone())
    assert wire.dtype == torch.float16 and wire.numel() * wire.element_size() == 2 * int(mask.sum())
    restored = compressor.decompress(wire, ctx)
    assert restored.dtype == torch.float32
    torch.testing.assert_close(restored[mask], tensor[mask], rtol=1e-3, atol=1e-3)


def test_bf16_gradients_travel_as_fp32_or_fp16():
    tensor = torch.randn(64, 64).to(torch.bfloat16)
    mask = torch.rand(64, 64) < 0.1
    wire, ctx = PacTrainCompressor(mask).compress(tensor.clone())
    assert wire.dtype == torch.float32  # Horovod's torch all-reduce has no bf16
    restored = PacTrainCompressor(mask).decompress(wire, ctx)
    assert restored.dtype == torch.bfloat16 and torch.equal(restored[mask], tensor[mask])
    wire16, _ = PacTrainCompressor(mask, value_compression=hvd.Compression.fp16).compress(tensor)
    assert wire16.dtype == torch.float16


def test_dense_plan_zeroes_pruned_coordinates_and_unmasked_is_untouched():
    tensor = torch.arange(1.0, 7.0).reshape(2, 3)
    mask = torch.tensor([[True, False, True], [False, True, True]])
    wire, ctx = PacTrainCompressor(mask, packed=False).compress(tensor.clone())
    assert wire.shape == (2, 3)
    np.testing.assert_array_equal(wire.numpy(), [[1, 0, 3], [0, 5, 6]])
    untouched, _ = PacTrainCompressor(None).compress(tensor)
    assert untouched is tensor


def test_wrong_mask_is_rejected_with_its_shape():
    with pytest.raises(TypeError, match="bool"):
        PacTrainCompressor(torch.ones(3))
    with pytest.raises(ValueError, match=r"shape \(2,\) does not fit mask of shape \(3,\)"):
        PacTrainCompressor(torch.ones(3, dtype=torch.bool)).compress(torch.ones(2))


def test_checkpoints_are_atomic_and_damage_is_named(tmp_path):
    from pactrain_hvd.torch import CheckpointError, load_checkpoint, save_checkpoint

    path = tmp_path / "ckpt.pt"
    save_checkpoint(path, {"weights": torch.arange(1000.0), "step": 7})
    assert load_checkpoint(path)["step"] == 7
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]  # no temporary left behind
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        load_checkpoint(path)
    with pytest.raises(CheckpointError, match="no checkpoint at"):
        load_checkpoint(tmp_path / "missing.pt")
    with pytest.raises((TypeError, AttributeError)):  # pickling a lambda fails mid-write
        save_checkpoint(path, {"unpicklable": lambda: None})
    assert path.read_bytes() == data[: len(data) // 2]  # a failed save leaves the old file as it was
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]
