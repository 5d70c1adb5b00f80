"""Ternary values for packed tensors: what each rank remembers between steps, and how they travel.

As in ``pactrain_hvd.torch.ternary``: ``ErrorFeedback`` is the memory, ``TernaryReduction`` moves
the values: one MAX all-reduce agrees every tensor's scale, then each tensor's lane-packed int32
words go through an ordinary SUM all-reduce. Everything is graph ops reading TF variables, so a
traced step follows mask and plan changes without retracing: ``PacTrainState`` runs the ternary
reduction of a tensor inside a ``tf.cond`` on its plan (only packed values are quantized).
"""

from __future__ import annotations

import os

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from pactrain_hvd.core.lanes import SCALE_BYTES
from pactrain_hvd.tensorflow.compression import PACKED, PacTrainCompressor
from pactrain_hvd.tensorflow.lanes import decode, encode, layout_for, stochastic_ternary

_NOISE_SEED = 0x7E4A  # rounding noise: seeded with this plus the rank, so ranks draw independently


class ErrorFeedback:
    """Per tensor, the quantization error of the surviving values, added to the next step's values.

    Residuals have the packed length (one per surviving coordinate, none while the plan does not
    pack), in variables of unknown length (``shape=[None]``): a traced step reads whatever length
    the current mask gives, so a mask change needs no retrace. ``remap``, at every mask change,
    keeps the residual of the coordinates that survive (newly packed ones start at 0).
    """

    def __init__(self) -> None:
        self.residuals: dict[str, tf.Variable] = {}

    def track(self, name: str) -> None:
        with tf.init_scope():
            self.residuals[name] = tf.Variable(tf.zeros([0], tf.float32), shape=tf.TensorShape([None]),
                                               trainable=False, name="pactrain_residual")

    def add(self, name: str, values: tf.Tensor) -> tf.Tensor:
        return values + self.residuals[name].read_value()

    def store(self, name: str, values: tf.Tensor, dequantized: tf.Tensor) -> None:
        """This step's quantization error; none from a step that overflowed somewhere (a scale of inf), which
        mixed precision skips on every rank: the memory stays as it was, not inf or nan from then on."""
        error = values - dequantized
        residual = self.residuals[name]
        residual.assign(tf.where(tf.reduce_all(tf.math.is_finite(error)), error, residual.read_value()))

    def remap(self, name: str, old_indices: np.ndarray, new_indices: np.ndarray, numel: int) -> None:
        """Move ``name``'s residual from the old surviving coordinates to the new ones (eagerly)."""
        dense = np.zeros(numel, np.float32)
        dense[old_indices] = self.residuals[name].numpy()
        self.residuals[name].assign(dense[new_indices])


class NoiseSource:
    """Uniform [0, 1) noise for stochastic rounding, from a ``tf.random.Generator`` (state in a variable)."""

    def __init__(self, seed: int) -> None:
        with tf.init_scope():
            self.generator = tf.random.Generator.from_seed(seed)

    def uniform(self, count: tf.Tensor) -> tf.Tensor:
        return self.generator.uniform([count], dtype=tf.float32)


class TernaryReduction:
    """Shared-scale stochastic ternary all-reduce of packed tensors, with error feedback.

    The lane layout and the average's divisor use the world size as Horovod's own average does:
    read when the graph runs under Horovod elastic (``hvd.size_op``), else when it is traced.

    Example::

        >>> reduction = TernaryReduction(hvd.global_process_set)
        >>> values, scales = reduction.agree_scales([(name, grad, compressor)], "scales")   # one MAX all-reduce
        >>> ternary = lambda: reduction.allreduce(name, compressor, values[0], scales[0], True, grad.dtype, "words")
        >>> grad, sent = tf.cond(tf.equal(compressor.plan, PACKED), ternary, plain)   # plain: not packed
    """

    def __init__(self, process_set: hvd.ProcessSet) -> None:
        self.process_set = process_set
        self.memory = ErrorFeedback()
        self.noise = NoiseSource(_NOISE_SEED + process_set.rank())

    def world_size(self) -> int | tf.Tensor:
        if int(os.environ.get("HOROVOD_ELASTIC", 0)):
            return hvd.size_op(process_set_id=self.process_set.process_set_id)
        return self.process_set.size()

    def agree_scales(self, tensors: list[tuple[str, tf.Tensor, PacTrainCompressor]],
                     wire_name: str) -> tuple[list[tf.Tensor], list[tf.Tensor]]:
        """Per ``(name, gradient, compressor)``: the fp32 values to send (survivors plus residual; empty
        unless packed) and the scale every rank uses, ``max |value|`` over ranks (0 unless packed).

        One MAX all-reduce of a vector of all scales, skipped while no tensor is packed; every rank
        must call it with the same tensors (the plans are the same everywhere).
        """
        values = [self.memory.add(name, tf.cast(compressor.survivors(grad), tf.float32))
                  for name, grad, compressor in tensors]
        local = tf.stack([tf.maximum(tf.reduce_max(tf.abs(value)), 0.0) for value in values])  # empty: 0
        packed = tf.reduce_any(tf.stack([tf.equal(compressor.plan, PACKED) for _, _, compressor in tensors]))
        scales = tf.cond(packed, lambda: hvd.allreduce(local, op=hvd.Max, name=wire_name,
                                                       process_set=self.process_set), lambda: local)
        return values, tf.unstack(scales, num=len(tensors))

    def allreduce(self, name: str, compressor: PacTrainCompressor, value: tf.Tensor, scale: tf.Tensor, average: bool,
                  dtype: tf.DType, wire_name: str) -> tuple[tf.Tensor, tf.Tensor]:
        """Round ``value`` at ``scale``, remember the error, SUM-reduce the words; where the plan packs.

        Returns the reduced gradient (dense shape, ``dtype``) and the bytes handed to Horovod
        (the words, plus the tensor's scale in the MAX all-reduce).
        """
        world_size = self.world_size()
        layout = layout_for(world_size)
        count = tf.size(value)
        ternary = stochastic_ternary(value, scale, self.noise.uniform(count))
        self.memory.store(name, value, tf.cast(ternary, tf.float32) * scale)
        words = encode(ternary, layout)
        summed = hvd.allreduce(words, op=hvd.Sum, name=wire_name, process_set=self.process_set)
        divisor = tf.cast(world_size, tf.float32) if average else 1.0
        reduced = tf.cast(tf.cast(decode(summed, layout, count), tf.float32) * scale / divisor, dtype)
        return compressor.unpack(reduced), tf.size(words, tf.int64) * words.dtype.size + SCALE_BYTES
