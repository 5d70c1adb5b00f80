"""Masks and schedule position in Keras 3's ``.keras`` and ``.weights.h5`` files."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from pactrain_hvd.tensorflow.state import PacTrainState


@functools.cache
def keras_file_entry_class() -> type:
    """Keras 3 writes every ``KerasSaveable`` attribute of the optimizer into ``.keras`` and
    ``.weights.h5`` files: this one carries masks and schedule position there, under
    ``optimizer/pactrain``. A plain Keras optimizer loading such a file never visits it."""
    from keras.src.saving.keras_saveable import KerasSaveable  # Keras 3's (private) saving protocol

    class PacTrainFileEntry(KerasSaveable):
        def __init__(self, state: PacTrainState) -> None:
            self._state = state

        def _obj_type(self) -> str:
            return "Optimizer"  # one of the kinds Keras accepts; it only selects attributes not to walk

        def save_own_variables(self, store: Any) -> None:
            store["state"] = np.frombuffer(self._state.serialize(), dtype=np.uint8)

        def load_own_variables(self, store: Any) -> None:
            if "state" in store.keys():
                self._state.deserialize(np.asarray(store["state"]).tobytes())

    return PacTrainFileEntry
