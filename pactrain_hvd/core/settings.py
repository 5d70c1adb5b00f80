"""A façade's arguments resolved once, in one place, before anything is created or communicated.

Every façade (torch's ``DistributedOptimizer``, the DDP hook's state, TensorFlow's ``PacTrainState``) hands
``resolve`` its PacTrain keywords and Horovod's reduction arguments and gets back one checked ``Settings``;
what only a frontend can check (its tensors, its compressor, its masks) it checks itself, beside.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pactrain_hvd.core.agreement import Setting, horovod_settings
from pactrain_hvd.core.config import (
    PacTrainConfig,
    check_process_set,
    checked_groups,
    config_arguments,
    horovod_op,
    passes_per_step,
    reduce_op_name,
    require_initialized,
)
from pactrain_hvd.core.encodings import ENCODINGS, ValueEncoding, packed_values_argument
from pactrain_hvd.core.own_masks import schedule_sparsity


@dataclass(frozen=True)
class Settings:
    """What a façade was asked for, checked: PacTrain's settings and the reduction Horovod is to make.

    Attributes:
        config: PacTrain's settings (schedule, ranking, plan thresholds, local steps, verification).
        packed_values: how surviving values travel, a key of ``core.encodings.ENCODINGS``.
        op: Horovod's reduce op constant (None given reads ``hvd.Average``, as Horovod reads it).
        op_name: its name: ``"Average"``, ``"Sum"``, ``"Min"`` or ``"Max"``.
        groups: Horovod's ``groups``: None, a count (an ``int``), or the lists as given.
        backward_passes_per_step: gradients accumulated locally before each reduction.
        gradient_predivide_factor: Horovod's split of the average around the sum.
    """

    config: PacTrainConfig
    packed_values: str
    op: Any = None
    op_name: str = "Average"
    groups: int | list | None = None
    backward_passes_per_step: int = 1
    gradient_predivide_factor: float = 1.0

    @property
    def encoding(self) -> ValueEncoding:
        """The packed values' encoding."""
        return ENCODINGS[self.packed_values]

    def agreed(self, compression: Any) -> dict[str, Setting]:
        """Everything every rank must hold the same (``core.agreement``), with ``compression`` (Horovod's
        compressor) for the dense tensors."""
        return {**self.config.shared_settings(), "packed_values": self.packed_values,
                **horovod_settings(self.op_name, compression, self.groups, self.backward_passes_per_step,
                                   self.gradient_predivide_factor)}


def pactrain_settings(pactrain: dict[str, Any], stacklevel: int) -> tuple[PacTrainConfig, str]:
    """PacTrain's own keywords (``core.keywords``) read: the config and ``packed_values`` (``values``, its
    deprecated name, read as it; warnings point ``stacklevel`` frames up from here)."""
    packed_values = packed_values_argument(pactrain["packed_values"], pactrain.get("values"), stacklevel=stacklevel + 1)
    sparsity = schedule_sparsity(pactrain["sparsity"], pactrain.get("masks") is not None,
                                 pactrain.get("continue_pruning", False))
    return PacTrainConfig.from_arguments(**dict(config_arguments(pactrain), sparsity=sparsity)), packed_values


def resolve(hvd: Any, pactrain: dict[str, Any], *, caller: str, tensors: str, wires: dict, op: Any = None,
            gradient_predivide_factor: float = 1.0, groups: Any = None, process_set: Any = None,
            backward_passes_per_step: Any = 1, stacklevel: int = 2) -> Settings:
    """A Horovod façade's arguments checked, as Horovod and packing need them.

    Args:
        hvd: the frontend's Horovod module (``horovod.torch``, ``horovod.tensorflow``).
        pactrain: the façade's PacTrain keywords, defaults filled in (``core.keywords.pactrain_keywords``).
        caller: what the façade makes, for the message when Horovod is not initialized.
        tensors: what ``groups`` lists hold in this frontend, for messages (``"torch.Tensor"``).
        wires: the frontend's table of the value dtypes its all-reduce carries (``ValueEncoding.wire_of``).
        op, gradient_predivide_factor, groups, process_set, backward_passes_per_step: Horovod's arguments.
        stacklevel: frames from here up to the façade's caller, for deprecation warnings.

    Returns:
        The settings.

    Raises:
        TypeError, ValueError: an argument is not what Horovod or PacTrain takes, or two contradict; the message
            names them.
        RuntimeError: Horovod is not initialized.
    """
    config, packed_values = pactrain_settings(pactrain, stacklevel + 1)
    passes = passes_per_step(backward_passes_per_step)
    op = horovod_op(hvd, op)
    op_name = reduce_op_name(hvd, op, gradient_predivide_factor)
    if config.sync_every > 1 and op_name != "Average":
        raise ValueError(f"sync_every={config.sync_every} needs op=hvd.Average (the outer sync averages the ranks' "
                         f"progress; local steps reduce no gradients), got op=hvd.{op_name}")
    groups = checked_groups(groups, tensors)
    check_process_set(hvd, process_set)
    encoding = ENCODINGS[packed_values]
    encoding.check(op_name, groups is not None)
    encoding.wire_of(wires, hvd.__name__)
    require_initialized(hvd, caller)
    return Settings(config, packed_values, op, op_name, groups, passes, float(gradient_predivide_factor))
