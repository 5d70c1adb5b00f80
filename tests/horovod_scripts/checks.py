"""What every compatibility script proves at its end, on every rank: ranks hold the same values (allgathered
and compared bitwise), and pruned coordinates hold exact zeros."""

from __future__ import annotations

import itertools
from typing import Any

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from pactrain_hvd.tensorflow.pruning import backing_variable, variable_names

_names = itertools.count()


def ranks_agree(values: dict[str, Any], what: str) -> None:
    """Raise naming every entry of ``values`` whose bits differ between ranks (every rank raises)."""
    different = []
    for name, value in values.items():
        flat = tf.reshape(tf.cast(tf.convert_to_tensor(value), tf.float64), [1, -1])
        gathered = hvd.allgather(flat, name=f"compat.check.{next(_names)}").numpy()
        if any(not np.array_equal(gathered[0], gathered[rank]) for rank in range(1, hvd.size())):
            different.append(name)
    if different:
        raise AssertionError(f"{what} differ between ranks: {different}")


def check(script: str, variables: list[Any], masks: dict[str, np.ndarray], sparsity: float,
          optimizer_variables: list[Any] = ()) -> None:
    """Ranks agree on ``variables`` (and ``optimizer_variables``) and on ``masks``; the masks prune ``sparsity``
    of their tensors' coordinates together (the default ranking spreads it unevenly), and pruned weights are 0;
    then one line per rank."""
    named = dict(zip(variable_names(variables), (backing_variable(v) for v in variables)))
    if not masks:
        raise AssertionError(f"{script}: nothing was pruned")
    pruned = sum(int((~mask).sum()) for mask in masks.values()) / sum(mask.size for mask in masks.values())
    if abs(pruned - sparsity) > 0.01:
        raise AssertionError(f"{script}: {pruned:.4f} of the pruned tensors' coordinates pruned, expected {sparsity}")
    for name, mask in masks.items():
        if np.asarray(named[name])[~mask].any():
            raise AssertionError(f"{script}: pruned weights of {name} are not 0")
    ranks_agree(named, "variables")
    ranks_agree({f"#{i}": v for i, v in enumerate(optimizer_variables)}, "optimizer variables")
    ranks_agree({name: mask.astype(np.int8) for name, mask in masks.items()}, "masks")
    print(f"{script}: rank {hvd.rank()} agrees on {len(named)} variables and {len(masks)} masks, "
          f"pruned zeros kept", flush=True)
