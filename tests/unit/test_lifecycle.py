"""core.lifecycle.StepLifecycle: the order of a step's mask operations, recorded on a state that logs them."""

from pactrain_hvd.core import PacTrainConfig
from pactrain_hvd.core.cycle import PruningCycle
from pactrain_hvd.core.lifecycle import StepLifecycle


class Recorder:
    """A state whose operations only log themselves (the lifecycle's order is what is tested)."""

    def __init__(self, masked_by_reduction: bool = True) -> None:
        self.log: list[str] = []
        self.masks = False
        self.weights_unmasked = False
        self.gradients_masked_by_reduction = masked_by_reduction

    def holds_masks(self):
        return self.masks

    def adopt_broadcast(self):
        pass

    def rank_masks(self, step, early):
        self.log.append(f"rank {step}{' early' if early else ''}")
        self.masks = True
        self.weights_unmasked |= early

    def verify_masks(self, position):
        self.log.append(f"verify {position}")

    def finish_early_pruning(self):
        self.log.append("finish early")
        self.weights_unmasked = False

    def mask_gradients(self):
        self.log.append("mask gradients")

    def needs_remask(self, step):
        return False

    def zero_pruned_weights(self):
        self.log.append("zero weights")

    def commit_codec_memory(self):
        self.log.append("commit")

    def begin_interval(self):
        self.log.append("anchor")


def steps(config, ops, count, communications=1):
    lifecycle = StepLifecycle(PruningCycle(config, tracking=True), ops)
    synced = []
    for _ in range(count):
        for _ in range(communications):
            lifecycle.before_communication()
        lifecycle.after_update(lifecycle.before_update())
        synced.append(lifecycle.cycle.sync_due())
        ops.log.append("|")
    return synced


def test_masks_ranked_at_step_0_before_the_first_communication_take_effect_before_the_update():
    ops = Recorder()
    steps(PacTrainConfig.from_arguments(begin_step=0, end_step=2, frequency=2, verify_every=0), ops, 3, communications=2)
    assert " ".join(ops.log).split(" | ") == [
        "rank 0 early commit finish early", "commit", "commit rank 2 mask gradients |"]


def test_without_communication_gradients_are_masked_every_step_and_the_first_check_is_the_ranking():
    ops = Recorder(masked_by_reduction=False)
    steps(PacTrainConfig.from_arguments(begin_step=0, end_step=0, verify_every=0), ops, 2, communications=0)
    assert " ".join(ops.log).split(" | ") == ["commit rank 0 early finish early mask gradients", "commit mask gradients |"]


def test_a_periodic_check_runs_before_the_first_communication_of_its_step():
    ops = Recorder()
    steps(PacTrainConfig.from_arguments(sparsity=0.0, verify_every=2), ops, 3)
    assert " ".join(ops.log).split(" | ") == ["verify 0 commit", "commit", "verify 2 commit |"]


def test_local_steps_take_the_anchor_at_each_intervals_first_step_and_rank_only_there():
    ops = Recorder(masked_by_reduction=False)
    synced = steps(PacTrainConfig.from_arguments(begin_step=1, end_step=3, frequency=1, verify_every=0, sync_every=2), ops, 6,
                   communications=0)
    assert synced == [False, True] * 3
    assert " ".join(ops.log).split(" | ") == [
        "commit verify 0 mask gradients anchor", "commit mask gradients", "commit rank 2 mask gradients anchor",
        "commit mask gradients", "commit rank 4 mask gradients anchor", "commit mask gradients |"]
