"""Quantized values for packed tensors (ternary, int3): what each rank remembers between steps, and how they travel.

As in ``pactrain_hvd.torch.quantized``: ``ErrorFeedback`` (``memory.py``) is the memory,
``QuantizedReduction`` moves the values. Each tensor's codes are rounded at a scale every rank
already holds (the previous step's MAX over ranks of ``local_scale``, a multiple of each rank's
mean ``|value|``, in a variable), so its lane-packed int32 words go through an ordinary SUM
all-reduce that waits for nothing but its own gradient; beside it, a MAX all-reduce of this step's
``local_scale`` gives the next step's scale. Where no scale is held yet (NaN: the first step, a
checkpoint without scales) a ``tf.cond`` takes this step's MAX instead; both branches issue the
same collectives. Everything is graph ops reading TF variables, so a traced step follows mask and
plan changes without retracing: ``PacTrainState`` runs the ternary reduction of a tensor inside a
``tf.cond`` on its plan (only packed values are quantized).
"""

from __future__ import annotations

import os

import horovod.tensorflow as hvd
import tensorflow as tf

from pactrain_hvd.core.lanes import SCALE_BYTES
from pactrain_hvd.core.quantized import noise_key
from pactrain_hvd.tensorflow.compression import PacTrainCompressor
from pactrain_hvd.tensorflow.lanes import decode, encode, layout_for, local_scale, stochastic_codes
from pactrain_hvd.tensorflow.memory import ErrorFeedback


class QuantizedReduction:
    """Stochastic quantized all-reduce of packed tensors at held scales, with error feedback (``levels`` levels
    each side of 0: 1 for ternary values).

    The lane layout and the average's divisor use the world size as Horovod's own average does:
    read when the graph runs under Horovod elastic (``hvd.size_op``), else when it is traced.

    Example::

        >>> reduction = QuantizedReduction(hvd.global_process_set)
        >>> reduction.track(name)                                       # once per prunable tensor
        >>> ternary = lambda: reduction.allreduce(name, compressor, grad, True, grad.dtype, "words")
        >>> grad, sent = tf.cond(tf.equal(compressor.plan, PACKED), ternary, plain)   # plain: not packed
    """

    def __init__(self, process_set: hvd.ProcessSet, levels: int = 1) -> None:
        self.process_set = process_set
        self.levels = levels
        self.memory = ErrorFeedback()
        self.rank = process_set.rank()  # its rounding noise's (``core.quantized.noise_key``)
        self.scales: dict[str, tf.Variable] = {}  # per tensor, the scale of its next send; NaN: none held

    def track(self, name: str) -> None:
        self.memory.track(name)
        with tf.init_scope():
            self.scales[name] = tf.Variable(float("nan"), trainable=False, name="pactrain_scale")

    def hold_scales(self, scales: dict[str, float]) -> None:
        """Hold these scales (the same on every rank: a checkpoint's, or a broadcast's); none for the rest."""
        for name, variable in self.scales.items():
            variable.assign(scales.get(name, float("nan")))

    def world_size(self) -> int | tf.Tensor:
        if int(os.environ.get("HOROVOD_ELASTIC", 0)):
            return hvd.size_op(process_set_id=self.process_set.process_set_id)
        return self.process_set.size()

    def allreduce(self, name: str, compressor: PacTrainCompressor, grad: tf.Tensor, average: bool,
                  dtype: tf.DType, wire_name: str, step: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """Round the survivors plus their residual at the held scale, remember the error, SUM-reduce the words.
        ``step``: the schedule position (int64), for the rounding noise.

        Returns the reduced gradient (dense shape, ``dtype``) and the bytes handed to Horovod (the words,
        plus the tensor's scale in the MAX all-reduce). Where this step's MAX is not finite (an overflow on
        some rank) the gradient is NaN on every rank, so a loss scaler skips the step everywhere, and the
        held scale stays as it was.
        """
        value = self.memory.add(name, tf.cast(compressor.survivors(grad), tf.float32))
        local = local_scale(value, self.levels)  # not finite where a value is not: the mean of |values|
        local = tf.where(tf.math.is_finite(local), local, float("inf"))  # Horovod's MAX may drop NaN
        step_max = hvd.allreduce(tf.reshape(local, [1]), op=hvd.Max, name=f"{wire_name}_scale",
                                 process_set=self.process_set)[0]
        held = self.scales[name].read_value()
        none_held = tf.math.is_nan(held)
        scale = tf.cond(none_held, lambda: step_max, lambda: held)  # lowered: the held branch does not wait
        world_size = self.world_size()
        layout = layout_for(world_size, self.levels)
        count = tf.size(value)
        seed = tf.stack([tf.constant(noise_key(self.rank, name), tf.int64), tf.cast(step, tf.int64)])
        codes = stochastic_codes(value, scale, tf.random.stateless_uniform([count], seed, dtype=tf.float32),
                                 self.levels)
        self.memory.store(name, value, tf.cast(codes, tf.float32) * (scale / self.levels))
        words = encode(codes, layout)
        summed = hvd.allreduce(words, op=hvd.Sum, name=wire_name, process_set=self.process_set)
        finite = tf.math.is_finite(step_max)
        self.scales[name].assign(tf.where(finite, step_max, tf.where(none_held, 0.0, held)))
        divisor = (tf.cast(world_size, tf.float32) if average else 1.0) * self.levels
        scale = tf.where(finite, scale, float("nan"))
        reduced = tf.cast(tf.cast(decode(summed, layout, count), tf.float32) * scale / divisor, dtype)
        return compressor.unpack(reduced), tf.size(words, tf.int64) * words.dtype.size + SCALE_BYTES
