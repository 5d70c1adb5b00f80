"""Collective helpers on a ``PacTrainState`` (Horovod's module name): find a holder's state, broadcast it."""

from __future__ import annotations

from typing import Any

import horovod.tensorflow as hvd

from pactrain_hvd.tensorflow.pruning import communicates
from pactrain_hvd.tensorflow.state import PacTrainState


def state_of(holder: Any) -> PacTrainState | None:
    """The ``PacTrainState`` of a state, tape or optimizer, also inside a loss-scale optimizer (which Keras'
    ``compile`` puts around the optimizer under ``mixed_float16``); None if it has none."""
    for candidate in (holder, getattr(holder, "inner_optimizer", None)):
        state = getattr(candidate, "pactrain_state", candidate)
        if isinstance(state, PacTrainState):
            return state
    return None


def broadcast_masks(state: Any, root_rank: int = 0) -> None:
    """Give every rank ``root_rank``'s masks and schedule position (start and resume); collective.

    ``state``: a ``PacTrainState``, or an optimizer or tape that has one (``.pactrain_state``), or a
    loss-scale optimizer around such an optimizer.
    Use next to ``hvd.broadcast_variables``. The Mask Tracker proves the result at the next step
    (not here: a rank that joined an elastic job may not be bound to its variables yet). Where
    the state does not communicate (``pruning.communicates``: outside its process set, or alone
    in it) this does nothing.
    """
    found = state_of(state)
    if found is None:
        raise TypeError(f"broadcast_masks needs a PacTrainState, or an optimizer or tape holding one, got "
                        f"{type(state).__name__}")
    state = found
    if not communicates(state.process_set):
        return
    blob = hvd.broadcast_object(state.serialize(), root_rank, name="pactrain.state", process_set=state.process_set)
    state.deserialize(blob)
    state.request_verification()  # every rank of the process set is here
