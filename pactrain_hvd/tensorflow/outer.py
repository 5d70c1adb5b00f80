"""``OuterSync``: the anchor weights and outer momentum of local steps (``pactrain_hvd.core.local_steps``).

As torch's ``OuterSync``, as TF variables: the traced step takes the anchor at an interval's first step
and the outer step at its end with graph ops, so nothing is retraced.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from pactrain_hvd.core.local_steps import check_outer_entry, outer_update
from pactrain_hvd.tensorflow.pruning import safe_name


class OuterSync:
    """Per bound variable, the weights every rank held at the interval's start (the anchor) and the outer
    momentum; the same on every rank."""

    def __init__(self, lr: float, beta: float) -> None:
        self.lr = float(lr)
        self.beta = float(beta)
        self.variables: dict[str, tf.Variable] = {}
        self.anchor: dict[str, tf.Variable] = {}
        self.momentum: dict[str, tf.Variable] = {}

    def track(self, name: str, variable: tf.Variable) -> None:
        """``variable`` joins (call in ``tf.init_scope``); its anchor is taken at the next interval's first step."""
        slot = safe_name(name)
        self.variables[name] = variable
        self.anchor[name] = tf.Variable(tf.zeros(variable.shape, variable.dtype), trainable=False,
                                        name=f"pactrain_anchor_{slot}")
        self.momentum[name] = tf.Variable(tf.zeros(variable.shape, variable.dtype), trainable=False,
                                          name=f"pactrain_outer_momentum_{slot}")

    def take_anchor(self) -> tf.Tensor:
        """The weights now are the interval's anchor; graph-safe."""
        for name, variable in self.variables.items():
            self.anchor[name].assign(variable)
        return tf.constant(True)

    def outer_gradients(self) -> list[tf.Tensor]:
        """This rank's progress since the anchor, as a gradient (anchor minus weights), in binding order."""
        return [self.anchor[name] - variable for name, variable in self.variables.items()]

    def step(self, averaged: list[tf.Tensor]) -> None:
        """The outer step from the anchor on the ranks' averaged outer gradients; the weights become the anchor."""
        for (name, variable), gradient in zip(self.variables.items(), averaged):
            anchor, momentum = outer_update(self.anchor[name], self.momentum[name], tf.cast(gradient, variable.dtype),
                                            self.lr, self.beta)
            self.anchor[name].assign(anchor)
            self.momentum[name].assign(momentum)
            variable.assign(anchor)

    def zero_pruned(self, name: str, mask: tf.Variable) -> None:
        """Pruned coordinates are 0 in the anchor and the momentum too; graph-safe."""
        if name in self.anchor:
            for tensor in (self.anchor[name], self.momentum[name]):
                tensor.assign(tf.where(mask, tensor, tf.zeros_like(tensor)))

    # -- checkpoints: by name here, by position in the archive (``core.checkpoint.to_npz``) ----------
    def state_dict(self) -> dict[str, dict[str, np.ndarray]]:
        return {part: {name: tensor.numpy() for name, tensor in getattr(self, part).items()}
                for part in ("anchor", "momentum")}

    def load_state_dict(self, saved: dict) -> None:
        """Take a checkpoint's anchor and momentum (by bound name, ``validate``d)."""
        for part in ("anchor", "momentum"):
            for name, tensor in getattr(self, part).items():
                tensor.assign(saved[part][name])

    def validate(self, saved: object) -> None:
        """``CheckpointError`` unless ``saved`` holds an anchor and a momentum of every variable's shape."""
        check_outer_entry(saved, {name: tuple(variable.shape) for name, variable in self.variables.items()}, np.ndarray)

    def restart(self) -> None:
        """The weights now are the anchor, with no outer momentum (a checkpoint that holds neither). Variables a
        trace created hold no value before their step runs; that step, an interval's first, takes their anchor."""
        for name, variable in self.variables.items():
            if bool(variable.is_initialized()):
                self.anchor[name].assign(variable)
            self.momentum[name].assign(tf.zeros_like(self.momentum[name]))
