"""Collective helpers on a ``PacTrainState`` (Horovod's module name): find a holder's state, broadcast it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import horovod.tensorflow as hvd
import tensorflow as tf

from pactrain_hvd.core.agreement import check_settings, settings_rows
from pactrain_hvd.tensorflow.pruning import backing_variable, communicates, optimizer_variables, run_if, safe_name
from pactrain_hvd.tensorflow.state import PacTrainState


def state_of(holder: Any) -> PacTrainState | None:
    """The ``PacTrainState`` of a state, tape or optimizer, also inside a loss-scale optimizer (which Keras'
    ``compile`` puts around the optimizer under ``mixed_float16``); None if it has none."""
    for candidate in (holder, getattr(holder, "inner_optimizer", None)):
        state = getattr(candidate, "pactrain_state", candidate)
        if isinstance(state, PacTrainState):
            return state
    return None


def agree_settings(state: PacTrainState) -> None:
    """Compare every rank's PacTrain settings (collective): ``SettingsMismatchError`` on every rank, naming each
    differing setting and each rank's value, where they differ."""
    settings = state.shared_settings()
    per_rank = hvd.allgather_object(settings_rows(settings), name="pactrain.settings", process_set=state.process_set)
    check_settings(settings, per_rank)


def broadcast_masks(state: Any, root_rank: int = 0) -> None:
    """Give every rank ``root_rank``'s masks and schedule position (start and resume); collective.

    Use next to ``hvd.broadcast_variables``. Every rank's PacTrain settings are compared first. The Mask
    Tracker proves the result at the next step (not here: a rank that joined an elastic job may not be bound
    to its variables yet). Where the state does not communicate (``pruning.communicates``: outside its
    process set, or alone in it) this does nothing.

    Args:
        state: a ``PacTrainState``, or an optimizer or tape that has one (``.pactrain_state``), or a
            loss-scale optimizer around such an optimizer.
        root_rank: the rank whose masks and schedule position every rank takes.

    Raises:
        TypeError: ``state`` holds no ``PacTrainState``.
        SettingsMismatchError: the ranks' PacTrain settings differ (on every rank, naming each setting).
    """
    found = state_of(state)
    if found is None:
        raise TypeError(f"broadcast_masks needs a PacTrainState, or an optimizer or tape holding one, got "
                        f"{type(state).__name__}")
    state = found
    if not communicates(state.process_set):
        return
    agree_settings(state)  # before the root's checkpoint meets settings that may differ on this rank
    blob = hvd.broadcast_object(state.serialize(), root_rank, name="pactrain.state", process_set=state.process_set)
    state.deserialize(blob)
    state.request_verification()  # every rank of the process set is here


class _BroadcastAtNextReduction:
    """The broadcast ``broadcast_variables_at_next_reduction`` asked for: graph ops under a ``tf.cond`` on a
    flag every rank sets alike, so a traced step holds them and runs them once, then skips them."""

    def __init__(self, state: PacTrainState, root_rank: int, variables: Callable[[], Sequence[Any]] | None,
                 device: str, local: set[Any]) -> None:
        self.state = state
        self.root_rank = root_rank
        self.variables = variables
        self.device = device
        self.local = local
        with tf.init_scope():
            self.pending = tf.Variable(True, trainable=False, name="pactrain_broadcast_pending")

    def shared(self, reduced: Sequence[Any]) -> list[tf.Variable]:
        """What travels: ``variables()``, else the reduced variables and the state's optimizer's; once each."""
        chosen = list(self.variables()) if self.variables is not None else [
            *reduced, *optimizer_variables(self.state.optimizer)]
        unique: dict[Any, tf.Variable] = {}
        for variable in chosen:
            backing = backing_variable(variable)
            if backing.ref() not in self.local and not self.state.is_local(backing):
                unique.setdefault(backing.ref(), backing)
        return list(unique.values())

    @tf.autograph.experimental.do_not_convert
    def __call__(self, reduced: Sequence[Any]) -> tf.Tensor:
        variables = self.shared(reduced)

        def broadcast() -> tf.Tensor:
            with tf.device(self.device):
                for position, variable in enumerate(variables):
                    # Named: ops in tf.cond branches are not uniquified as ops of one graph are.
                    name = f"pactrain_broadcast_{position}_" + safe_name(variable.name)
                    variable.assign(hvd.broadcast(variable, self.root_rank, name=name,
                                                  process_set=self.state.process_set))
            self.pending.assign(False)
            return tf.constant(True)

        return run_if(self.pending.read_value(), broadcast)


def broadcast_variables_at_next_reduction(state: Any, root_rank: int = 0,
                                          variables: Callable[[], Sequence[Any]] | None = None,
                                          device: str = "", local_variables: Sequence[Any] = ()) -> None:
    """Give every rank ``root_rank``'s variables inside the state's next reduction, before its maintenance;
    collective (call it on every rank of the process set, before the step is traced).

    For models Keras builds at their first call (a ``Sequential`` without ``Input``): their weights do not
    exist before the first step, so they cannot be broadcast before it, and a schedule that prunes at step 0
    ranks masks on them. Broadcast at the reduction instead, each rank's first gradients (computed from its
    own initial weights) are averaged and applied to the broadcast weights, and masks are ranked on those:
    ranks leave the first step identical, as after Horovod's broadcast after the first batch.

    Args:
        state: a ``PacTrainState``, or an optimizer or tape that has one.
        root_rank: the rank whose values every rank takes.
        variables: called at the reduction (when the variables exist), what to broadcast, e.g.
            ``lambda: model.variables + optimizer.variables``; default: the reduced variables and the
            optimizer the state was given.
        device: where the broadcasts run, as Horovod's ``device``.
        local_variables: variables that stay this rank's (also those registered with ``register_local``).

    Raises:
        TypeError: ``state`` holds no ``PacTrainState``.
        ValueError: ``root_rank`` is not an int >= 0.
    """
    found = state_of(state)
    if found is None:
        raise TypeError(f"broadcast_variables_at_next_reduction needs a PacTrainState, or an optimizer or tape "
                        f"holding one, got {type(state).__name__}")
    if isinstance(root_rank, bool) or not isinstance(root_rank, int) or root_rank < 0:
        raise ValueError(f"root_rank must be a rank (an int >= 0), got {root_rank!r}")
    if variables is not None and not callable(variables):
        raise TypeError(f"variables must be a callable returning the variables to broadcast (they may not exist "
                        f"yet), got {type(variables).__name__}")
    if not communicates(found.process_set):
        return
    local = {backing_variable(variable).ref() for variable in local_variables}
    request = found.engine.broadcast_request
    if request is None:
        found.engine.broadcast_request = _BroadcastAtNextReduction(found, root_rank, variables, device, local)
    else:  # a step already traced holds this request's flag: raise it again
        request.root_rank, request.variables, request.device, request.local = root_rank, variables, device, local
        request.pending.assign(True)
