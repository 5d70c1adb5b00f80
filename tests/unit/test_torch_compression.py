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


def flip_a_byte_of_the_largest_tensor(path):
    """Change one byte inside the data of the file's largest stored tensor (stored uncompressed in the zip)."""
    import zipfile

    with zipfile.ZipFile(path) as archive:
        info = max((i for i in archive.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    data = bytearray(path.read_bytes())
    name_length, extra_length = int.from_bytes(data[info.header_offset + 26:info.header_offset + 28], "little"), \
        int.from_bytes(data[info.header_offset + 28:info.header_offset + 30], "little")
    start = info.header_offset + 30 + name_length + extra_length
    data[start + info.file_size // 2] ^= 0x40
    path.write_bytes(bytes(data))


def test_a_checkpoint_whose_content_changed_is_refused_naming_the_file(tmp_path):
    from pactrain_hvd.torch import CheckpointError, load_checkpoint, save_checkpoint

    path = tmp_path / "ckpt.pt"
    state = {"model": {"w": torch.arange(4096.0), "b": torch.zeros(3, dtype=torch.bfloat16)}, "step": 7,
             "pactrain": {"masks": [torch.ones(5, dtype=torch.uint8)], "settings": {"sparsity": 0.9}}}
    save_checkpoint(path, state)
    loaded = load_checkpoint(path)
    assert "pactrain_digest" not in loaded and torch.equal(loaded["model"]["w"], state["model"]["w"])
    assert "pactrain_digest" in torch.load(path)  # what a plain torch.load sees
    flip_a_byte_of_the_largest_tensor(path)
    assert not torch.equal(torch.load(path)["model"]["w"], state["model"]["w"])  # torch.load alone does not notice
    with pytest.raises(CheckpointError, match=r"ckpt.pt' does not match the digest it was saved with"):
        load_checkpoint(path)


def test_a_checkpoint_without_a_digest_still_loads_and_a_foreign_file_is_named(tmp_path):
    import numpy as np

    from pactrain_hvd.torch import CheckpointError, load_checkpoint

    old = tmp_path / "old.pt"
    torch.save({"step": 3, "w": torch.ones(2)}, old)  # as checkpoints were written before digests
    assert load_checkpoint(old)["step"] == 3
    npz = tmp_path / "state.npz"
    np.savez(npz, step=np.int64(3))
    with pytest.raises(CheckpointError, match="NumPy .npz archive .*not a torch checkpoint"):
        load_checkpoint(npz)


LAYOUTS = {  # dense but not contiguous: the gradient of a parameter in that memory format
    "channels_last": ((8, 4, 3, 3), lambda t: t.to(memory_format=torch.channels_last)),
    "channels_last_3d": ((8, 4, 2, 3, 3), lambda t: t.to(memory_format=torch.channels_last_3d)),
    "permuted": ((8, 4, 3, 3), lambda t: t.permute(2, 3, 0, 1).contiguous().permute(2, 3, 0, 1)),
}
SYNCING = ("item", "tolist", "cpu", "numpy", "__int__", "__float__", "__bool__", "nonzero")


@pytest.mark.parametrize("plan", ["packed", "dense-plan", "unmasked"])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_permuted_gradients_travel_in_mask_order_and_come_back_in_their_own_storage(layout, plan, monkeypatch):
    shape, to_layout = LAYOUTS[layout]
    generator = torch.Generator().manual_seed(0)
    mask = None if plan == "unmasked" else torch.rand(shape, generator=generator) < 0.3  # ~70 % pruned
    values = torch.randn(shape, generator=generator)
    grad, reference = to_layout(values.clone()), values.clone()
    assert not grad.is_contiguous() and torch.equal(grad, reference)
    compressor = PacTrainCompressor(mask, packed=plan == "packed")
    wire, ctx = compressor.compress(grad)
    expected_wire, expected_ctx = PacTrainCompressor(mask, packed=plan == "packed").compress(reference)
    assert wire.is_contiguous() and torch.equal(wire, expected_wire)  # the wire does not depend on the layout
    storage, strides = grad.data_ptr(), grad.stride()

    calls = []
    for method in SYNCING:  # once the positions are known, a step reads nothing back to the host
        original = getattr(torch.Tensor, method)
        monkeypatch.setattr(torch.Tensor, method,
                            lambda self, *args, _original=original, _method=method: calls.append(_method) or
                            _original(self, *args))
    assert torch.equal(compressor.gather(grad), wire)
    restored = compressor.decompress(wire * 2, ctx)  # as if a Sum over two equal ranks
    monkeypatch.undo()
    assert calls == []

    assert restored is grad and restored.data_ptr() == storage and restored.stride() == strides
    expected = compressor.decompress(expected_wire * 2, expected_ctx)
    assert expected.is_contiguous() and torch.equal(restored, expected)
    if mask is not None:
        assert torch.all(restored[~mask] == 0) and torch.equal(restored[mask], values[mask] * 2)
    if plan == "packed":  # survivors' storage positions: found once, for the one layout
        assert list(compressor._positions_by_stride) == [strides]


def test_channels_last_conv_gradient_keeps_its_memory_format():
    generator = torch.Generator().manual_seed(1)
    mask = torch.rand(8, 4, 3, 3, generator=generator) < 0.3
    grad = torch.randn(8, 4, 3, 3, generator=generator).to(memory_format=torch.channels_last)
    contiguous = grad.contiguous()
    compressor = PacTrainCompressor(mask, value_compression=hvd.Compression.fp16)
    wire, ctx = compressor.compress(grad)
    restored = compressor.decompress(wire, ctx)
    assert restored.is_contiguous(memory_format=torch.channels_last) and restored.data_ptr() == grad.data_ptr()
    assert torch.equal(restored, PacTrainCompressor(mask, value_compression=hvd.Compression.fp16).decompress(
        *PacTrainCompressor(mask, value_compression=hvd.Compression.fp16).compress(contiguous)))
    assert torch.all(restored[~mask] == 0) and torch.equal(restored[mask], contiguous[mask].half().float())


def test_contiguous_gradients_keep_the_plain_path():
    generator = torch.Generator().manual_seed(2)
    mask = torch.rand(16, 9, generator=generator) < 0.1
    grad = torch.randn(16, 9, generator=generator)
    original = grad.clone()
    compressor = PacTrainCompressor(mask)
    wire, ctx = compressor.compress(grad)
    assert torch.equal(wire, original.reshape(-1).index_select(0, mask.reshape(-1).nonzero().squeeze(1)))
    restored = compressor.decompress(wire, ctx)
    assert restored is grad and restored.is_contiguous()
    assert torch.equal(restored, original.masked_fill(~mask, 0))
    assert compressor._positions_by_stride == {}  # nothing computed for the contiguous layout


def test_gradients_that_are_not_dense_come_back_as_a_new_contiguous_tensor():
    generator = torch.Generator().manual_seed(3)
    mask = torch.rand(8, 4, 3, 3, generator=generator) < 0.3
    parent = torch.randn(8, 6, 3, 3, generator=generator)
    sliced, expanded = parent[:, 1:5], torch.randn(1, 4, 3, 3, generator=generator).expand(8, 4, 3, 3)
    untouched = parent.clone()
    for grad in (sliced, expanded):
        logical = grad.clone()
        compressor = PacTrainCompressor(mask)
        wire, ctx = compressor.compress(grad)
        assert torch.equal(wire, logical[mask])
        restored = compressor.decompress(wire * 2, ctx)
        assert restored.is_contiguous() and restored.data_ptr() != grad.data_ptr()
        assert torch.equal(restored, (logical * 2).masked_fill(~mask, 0))
        assert compressor._positions_by_stride == {grad.stride(): None}
    assert torch.equal(parent, untouched), "the parent of a sliced gradient is not written"
