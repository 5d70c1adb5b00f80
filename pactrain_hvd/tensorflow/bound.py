"""``BoundTensors``: the variables a ``PacTrainState`` reduces and each one's plan.

The one record the state's members share: ``Binding`` adds variables to it, ``Maintenance`` changes
masks and plans in it, ``HorovodEngine`` reads it to communicate, and the state reports and saves from it.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from pactrain_hvd.tensorflow.compression import PacTrainCompressor
from pactrain_hvd.tensorflow.outer import OuterSync
from pactrain_hvd.tensorflow.pruning import Pruner, backing_variable
from pactrain_hvd.tensorflow.quantized import QuantizedReduction


class BoundTensors:
    """Bound variables by name and position, with each prunable one's codec and plan.

    Attributes:
        pruner: masks and ranking (``pruning.Pruner``), its variables by name.
        quantized: the quantized reduction of packed values (ternary, int3), or None.
        outer: with local steps, each variable's anchor and outer momentum; else None.
        names: bound variable names, in binding order (a variable's position indexes this list).
        positions: ``variable.ref()`` -> position.
        compressors: a prunable variable's ``PacTrainCompressor`` (mask, surviving indices, plan), by name.
        packed: by name, whether the plan packs its survivors (else the tensor travels dense).
        dense_bytes: by position, the bytes a dense all-reduce of its gradient would send.
        sent_bytes: by position, the bytes the last step sent (-1: not communicated), a variable.
        survivor_scales: by position, the factor the next zeroing applies to survivors, a variable.
    """

    def __init__(self, pruner: Pruner, quantized: QuantizedReduction | None, outer: OuterSync | None = None) -> None:
        self.pruner = pruner
        self.quantized = quantized
        self.outer = outer
        self.names: list[str] = []
        self.positions: dict[Any, int] = {}
        self.compressors: dict[str, PacTrainCompressor] = {}
        self.packed: dict[str, bool] = {}
        self.dense_bytes: dict[int, int] = {}
        with tf.init_scope():
            self.sent_bytes = tf.Variable(tf.zeros([0], tf.int64), shape=tf.TensorShape([None]), trainable=False,
                                          name="pactrain_sent_bytes")
            self.survivor_scales = tf.Variable(tf.ones([0]), shape=tf.TensorShape([None]), trainable=False,
                                               name="pactrain_survivor_scales")

    def add(self, name: str, variable: tf.Variable, compressor: PacTrainCompressor | None) -> None:
        """Bind one more variable; ``compressor``: its codec where it is prunable. Then ``resize``."""
        self.positions[variable.ref()] = len(self.names)
        self.names.append(name)
        self.pruner.variables[name] = variable
        if self.outer is not None:
            self.outer.track(name, variable)
        if compressor is not None:
            self.pruner.prunable_names.append(name)
            self.compressors[name] = compressor
            if self.quantized is not None:
                self.quantized.track(name)

    def resize(self) -> None:
        """Per-position variables sized to the bound variables (after ``add``): nothing sent, scales 1."""
        self.sent_bytes.assign(-tf.ones([len(self.names)], tf.int64))
        self.survivor_scales.assign(tf.ones([len(self.names)]))

    def compressor_of(self, variable: Any) -> PacTrainCompressor | None:
        """The codec of a bound prunable variable (or its backing variable); None otherwise."""
        position = self.positions.get(backing_variable(variable).ref())
        return None if position is None else self.compressors.get(self.names[position])
