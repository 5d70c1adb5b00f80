"""Quantized lanes in TF ops, following the digit layout of ``pactrain_hvd.core.lanes``.

Mirrors the numpy reference functions there, vectorised: codes reshaped to ``[words, lanes]``,
weighted by the digits' powers and summed; summed words divided by the powers, modulo the radix.
Every function takes a ``core.lanes.LaneLayout`` (the world size known when the graph is traced) or a
``TensorLayout`` (the world size read when the graph runs, as Horovod elastic needs:
``layout_for(hvd.size_op())``).
"""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

from pactrain_hvd.core.lanes import STEP_OVER_MEAN, WORD_LIMIT, LaneLayout, lane_layout


class TensorLayout(NamedTuple):
    """``core.lanes.LaneLayout`` as int32 scalars computed in the graph (``levels`` stays a Python int)."""

    world_size: tf.Tensor
    radix: tf.Tensor
    lanes: tf.Tensor
    levels: int = 1

    @property
    def offset(self) -> int:
        return self.levels


def layout_for(world_size: int | tf.Tensor, levels: int = 1) -> LaneLayout | TensorLayout:
    """The layout of ``core.lanes.lane_layout``; a ``TensorLayout`` when ``world_size`` is a tensor."""
    if isinstance(world_size, int):
        return lane_layout(world_size, levels)
    world_size = tf.cast(world_size, tf.int32)
    radix = 2 * levels * world_size + 1
    # The most digits k with radix ** k <= 2 ** 31; at most 19 (radix 3), and float64 powers are exact up to 2 ** 53.
    powers = tf.pow(tf.cast(radix, tf.float64), tf.range(1, 20, dtype=tf.float64))
    return TensorLayout(world_size, radix, tf.reduce_sum(tf.cast(powers <= WORD_LIMIT, tf.int32)), levels)


def _powers(layout: LaneLayout | TensorLayout) -> tf.Tensor:
    if isinstance(layout, LaneLayout):
        return tf.constant(layout.powers, tf.int32)
    return tf.math.cumprod(tf.fill([layout.lanes], layout.radix), exclusive=True)


def local_scale(values: tf.Tensor, levels: int = 1) -> tf.Tensor:
    """This rank's proposal for the tensor's scale, 0 for no values (see core ``local_scale``)."""
    mean = tf.math.divide_no_nan(tf.reduce_sum(tf.abs(values)), tf.cast(tf.size(values), values.dtype))
    return levels * STEP_OVER_MEAN * mean


def stochastic_codes(values: tf.Tensor, scale: tf.Tensor, noise: tf.Tensor, levels: int = 1) -> tf.Tensor:
    """Codes in [-levels, levels] at the step ``scale / levels``, as int8 (see core ``stochastic_codes``)."""
    step = scale / float(levels)
    magnitude = tf.abs(values)
    whole = tf.floor(tf.math.divide_no_nan(magnitude, step))
    up = tf.cast(noise * step < magnitude - whole * step, values.dtype)
    return tf.cast(tf.sign(values) * tf.minimum(whole + up, float(levels)), tf.int8)


def pack_codes(codes: tf.Tensor, layout: LaneLayout | TensorLayout) -> tf.Tensor:
    """Codes (each < ``layout.radix``) -> int32 words, ``layout.lanes`` digits per word."""
    codes = tf.reshape(tf.cast(codes, tf.int32), [-1])
    count = tf.size(codes)
    lanes = tf.convert_to_tensor(layout.lanes, tf.int32)
    padded = tf.pad(codes, [[0, (count + lanes - 1) // lanes * lanes - count]])
    return tf.reduce_sum(tf.reshape(padded, [-1, lanes]) * _powers(layout), axis=1)


def unpack_lanes(words: tf.Tensor, layout: LaneLayout | TensorLayout, count: int | tf.Tensor) -> tf.Tensor:
    """int32 words (possibly summed over ranks) -> the first ``count`` digits, as int32."""
    digits = tf.math.floormod(tf.math.floordiv(tf.reshape(words, [-1, 1]), _powers(layout)), layout.radix)
    return tf.reshape(digits, [-1])[:count]


def encode(codes: tf.Tensor, layout: LaneLayout | TensorLayout) -> tf.Tensor:
    """Codes in [-levels, levels] -> int32 words of biased codes."""
    return pack_codes(tf.cast(codes, tf.int32) + layout.offset, layout)


def decode(words: tf.Tensor, layout: LaneLayout | TensorLayout, count: int | tf.Tensor) -> tf.Tensor:
    """Words summed over ``layout.world_size`` ranks -> the sum of their codes, as int32."""
    return unpack_lanes(words, layout, count) - layout.offset * layout.world_size
