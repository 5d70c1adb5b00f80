"""PacTrain settings shared by both frontends, validated before anything is communicated."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

from pactrain_hvd.core.agreement import WIRE_FORMAT, Setting
from pactrain_hvd.core.keywords import CONFIG_KEYWORDS, DEFAULT_VERIFY_EVERY
from pactrain_hvd.core.local_steps import check_local_steps
from pactrain_hvd.core.masks import DEFAULT_RANKING, RANKINGS  # noqa: F401 (DEFAULT_RANKING: re-exported)
from pactrain_hvd.core.numeric import plain_number
from pactrain_hvd.core.plan import DEFAULT_MAX_DENSITY, DEFAULT_MIN_NUMEL
from pactrain_hvd.core.schedule import (
    DEFAULT_SPARSITY,
    FIXED_CLOCK,
    PolynomialSchedule,
    Schedule,
    checked_schedule,
    schedule_steps,
)

REDUCE_OPS = ("Average", "Sum", "Min", "Max")  # what packing supports: each survivor reduced on its own
_OTHER_REDUCE_OPS = ("Adasum", "Product")


def require_initialized(hvd: Any, caller: str) -> None:
    """``hvd`` is the frontend's Horovod module; ``caller`` what needs it."""
    if not hvd.is_initialized():
        raise RuntimeError(f"Horovod is not initialized: call hvd.init() before creating {caller}")


def horovod_op(hvd: Any, op: Any) -> Any:
    """``op`` as Horovod's all-reduce reads it: None is ``hvd.Average``, Horovod's op where none is given."""
    return hvd.Average if op is None else op


def reduce_op_name(hvd: Any, op: Any, gradient_predivide_factor: float) -> str:
    """The name of ``op``, one of the frontend module ``hvd``'s reduce ops (None: Average, as Horovod reads it),
    checked as packing and Horovod need."""
    names = {getattr(hvd, name): name for name in REDUCE_OPS + _OTHER_REDUCE_OPS}
    op = horovod_op(hvd, op)
    if not isinstance(op, numbers.Integral) or op not in names:  # a string, a float: not one of Horovod's op constants
        raise ValueError(f"op must be one of Horovod's reduce ops, hvd.Average, hvd.Sum, hvd.Min or hvd.Max, "
                         f"got {op!r} ({type(op).__name__})")
    if names[op] not in REDUCE_OPS:
        raise ValueError(f"op=hvd.{names[op]} is not supported with packing: use hvd.Average, hvd.Sum, hvd.Min or "
                         "hvd.Max (Adasum is not)")
    if (isinstance(gradient_predivide_factor, bool) or not isinstance(gradient_predivide_factor, numbers.Real)
            or not math.isfinite(gradient_predivide_factor) or gradient_predivide_factor <= 0):
        raise ValueError(f"gradient_predivide_factor must be a finite number > 0 (the sum is divided by it before "
                         f"the all-reduce and multiplied back after), got {gradient_predivide_factor!r}")
    if gradient_predivide_factor != 1.0 and names[op] != "Average":
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    return names[op]


def passes_per_step(backward_passes_per_step: Any) -> int:
    """``backward_passes_per_step`` as an ``int``: any integer type Horovod accepts (numpy's too), > 0."""
    if isinstance(backward_passes_per_step, bool) or not isinstance(backward_passes_per_step, numbers.Integral) \
            or backward_passes_per_step <= 0:
        raise ValueError(f"backward_passes_per_step must be an int > 0, got {backward_passes_per_step!r}")
    return int(backward_passes_per_step)


def check_process_set(hvd: Any, process_set: Any) -> None:
    """``process_set``: a ProcessSet of the frontend module ``hvd``, as Horovod's collectives take."""
    if not isinstance(process_set, hvd.ProcessSet):
        raise TypeError(f"process_set must be a horovod ProcessSet (hvd.global_process_set, or one made by "
                        f"hvd.add_process_set), got {type(process_set).__name__}")


def checked_groups(groups: Any, tensors: str) -> int | list | None:
    """Horovod's ``groups``: None, a number of groups > 0 (numpy's integers too, as Horovod takes them; returned as
    an ``int``), or a list of lists of ``tensors`` (what they hold the frontend checks)."""
    if groups is None:
        return None
    if isinstance(groups, list):
        wrong = [i for i, group in enumerate(groups) if not isinstance(group, (list, tuple))]
        if wrong:
            raise ValueError(f"groups given as a list must be a list of lists of {tensors}, got "
                             f"{type(groups[wrong[0]]).__name__} at groups[{wrong[0]}]")
        return groups
    if not isinstance(groups, numbers.Integral) or groups <= 0:
        shown = repr(groups) if isinstance(groups, (numbers.Number, str)) else type(groups).__name__
        raise ValueError(f"groups should be a positive integer or a list of lists of {tensors}, got {shown}")
    return int(groups)


