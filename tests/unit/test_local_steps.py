"""Local steps' framework-free rules: the arguments, when masks are ranked, and the outer step."""

import numpy as np
import pytest
import torch

from pactrain_hvd.core import PacTrainConfig
from pactrain_hvd.core.cycle import RANK, VERIFY, PruningCycle, maintenance_at, next_maintenance
from pactrain_hvd.core.local_steps import check_local_steps, outer_update, ranks_at
from pactrain_hvd.core.schedule import PolynomialSchedule


@pytest.mark.parametrize("arguments, message", [
    ((0, 0.7, 0.9), "sync_every must be an int >= 1"), ((True, 0.7, 0.9), "sync_every must be an int >= 1"),
    ((np.float64(4.0), 0.7, 0.9), "sync_every must be an int >= 1"), ((4, -0.1, 0.9), "outer_lr must be > 0"),
    ((4, float("nan"), 0.9), "outer_lr must be a finite number"), ((4, 0.7, 1.0), r"outer_momentum must be in \[0, 1\)"),
    ((4, 0.7, "0.9"), "outer_momentum must be a finite number"),
])
def test_bad_arguments_are_named(arguments, message):
    with pytest.raises(ValueError, match=message):
        check_local_steps(*arguments)


def test_numpy_integers_are_accepted_and_the_config_checks_them():
    check_local_steps(np.int64(25), 1.0, 0.0)
    assert PacTrainConfig(sync_every=np.int64(4)).sync_every == 4
    with pytest.raises(ValueError, match="sync_every"):
        PacTrainConfig(sync_every=0)


def test_a_schedule_update_inside_an_interval_moves_to_the_next_intervals_first_step():
    schedule = PolynomialSchedule(final_sparsity=0.9, begin_step=10, end_step=50, frequency=10)
    per_step = [s for s in range(80) if ranks_at(schedule, s, 1)]
    assert per_step == [10, 20, 30, 40, 50]
    assert [s for s in range(80) if ranks_at(schedule, s, 25)] == [25, 50]  # 10 and 20 at 25; 30, 40, 50 at 50
    assert [s for s in range(80) if ranks_at(schedule, s, 10)] == per_step  # updates on interval starts stay
    assert [s for s in range(80) if ranks_at(schedule, s, 7)] == [14, 21, 35, 42, 56]


def test_the_cycle_says_when_an_interval_begins_and_when_its_sync_is_due():
    cycle = PruningCycle(PacTrainConfig.from_arguments(sync_every=3, begin_step=0, end_step=0), tracking=True)
    due = []
    for _ in range(7):
        due.append((cycle.step, cycle.interval_begins(), cycle.update_due()))
        cycle.advance()
        due[-1] += (cycle.sync_due(),)
    assert [d[0] for d in due if d[1]] == [0, 3, 6] and [d[0] for d in due if d[3]] == [2, 5]
    assert [d[0] for d in due if d[2]] == [0]
    assert not PruningCycle(PacTrainConfig(), tracking=True).local


def test_the_outer_step_is_torchs_nesterov_sgd_and_plain_averaging_at_lr_1_momentum_0():
    torch.manual_seed(0)
    anchor, gradients = torch.randn(5), [torch.randn(5) for _ in range(3)]
    weight = torch.nn.Parameter(anchor.clone())
    reference = torch.optim.SGD([weight], lr=0.7, momentum=0.9, nesterov=True)
    momentum = torch.zeros(5)
    for gradient in gradients:
        weight.grad = gradient.clone()
        reference.step()
        anchor, momentum = outer_update(anchor, momentum, gradient, 0.7, 0.9)
        assert torch.allclose(anchor, weight.detach(), atol=1e-6)
    mean_of_ranks = torch.stack([torch.ones(3), 3 * torch.ones(3)]).mean(0)  # local weights 1 and 3, anchor 0
    averaged, _ = outer_update(np.zeros(3), np.zeros(3), -mean_of_ranks.numpy(), 1.0, 0.0)
    assert np.array_equal(averaged, 2 * np.ones(3))


def test_a_periodic_check_between_syncs_waits_for_the_next_intervals_first_step():
    """A check is a collective: between syncs it would be the interval's only communication, so it runs right
    after the next sync instead; every step syncs without local steps, so nothing waits there."""
    def checks(**settings):
        cycle = PruningCycle(PacTrainConfig.from_arguments(begin_step=0, end_step=0, verify_every=4, **settings),
                             tracking=True)
        cycle.take_verification()  # the first step's
        taken = []
        for _ in range(13):
            cycle.advance()
            if cycle.take_verification() is not None:
                taken.append(cycle.step)
        return taken

    assert checks() == [4, 8, 12]
    assert checks(sync_every=3) == [6, 9, 12]  # due at 4, 8 and 12: the first steps of intervals from 4 on
    assert checks(sync_every=2) == [4, 8, 12]  # already interval starts


@pytest.mark.parametrize("sync_every", [1, 2, 3, 7, 25])
def test_a_traced_step_maintains_where_the_per_step_cycle_ranks_and_checks(sync_every):
    """TensorFlow's traced step runs Python only at the steps ``next_maintenance`` names ahead: walking from one
    to the next visits exactly the steps where torch's per-step cycle ranks masks or checks them."""
    config = PacTrainConfig.from_arguments(sparsity=0.9, begin_step=10, end_step=50, frequency=10, verify_every=4,
                                           sync_every=sync_every)
    cycle = PruningCycle(config, tracking=True)
    cycle.take_verification()  # the first step's
    per_step = {}
    for _ in range(80):  # a check before the step's communication, a ranking after it (proven equal as installed)
        if cycle.take_verification() is not None:
            per_step[cycle.step] = VERIFY
        if cycle.update_due():
            per_step[cycle.step] = RANK
        cycle.advance()
    traced, step = {}, next_maintenance(config, 0)
    while step < 80:
        traced[step] = maintenance_at(config, step, requested=False)
        step = next_maintenance(config, step)
    assert traced == per_step
    assert all(s % sync_every == 0 for s in traced)
