"""TensorFlow's PacTrain state (a NumPy .npz blob) carries a digest of its content, checked when it is read."""

import io
import zipfile

import numpy as np
import pytest

from pactrain_hvd.core import CheckpointError
from pactrain_hvd.core.checkpoint import SavedState, from_npz, to_npz


def saved_state() -> SavedState:
    mask = np.zeros((64, 32), bool)
    mask[:, :8] = True
    return SavedState(step=12, masks={"dense/kernel": mask}, settings={"sparsity": 0.75}, world_size=2,
                      positions={"dense/kernel": 0})


def with_one_byte_flipped(blob: bytes, entry: str) -> bytes:
    """``blob`` with one byte in the middle of ``entry``'s stored data changed (np.savez stores uncompressed)."""
    with zipfile.ZipFile(io.BytesIO(blob)) as archive:
        info = archive.getinfo(entry)
    data = bytearray(blob)
    header = info.header_offset
    start = header + 30 + int.from_bytes(data[header + 26:header + 28], "little") \
        + int.from_bytes(data[header + 28:header + 30], "little")
    data[start + info.file_size - 10] ^= 0x01
    return bytes(data)


def test_the_state_round_trips_with_its_digest():
    parsed = from_npz(to_npz(saved_state()))
    assert parsed.step == 12 and parsed.settings == {"sparsity": 0.75}
    assert np.array_equal(parsed.masks["dense/kernel"], saved_state().masks["dense/kernel"])
    assert parsed.positions == {"dense/kernel": 0} and parsed.world_size == 2


def test_a_flipped_byte_in_a_mask_is_refused():
    """The archive's own CRC-32 catches a flip in place; the digest catches content rewritten into a sound archive."""
    blob = to_npz(saved_state())
    with pytest.raises(CheckpointError, match="Bad CRC-32 for file 'mask_0.npy'"):
        from_npz(with_one_byte_flipped(blob, "mask_0.npy"))
    with np.load(io.BytesIO(blob)) as archive:
        entries = {name: archive[name] for name in archive.files}
    entries["mask_0"][0, 20] = True  # one more survivor, in an archive whose checksums are all correct
    rewritten = io.BytesIO()
    np.savez(rewritten, **entries)
    with pytest.raises(CheckpointError, match="does not match the digest it was saved with"):
        from_npz(rewritten.getvalue())


def test_a_truncated_state_and_a_torch_file_name_this_frontends_format():
    blob = to_npz(saved_state())
    with pytest.raises(CheckpointError, match="a TensorFlow PacTrain state is a NumPy .npz archive"):
        from_npz(blob[: len(blob) // 2])
    assert "weights_only" not in str(pytest.raises(CheckpointError, from_npz, b"PK\x03\x04 not an archive").value)
