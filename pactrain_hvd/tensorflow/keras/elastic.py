"""Horovod elastic for Keras: ``ptk.elastic.KerasState`` in place of ``hvd.elastic.KerasState``.

Horovod's ``KerasState`` commits, restores and broadcasts the model's variables and
``optimizer.variables()``. With ``ptk.DistributedOptimizer`` that is not enough, and under Keras 3
it does not start at all:

- masks and schedule position live in the optimizer's ``PacTrainState``, not in its variables,
  so a rollback would keep the masks of the uncommitted steps;
- Keras 3's ``optimizer.variables`` is a list, and Horovod calls it (``TypeError: 'list' object
  is not callable``, measured with Horovod 0.28.1);
- a worker that just joined has an unbuilt optimizer (no slots yet), so its variable list would
  not match the survivors' in the broadcast;
- a model Keras builds at its first batch (a ``Sequential`` without ``Input``) has no weights when
  the state is made, and Horovod's state refuses it.

This subclass saves and restores the ``PacTrainState`` with the model, builds the optimizer when
the state is made, and broadcasts masks and schedule position with the variables at every sync.
With ``ptk.DistributedOptimizer`` the model may be unbuilt: a sync before its weights exist
broadcasts them inside the first step's reduction, before masks are ranked
(``broadcast_variables_at_next_reduction``), so every rank takes rank 0's weights and ranks its
first masks on them at the same step.
The rest is Horovod's: ``hvd.elastic.run``, ``state.commit()``, the Keras elastic callbacks.
"""

from __future__ import annotations

import warnings
from typing import Any

import horovod.tensorflow as hvd
import horovod.tensorflow.keras.elastic as hvd_elastic
import tensorflow as tf
from horovod.common.elastic import ObjectState

from pactrain_hvd.core import WorldSizeChangedWarning
from pactrain_hvd.tensorflow.functions import broadcast_masks, broadcast_variables_at_next_reduction, state_of
from pactrain_hvd.tensorflow.pruning import backing_variable, build_optimizer, optimizer_variables


def _is_built(model: Any) -> bool:
    """Whether the model's weights exist (a ``Sequential`` without ``Input`` gets them at its first call)."""
    return bool(getattr(model, "built", True))


class KerasState(hvd_elastic.KerasState):
    """``hvd.elastic.KerasState`` that also carries ``ptk.DistributedOptimizer``'s masks and schedule.

    Works with any Keras 3 or tf-keras 2 optimizer (without PacTrain it is Horovod's state, made to
    work under Keras 3). Build the model first, as Horovod requires, or use ``ptk.DistributedOptimizer``:
    its reduction broadcasts the weights of a model built by its first batch.

    Example::

        >>> opt = ptk.DistributedOptimizer(keras.optimizers.SGD(0.01, momentum=0.9), sparsity=0.9)
        >>> state = ptk.elastic.KerasState(model, opt, epoch=0)     # was hvd.elastic.KerasState
        >>> @hvd.elastic.run
        ... def train(state): ...
    """

    def __init__(self, model: Any, optimizer: Any = None, **kwargs: Any) -> None:
        optimizer = optimizer or model.optimizer
        if optimizer is None:
            raise ValueError("KerasState needs an optimizer: pass optimizer= or compile the model first")
        self._pactrain = state_of(optimizer)
        self._saved_pactrain: bytes | None = None
        if _is_built(model):
            with tf.init_scope():
                build_optimizer(optimizer, model.trainable_variables)  # same variables on every rank, joined or not
            super().__init__(model, optimizer=optimizer, **kwargs)
        elif self._pactrain is None:
            raise ValueError("Model must be built first (run `model.build(input_shape)`), or use "
                             "ptk.DistributedOptimizer, which broadcasts a model built by its first batch")
        else:  # Horovod's __init__ less its check: weights and optimizer slots come with the first batch
            self.model, self.optimizer, self.backend = model, optimizer, None
            self._save_model()
            ObjectState.__init__(self, bcast_object=hvd.broadcast_object, get_rank=hvd.rank, **kwargs)
        self._bcast_model = self._broadcast  # Horovod's calls optimizer.variables(), a list under Keras 3

    def _variables(self) -> tuple[list[tf.Variable], list[tf.Variable]]:
        """The model's (none before it is built) and the optimizer's variables, as ``tf.Variable`` (Horovod
        needs ``ref()``)."""
        return ([backing_variable(v) for v in self.model.variables] if _is_built(self.model) else [],
                [backing_variable(v) for v in optimizer_variables(self.optimizer)])

    def _broadcast(self) -> None:
        if not _is_built(self.model):  # every rank syncs here, before the first batch builds the model
            broadcast_masks(self._pactrain, root_rank=0)
            broadcast_variables_at_next_reduction(
                self._pactrain, 0, lambda: [*self.model.variables, *optimizer_variables(self.optimizer)])
            return
        for variables in self._variables():
            hvd.broadcast_variables(variables, root_rank=0)
        if self._pactrain is not None:
            broadcast_masks(self._pactrain, root_rank=0)

    def _save_model(self) -> None:
        self._saved_model_state, self._saved_optimizer_state = (
            [tf.identity(v) for v in variables] for variables in self._variables())
        if self._pactrain is not None:
            self._saved_pactrain = self._pactrain.serialize()

    def _load_model(self) -> None:
        if len(self._saved_model_state) != len(self._variables()[0]):
            # committed before the first batch built the model: nothing to roll back to; the next sync
            # gives every rank rank 0's variables, masks and schedule position
            return
        for saved, variables in zip((self._saved_model_state, self._saved_optimizer_state), self._variables()):
            for variable, value in zip(variables, saved):
                variable.assign(value)
        if self._pactrain is not None:
            with warnings.catch_warnings():  # a rollback after a worker loss: the world size did change
                warnings.simplefilter("ignore", WorldSizeChangedWarning)
                self._pactrain.deserialize(self._saved_pactrain)
