"""The order of a step's mask operations, written once for every frontend.

``PruningCycle`` decides what is due (a ranking, a check, a sync); ``StepLifecycle`` runs what is due in one
order, through the small protocol a frontend's state implements (``MaskOperations``). torch's
``DistributedOptimizer`` and the DDP comm hook drive it from the same three points: before each
communication, before the wrapped optimizer's update, after it. TensorFlow's traced step, which runs Python
only at steps chosen ahead, drives ``maintain`` at those steps. A feature that changes the step (local
steps, for instance) is an edit here and, where it needs tensors, one operation more.

A step::

    before_communication()   each communication: broadcast state adopted, step 0's masks ranked if the
                             schedule prunes there, a due Mask Tracker check
    before_update()          the codec's residuals kept; early-ranked masks applied; the schedule's mask
                             update if due (this step's gradients were reduced under the old masks); with
                             local steps the anchor taken at an interval's first step
    after_update(remask)     pruned weights re-zeroed where the update could move them; the schedule
                             advances; with local steps, whether the outer sync is due now
"""

from __future__ import annotations

from typing import Protocol

from pactrain_hvd.core.cycle import RANK, VERIFY, PruningCycle


class MaskOperations(Protocol):
    """What a frontend's state does when its ``StepLifecycle`` asks (the lifecycle decides when)."""

    weights_unmasked: bool  # masks were installed without zeroing the weights (autograd was reading them)
    gradients_masked_by_reduction: bool  # the step's reduction already zeroed pruned gradients

    def holds_masks(self) -> bool:
        """Whether any mask is installed."""

    def adopt_broadcast(self) -> None:
        """Take state another rank's broadcast wrote into this one's tensors (nothing where none can)."""

    def rank_masks(self, step: int, early: bool) -> None:
        """New masks for ``step``, ranked, proven equal across ranks and installed; ``early``: before the step's
        reduction, while autograd may still read the weights (they are zeroed by ``finish_early_pruning``)."""

    def verify_masks(self, position: int) -> None:
        """The Mask Tracker's check of ``position`` (a collective call)."""

    def finish_early_pruning(self) -> None:
        """Masks ranked before the reduction take effect: survivors rescaled if configured, pruned weights and
        gradients zeroed."""

    def mask_gradients(self) -> None:
        """Pruned coordinates of the gradients become 0."""

    def needs_remask(self, step: int) -> bool:
        """Whether pruned weights are re-zeroed after this step's update (the optimizer could move them)."""

    def zero_pruned_weights(self) -> None:
        """Pruned weights become 0."""

    def commit_codec_memory(self) -> None:
        """The step is taken: the quantization residuals of its reduction are kept."""

    def begin_interval(self) -> None:
        """Local steps: the weights every rank holds now are the interval's anchor."""


class StepLifecycle:
    """The step's order of mask operations on ``ops``, as ``cycle`` says what is due."""

    def __init__(self, cycle: PruningCycle, ops: MaskOperations) -> None:
        self.cycle = cycle
        self.ops = ops

    def before_communication(self) -> None:
        ops, cycle = self.ops, self.cycle
        ops.adopt_broadcast()
        if cycle.first_masks_due(ops.holds_masks()):
            ops.rank_masks(cycle.step, early=True)
            cycle.pruned_early()
        self.verify_if_due()

    def verify_if_due(self) -> None:
        """A Mask Tracker check every rank has due at this step (only the settings where nothing is tracked)."""
        self.ops.adopt_broadcast()
        position = self.cycle.take_verification()
        if position is not None:
            self.ops.verify_masks(position)

    def before_update(self) -> bool:
        """Between the reduction and the update; returns whether ``after_update`` re-zeroes pruned weights."""
        ops, cycle = self.ops, self.cycle
        ops.commit_codec_memory()  # this step is taken (a loss scaler that skips it never calls step)
        self.before_communication()  # where nothing was communicated (one process, local steps): here
        if cycle.pruned_early_now and ops.weights_unmasked:  # autograd is done with the weights
            ops.finish_early_pruning()
        remask = ops.needs_remask(cycle.step)
        if cycle.update_due():
            ops.rank_masks(cycle.step, early=False)
            ops.mask_gradients()  # this step's gradients were reduced under the old masks
        elif not ops.gradients_masked_by_reduction:
            ops.mask_gradients()  # nothing packed them: pruned weights still get no update
        if cycle.local and cycle.interval_begins():
            ops.begin_interval()
        return remask

    def after_update(self, remask: bool) -> bool:
        """After the update; returns whether the outer sync of local steps is due now."""
        if remask:
            self.ops.zero_pruned_weights()
        self.cycle.advance()  # a periodic check due now runs before the next step's first communication
        return self.cycle.sync_due()

    def maintain(self, step: int, early: bool) -> bool:
        """For a step traced ahead (TF): what is due at ``step`` (``cycle.next_due`` named it), done before the
        step's reduction; ``early`` as in ``rank_masks``. Returns whether the masks changed."""
        due = self.cycle.maintenance(step)
        if due == RANK:
            self.ops.rank_masks(step, early)
        elif due == VERIFY:
            self.ops.verify_masks(step)
        self.cycle.maintained(step)
        return due == RANK