def scale_factors(averaging: bool, gradient_predivide_factor: float) -> dict[str, float]:
    """Horovod's ``prescale_factor`` / ``postscale_factor`` for an all-reduce: an average is split
    around the sum as Horovod splits it (the C++ side applies the extra 1/size)."""
    if not averaging:
        return {"prescale_factor": 1.0, "postscale_factor": 1.0}
    return {"prescale_factor": 1.0 / gradient_predivide_factor, "postscale_factor": gradient_predivide_factor}


def config_arguments(pactrain: dict[str, Any]) -> dict[str, Any]:
    """The part of ``pactrain`` that ``PacTrainConfig.from_arguments`` reads."""
    return {name: pactrain[name] for name in CONFIG_KEYWORDS if name in pactrain}


@dataclass(frozen=True)
class PacTrainConfig:
    """PacTrain's settings, shared by both frontends (which build it with ``from_arguments``).

    Every field is checked on construction (``TypeError`` or ``ValueError`` naming it); numpy scalars and 0-d
    tensors are read as the Python numbers they hold. ``sparsity``, ``begin_step``, ``end_step`` and
    ``frequency`` read the schedule's (as a ``PolynomialSchedule``).

    Attributes:
        schedule: the pruning schedule, the object given (``ConstantSparsity``, ``PolynomialDecay``) or the
            ``PolynomialSchedule`` the keywords describe.
        ranking: how ``sparsity`` is spread over tensors: ``"layer"``, ``"erk"`` or ``"global"`` (``magnitude_masks``).
        pack_min_numel: smallest tensor sent packed (``should_pack``), >= 0.
        pack_max_density: largest surviving fraction sent packed, in (0, 1].
        verify_every: steps between periodic Mask Tracker checks (0: only at mask changes).
        total_steps: the run's length the schedule's steps were derived from, if given (for messages).
        resume_changed_settings: load a checkpoint saved under other settings, with a warning, instead of refusing it.
        rescale_survivors: survivors of a fresh model pruned at step 0 take their tensor's norm (``survivor_scales``).
        sync_every: ranks step on their own gradients and sync every ``sync_every`` steps (``core.local_steps``).
        outer_lr: learning rate of the outer Nesterov step taken at each sync (> 0).
        outer_momentum: momentum of that outer step, in [0, 1).
    """

    schedule: Schedule = PolynomialSchedule(DEFAULT_SPARSITY, *FIXED_CLOCK)
    ranking: str = DEFAULT_RANKING
    pack_min_numel: int = DEFAULT_MIN_NUMEL
    pack_max_density: float = DEFAULT_MAX_DENSITY
    verify_every: int = DEFAULT_VERIFY_EVERY
    total_steps: int | None = None  # what the schedule's steps were derived from, if given (for messages)
    resume_changed_settings: bool = False  # load a checkpoint saved under other settings (core.resume)
    rescale_survivors: bool = False
    sync_every: int = 1
    outer_lr: float = 0.7
    outer_momentum: float = 0.9

    def __post_init__(self) -> None:
        for name in ("pack_min_numel", "pack_max_density", "verify_every", "total_steps", "sync_every", "outer_lr",
                     "outer_momentum"):  # numpy scalars and 0-d tensors as Python numbers
            object.__setattr__(self, name, plain_number(getattr(self, name)))
        checked_schedule(self.schedule)
        if self.ranking not in RANKINGS:
            raise ValueError(f"ranking must be one of {', '.join(map(repr, RANKINGS))}, got {self.ranking!r}")
        for name in ("pack_min_numel", "verify_every"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {value!r}")
        if isinstance(self.pack_max_density, bool) or not isinstance(self.pack_max_density, (int, float)):
            raise TypeError(f"pack_max_density must be a number in (0, 1], got {self.pack_max_density!r}")
        if not 0.0 < self.pack_max_density <= 1.0:
            raise ValueError(f"pack_max_density must be in (0, 1], got {self.pack_max_density!r}")
        if self.pack_min_numel < 0:
            raise ValueError(f"pack_min_numel must be >= 0, got {self.pack_min_numel!r}")
        if not isinstance(self.resume_changed_settings, bool):
            raise TypeError(f"resume_changed_settings must be a bool, got {self.resume_changed_settings!r}")
        if self.verify_every < 0:
            raise ValueError(f"verify_every must be >= 0 (0: only at mask changes), got {self.verify_every!r}")
        check_local_steps(self.sync_every, self.outer_lr, self.outer_momentum)
        if not isinstance(self.rescale_survivors, bool):
            raise TypeError(f"rescale_survivors must be a bool, got {self.rescale_survivors!r}")
        if self.rescale_survivors and not (self.schedule.is_update_step(0) and self.schedule.target(0) > 0):
            raise ValueError("rescale_survivors=True needs a schedule that prunes at step 0, before the first update "
                             "(schedule=ConstantSparsity(...), or begin_step=0 with initial_sparsity > 0): it rescales "
                             f"a freshly initialised model once, and this schedule first prunes at step {self.begin_step}"
                             + (" to sparsity 0" if self.begin_step == 0 else ""))

    @classmethod
    def from_arguments(cls, pack_min_numel: int | None = None, pack_max_density: float | None = None,
                       total_steps: int | None = None, begin_step: int | None = None, end_step: int | None = None,
                       frequency: int | None = None, schedule: Schedule | None = None, sparsity: float | None = None,
                       **settings: Any) -> PacTrainConfig:
        """The frontends' arguments, where ``None`` means the default: for ``sparsity`` 0.9 (a schedule object's
        own), for a plan threshold its constant, for the schedule's steps the run's share (``schedule_steps``).
        ``schedule``: a schedule object (``core.schedule.ConstantSparsity``, ``PolynomialDecay``,
        ``PolynomialSchedule``) in place of ``sparsity``, ``total_steps``, ``begin_step``, ``end_step`` and
        ``frequency``, kept as it is (``checked_schedule``)."""
        plan = {k: v for k, v in (("pack_min_numel", pack_min_numel), ("pack_max_density", pack_max_density))
                if v is not None}
        total_steps = plain_number(total_steps)
        if schedule is not None:
            schedule = checked_schedule(schedule, plain_number(sparsity), total_steps=total_steps,
                                        begin_step=begin_step, end_step=end_step, frequency=frequency)
            return cls(schedule=schedule, **settings, **plan)
        sparsity = plain_number(DEFAULT_SPARSITY if sparsity is None else sparsity)
        if isinstance(sparsity, bool) or not isinstance(sparsity, (int, float)):
            raise TypeError(f"sparsity must be a number in [0, 1), got {sparsity!r}")
        if not 0.0 <= sparsity < 1.0:
            raise ValueError(f"sparsity must be in [0, 1), got {sparsity!r}")
        steps = schedule_steps(total_steps, begin_step, end_step, frequency)
        return cls(schedule=PolynomialSchedule(float(sparsity), *steps), **settings, **plan, total_steps=total_steps)

    @property
    def sparsity(self) -> float:
        """The schedule's final sparsity."""
        return self.schedule.polynomial().final_sparsity

    @property
    def begin_step(self) -> int:
        """The schedule's first mask update."""
        return self.schedule.polynomial().begin_step

    @property
    def end_step(self) -> int:
        """The schedule's last mask update; masks are frozen after it."""
        return self.schedule.polynomial().end_step

    @property
    def frequency(self) -> int:
        """Steps between the schedule's mask updates."""
        return self.schedule.polynomial().frequency

    def shared_settings(self) -> dict[str, Setting]:
        """What every rank must hold the same (``core.agreement``), in the order a mismatch names them."""
        curve = self.schedule.polynomial()
        return {"total_steps": self.total_steps, "begin_step": curve.begin_step, "end_step": curve.end_step,
                "frequency": curve.frequency, "sparsity": curve.final_sparsity, "ranking": self.ranking,
                "pack_min_numel": self.pack_min_numel, "pack_max_density": float(self.pack_max_density),
                "verify_every": self.verify_every, "initial_sparsity": curve.initial_sparsity, "power": curve.power,
                "rescale_survivors": self.rescale_survivors, "sync_every": self.sync_every,
                "outer_lr": float(self.outer_lr), "outer_momentum": float(self.outer_momentum), "wire_format": WIRE_FORMAT}

    def verifies_at(self, step: int) -> bool:
        """Whether ``step`` has a periodic Mask Tracker check (every ``verify_every`` steps; 0: none)."""
        return bool(self.verify_every) and step % self.verify_every == 0

    def next_maintenance_after(self, step: int) -> int | None:
        """The first step after ``step`` with a schedule update or a periodic check (None: no more)."""
        following = [s for s in (self.schedule.next_update_after(step),) if s is not None]
        if self.verify_every:
            following.append((step // self.verify_every + 1) * self.verify_every)
        return min(following, default=None)
