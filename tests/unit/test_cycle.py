"""The pruning state machine (``core.cycle``): the decisions every frontend's state shares."""

from pactrain_hvd.core import PacTrainConfig
from pactrain_hvd.core.cycle import DUE_NOW, NEVER, RANK, VERIFY, PruningCycle, maintenance_at, next_maintenance


def test_first_step_verifies_then_every_verify_every_steps():
    cycle = PruningCycle(PacTrainConfig.from_arguments(sparsity=0.5, begin_step=2, end_step=4, frequency=2, verify_every=3),
                         tracking=True)
    assert cycle.take_verification() == 0 and cycle.take_verification() is None
    seen = []
    for _ in range(7):
        cycle.advance()
        seen.append((cycle.step, cycle.take_verification(), cycle.update_due()))
    assert [step for step, position, _ in seen if position is not None] == [3, 6]
    assert [step for step, _, update in seen if update] == [2, 4]


def test_nothing_tracked_proves_only_the_settings_and_a_single_process_checks_nothing():
    untracked = PruningCycle(PacTrainConfig.from_arguments(sparsity=0.0), tracking=False)
    untracked.advance()
    untracked.request_verification()
    assert untracked.take_verification() is None  # no masks to prove
    assert PruningCycle(PacTrainConfig.from_arguments(sparsity=0.0), tracking=False).take_verification() == 0
    assert PruningCycle(PacTrainConfig.from_arguments(sparsity=0.5), tracking=True, communicating=False).take_verification() is None


def test_masks_ranked_before_the_first_communication_are_not_ranked_again():
    cycle = PruningCycle(PacTrainConfig.from_arguments(sparsity=0.5, begin_step=0, end_step=0), tracking=True)
    assert cycle.first_masks_due(holds_masks=False) and not cycle.first_masks_due(holds_masks=True)
    cycle.pruned_early()
    assert cycle.pruned_early_now and not cycle.update_due() and cycle.take_verification() is None
    assert not cycle.first_masks_due(holds_masks=False)


def test_maintenance_ahead_of_time():
    config = PacTrainConfig.from_arguments(sparsity=0.5, begin_step=2, end_step=4, frequency=2, verify_every=5)
    assert [maintenance_at(config, step, requested=step == 0) for step in range(6)] == [
        VERIFY, None, RANK, None, RANK, VERIFY]
    assert next_maintenance(config, 4) == 5 and next_maintenance(PacTrainConfig.from_arguments(verify_every=0, end_step=0), 1) == NEVER


def test_a_traced_step_maintains_at_the_steps_the_cycle_names():
    cycle = PruningCycle(PacTrainConfig.from_arguments(sparsity=0.5, begin_step=2, end_step=4, frequency=2, verify_every=5),
                         tracking=True)
    assert cycle.next_due() == DUE_NOW and cycle.maintenance_due(7)  # the first step checks, whatever its number
    assert cycle.maintenance(0) == VERIFY
    assert cycle.next_due() == DUE_NOW  # not done yet (it raised, say): due again
    cycle.maintained(0)
    assert cycle.next_due() == 2 and cycle.maintenance_due(2) and not cycle.maintenance_due(1)
    assert cycle.maintenance(2) == RANK
    cycle.maintained(2)
    assert cycle.step == 2 and cycle.next_due() == 4
    cycle.step = 4  # a restore: the step it lands on is maintained again
    assert cycle.next_due() == 4
    cycle.request_verification()
    assert cycle.next_due() == DUE_NOW and cycle.maintenance(3) == VERIFY
