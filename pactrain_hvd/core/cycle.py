"""The pruning state machine: the framework-free decisions of a state that prunes as it trains.

Each frontend's state (torch's ``PacTrainState``, the DDP hook's ``PacTrainHookState``, TF's
``PacTrainState``) holds tensors and makes collective calls; what step it is, whether the schedule
ranks new masks now, whether those were ranked before the step's first communication, and when
the Mask Tracker is due are decided here, the same way for all of them.

A step's life: ``first_masks_due`` (a schedule that prunes at step 0 ranks before the step's first
communication, then ``pruned_early``), ``take_verification`` before the first communication,
``update_due`` before the optimizer's update, ``advance`` after it, and with local steps ``sync_due`` after
that. A state whose step runs as a traced
graph (TF) maintains only at steps chosen ahead: ``next_due`` says which, ``maintenance`` what is due there,
``maintained`` records it done.
"""

from __future__ import annotations

import numpy as np

from pactrain_hvd.core.config import PacTrainConfig
from pactrain_hvd.core.local_steps import at_sync, checks_at, ranks_at

NEVER = int(np.iinfo(np.int64).max)  # ``next_maintenance``: no schedule update or periodic check is left
DUE_NOW = -1  # ``PruningCycle.next_due``: a requested check is due at the next step, whatever its number


class PruningCycle:
    """Schedule position and Mask Tracker bookkeeping.

    ``tracking``: masks can differ across ranks (something is pruned or given), so the check proves
    the schedule position and the masks, not only the settings. ``communicating``: there are other
    ranks to check with; every communicating rank checks at its first step, whatever its settings
    (every rank knows that step), so differing settings, or masks set or loaded on one rank alone,
    are caught there, not as a hang.
    """

    def __init__(self, config: PacTrainConfig, tracking: bool, communicating: bool = True) -> None:
        self.config = config
        self._step = 0
        self._maintained: int | None = None  # the step last ``maintained``, while the position is there
        self.tracking = tracking
        self.checks_masks = tracking and communicating
        self.verify_pending = communicating
        self.pruned_at: int | None = None  # the step whose masks were ranked before its first communication

    @property
    def step(self) -> int:
        """The schedule position: the steps taken."""
        return self._step

    @step.setter
    def step(self, step: int) -> None:
        self._step = int(step)
        self._maintained = None

    def first_masks_due(self, holds_masks: bool) -> bool:
        """Whether the schedule ranks the first masks at step 0, before its first communication (none held yet:
        masks given by the user are updated after the reduction, as at any other step)."""
        return (self.step == 0 and self.pruned_at is None and not holds_masks
                and self.config.schedule.is_update_step(0))

    def pruned_early(self) -> None:
        """This step's masks were ranked before its first communication (and proven equal there)."""
        self.pruned_at = self.step
        self.verify_pending = False

    @property
    def pruned_early_now(self) -> bool:
        """Whether this step's masks were ranked before its communication (its weights are zeroed before its update)."""
        return self.pruned_at == self.step

    def update_due(self) -> bool:
        """Whether the schedule ranks new masks at this step, after its reduction (with local steps: at the
        first step of an interval, ``core.local_steps.ranks_at``)."""
        return ranks_at(self.config.schedule, self.step, self.config.sync_every) and self.pruned_at != self.step

    # -- local steps (``core.local_steps``) ---------------------------------------------------------
    @property
    def local(self) -> bool:
        """Whether gradients stay on their rank, and ranks average their progress every ``sync_every`` steps."""
        return self.config.sync_every > 1

    def interval_begins(self) -> bool:
        """Whether this step is an interval's first: every rank holds the anchor's weights (before its update)."""
        return self.step % self.config.sync_every == 0

    def sync_due(self) -> bool:
        """After ``advance``: whether the interval just ended (the outer sync is due now)."""
        return self.local and self.interval_begins()

    def take_verification(self) -> int | None:
        """The position a due Mask Tracker check proves (0 where nothing is tracked: only the settings must
        agree then, not the position), or None where none is due; the check is then no longer due."""
        if not self.verify_pending:
            return None
        self.verify_pending = False
        return self.step if self.tracking else 0

    def request_verification(self) -> None:
        """After a collective call every rank makes (broadcasts, elastic sync): a check is due everywhere."""
        self.verify_pending = self.checks_masks

    def advance(self) -> None:
        """The step was taken: the schedule moves on; a periodic check falls due before the next communication
        (with local steps: at the next interval's first step, ``core.local_steps.checks_at``)."""
        self.step += 1
        self.verify_pending |= self.checks_masks and checks_at(self.config.verify_every, self.step,
                                                              self.config.sync_every)

    # -- a state that maintains only at the steps it chose ahead (TF's traced step) --------------------
    def maintenance(self, step: int) -> str | None:
        """What is due at ``step`` (the traced step's counter): ``maintenance_at``'s ``RANK``, ``VERIFY`` or None."""
        return maintenance_at(self.config, step, requested=self.verify_pending)

    def maintained(self, step: int) -> None:
        """What was due at ``step`` is done (not where it raised: then it is due again): the position is there,
        a requested check taken, and ``next_due`` names a later step."""
        self.step = step
        self.verify_pending = False
        self._maintained = self._step

    def next_due(self) -> int:
        """The step of the next maintenance: ``DUE_NOW`` where a check is requested, else the first schedule
        update or periodic check from this step on (after it, once ``maintained`` there)."""
        if self.verify_pending:
            return DUE_NOW
        return next_maintenance(self.config, self._step if self._maintained == self._step else self._step - 1)

    def maintenance_due(self, step: int) -> bool:
        """Whether ``step`` (the traced step's counter) is the one ``next_due`` names, or a check is requested."""
        due = self.next_due()
        return due == DUE_NOW or due == step


RANK, VERIFY = "rank", "verify"


def maintenance_at(config: PacTrainConfig, step: int, requested: bool) -> str | None:
    """For a state that maintains only at the steps it chose ahead (TF's traced step): at ``step``, ``RANK`` where
    the schedule ranks new masks (proven equal as they are installed), else ``VERIFY`` where a Mask Tracker check
    is due (``requested``: asked for by a call every rank made, or the state's first step), else None. With local
    steps both wait for an interval's first step (``core.local_steps``)."""
    if ranks_at(config.schedule, step, config.sync_every):
        return RANK
    if requested or checks_at(config.verify_every, step, config.sync_every):
        return VERIFY
    return None


def next_maintenance(config: PacTrainConfig, step: int) -> int:
    """The first step after ``step`` with a schedule update or a periodic check (``NEVER``: none left); with local
    steps, the interval start where the first one due after the current interval's start is done."""
    every = config.sync_every
    following = (config.next_maintenance_after(step) if every == 1
                 else at_sync(config.next_maintenance_after(step - step % every), every))
    return NEVER if following is None else following
