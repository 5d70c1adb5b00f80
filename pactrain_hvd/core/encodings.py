"""Value encodings: how packed (surviving) values travel, one registry for every frontend.

Dense and unpruned tensors always travel as ``compression`` says; an encoding decides only the
packed buffer. The engines never ask for an encoding by name: they read its description here
(wire dtype, and for codes quantized at a held scale their levels each side of zero) and look its wire
dtype up in their own table of what their all-reduce carries. Adding an encoding is one entry below:
quantized codes of any level count share one codec per frontend.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class ValueEncoding:
    """``name``: the ``packed_values=`` value. ``wire``: the dtype name packed values are cast to before the
    all-reduce (None: as ``compression`` leaves them; DDP: the bucket's). ``levels``: for a quantized encoding,
    its stochastic integer codes in [-levels, levels] at a held scale, summed in int32 lanes, with error feedback
    (``core.lanes``); ``wire`` is then the dtype used where lanes do not pay (too many ranks). 0: not quantized."""

    name: str
    wire: str | None
    levels: int = 0

    @property
    def quantized(self) -> bool:
        return self.levels > 0

    @property
    def own_wire(self) -> bool:
        """Whether packed values travel otherwise than ``compression`` sends the tensor's dense values."""
        return self.wire is not None

    def check(self, op_name: str, grouped: bool) -> None:
        """With the reduction it goes with: quantized codes are summed (Average or Sum only), and each tensor's
        codes travel on their own, rounded at that tensor's held scale (no groups)."""
        if self.quantized and op_name not in ("Average", "Sum"):
            raise ValueError(f"packed_values={self.name!r} sums integer codes: op must be hvd.Average or hvd.Sum, "
                             f"got {op_name}")
        if self.quantized and grouped:
            raise ValueError(f"packed_values={self.name!r} cannot be combined with groups: each tensor's codes "
                             "travel on their own, rounded at that tensor's held scale")

    def reported(self, lanes_fit: bool) -> str:
        """What ``stats()["values"]`` says: a quantized encoding reports its fallback wire where lanes do not fit."""
        return _BY_WIRE[self.wire] if self.quantized and not lanes_fit else self.name

    def wire_of(self, carried: Mapping[str | None, object], frontend: str) -> object:
        """This encoding's entry in a frontend's table ``{wire dtype name: what carries it}``; a clear error where
        that frontend's all-reduce cannot carry the dtype."""
        if self.wire not in carried:
            shown = ", ".join(name for name in carried if name)
            raise ValueError(f"packed_values={self.name!r} sends {self.wire} values, which the all-reduce of {frontend} "
                             f"does not carry (it carries {shown} besides the gradient's own dtype): use 'fp16'")
        return carried[self.wire]


ENCODINGS: dict[str, ValueEncoding] = {encoding.name: encoding for encoding in (
    ValueEncoding("inherit", None),
    ValueEncoding("fp16", "float16"),
    ValueEncoding("bf16", "bfloat16"),
    ValueEncoding("ternary", "float16", levels=1),
    ValueEncoding("int3", "float16", levels=3),
)}
PACKED_VALUES = tuple(ENCODINGS)
_BY_WIRE = {encoding.wire: name for name, encoding in ENCODINGS.items() if not encoding.quantized}


def packed_values_argument(packed_values: str, values: str | None = None, stacklevel: int = 3) -> str:
    """``packed_values=``, or the deprecated ``values=`` it replaces, checked: a key of ``ENCODINGS``. Their old ``"fp32"`` never
    meant fp32 (with ``Compression.fp16`` it sent fp16) but "as ``compression`` says", so it reads ``"inherit"``.
    Deprecation warnings point ``stacklevel`` frames up: at the façade's caller."""
    if values is not None:
        if packed_values != "inherit":
            raise ValueError(f"give packed_values= or the deprecated values=, not both (got {packed_values!r} "
                             f"and {values!r})")
        warnings.warn("values= is deprecated: use packed_values= (its 'fp32' is now 'inherit')",
                      DeprecationWarning, stacklevel=stacklevel)
        packed_values = values
    if packed_values == "fp32":
        warnings.warn("packed_values='fp32' is deprecated: it is 'inherit' (values travel as compression says)",
                      DeprecationWarning, stacklevel=stacklevel)
        packed_values = "inherit"
    if not isinstance(packed_values, str) or packed_values not in ENCODINGS:
        raise ValueError(f"packed_values must be one of {', '.join(map(repr, PACKED_VALUES))}, got {packed_values!r}")
    return packed_values
