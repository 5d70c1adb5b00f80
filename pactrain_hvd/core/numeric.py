"""Numbers as users pass them: Python numbers, numpy scalars, 0-d tensors of any framework."""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np


def _as_float(value: Any, dtype: str) -> float:
    """The Python float a user meant: a float32 ``0.9`` is 0.9, not 0.8999999761581421."""
    number = float(value)
    return number if "64" in dtype else float(str(np.float32(number)))


def plain_number(value: Any) -> Any:
    """A numpy scalar or 0-d tensor (torch, TF, numpy) as the Python int or float it holds; anything
    else unchanged, for the caller's own check to accept or refuse (bools stay bools)."""
    if isinstance(value, (bool, str)) or type(value) in (int, float):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return _as_float(value, str(getattr(value, "dtype", "float64")))
    shape, dtype = getattr(value, "shape", None), str(getattr(value, "dtype", ""))
    if shape is None or len(tuple(shape)) != 0 or "bool" in dtype:
        return value
    if "int" in dtype:
        return int(value)
    if "float" in dtype:
        return _as_float(value, dtype)
    return value
