"""Schedule objects (tfmot-style): sparse from the first step, gradual, a short ramp; and their arguments."""

import pytest

from pactrain_hvd.core import ConstantSparsity, PolynomialDecay, PolynomialSchedule, short_ramp
from pactrain_hvd.core.config import PacTrainConfig


def test_constant_sparsity_prunes_once_at_step_0_to_its_sparsity():
    schedule = PacTrainConfig.from_arguments(schedule=ConstantSparsity(0.95)).schedule
    assert [t for t in range(500) if schedule.is_update_step(t)] == [0]
    assert schedule.target(0) == 0.95
    assert schedule.target(10_000) == 0.95


def test_constant_sparsity_re_ranks_every_frequency_steps_up_to_end_step():
    schedule = ConstantSparsity(0.9, begin_step=0, end_step=250, frequency=100).polynomial()
    assert [t for t in range(1000) if schedule.is_update_step(t)] == [0, 100, 200, 250]
    assert {schedule.target(t) for t in range(1000)} == {0.9}


def test_begin_and_end_at_zero_prune_once_before_the_first_step():
    config = PacTrainConfig.from_arguments(sparsity=0.98, begin_step=0, end_step=0)
    assert [t for t in range(2000) if config.schedule.is_update_step(t)] == [0]
    assert config.schedule.target(0) == 0.98


def test_polynomial_decay_follows_the_cubic_from_its_initial_sparsity():
    config = PacTrainConfig.from_arguments(schedule=PolynomialDecay(0.5, 0.95, begin_step=0, end_step=100, frequency=10))
    schedule = config.schedule
    assert (config.sparsity, schedule.polynomial().initial_sparsity, config.begin_step, config.end_step, config.frequency) == \
        (0.95, 0.5, 0, 100, 10)
    assert schedule.target(0) == 0.5
    assert schedule.target(50) == pytest.approx(0.95 - 0.45 * 0.5**3)
    assert schedule.target(100) == 0.95
    assert [t for t in range(300) if schedule.is_update_step(t)] == list(range(0, 101, 10))


def test_short_ramp_re_ranks_at_every_step_of_the_ramp_and_starts_packed():
    schedule = PacTrainConfig.from_arguments(schedule=short_ramp(0.98, steps=20)).schedule
    assert [t for t in range(100) if schedule.is_update_step(t)] == list(range(21))
    assert schedule.target(0) == 0.5
    targets = [schedule.target(t) for t in range(21)]
    assert targets == sorted(targets) and targets[-1] == 0.98


def test_a_polynomial_schedule_is_accepted_as_it_is():
    given = PolynomialSchedule(final_sparsity=0.8, begin_step=5, end_step=50, frequency=5, initial_sparsity=0.2, power=2)
    assert PacTrainConfig.from_arguments(schedule=given).schedule == given


@pytest.mark.parametrize("arguments, message", [
    ({"schedule": 0.9}, "schedule must be"),
    ({"schedule": ConstantSparsity(0.9), "begin_step": 0}, "give schedule= or begin_step=, not both"),
    ({"schedule": ConstantSparsity(0.9), "total_steps": 100, "frequency": 5},
     "give schedule= or frequency=, total_steps=, not both"),
    ({"schedule": ConstantSparsity(0.95), "sparsity": 0.8}, "sparsity=0.8 contradicts schedule="),
    ({"schedule": ConstantSparsity(0.95), "sparsity": 0.9}, "sparsity=0.9 contradicts schedule="),  # the default's value
])
def test_schedule_arguments_are_refused_by_name(arguments, message):
    with pytest.raises((TypeError, ValueError), match=message):
        PacTrainConfig.from_arguments(**arguments)


def test_the_sparsity_argument_may_repeat_the_schedules_and_left_out_is_0_9():
    assert PacTrainConfig.from_arguments(schedule=ConstantSparsity(0.95), sparsity=0.95).sparsity == 0.95
    assert PacTrainConfig.from_arguments(sparsity=None).sparsity == PacTrainConfig.from_arguments().sparsity == 0.9


@pytest.mark.parametrize("make, message", [
    (lambda: ConstantSparsity(1.0), "sparsity must be in"),
    (lambda: ConstantSparsity("0.9"), "sparsity must be a number"),
    (lambda: ConstantSparsity(0.9, begin_step=-1), "begin_step must be >= 0"),
    (lambda: ConstantSparsity(0.9, begin_step=10, end_step=5), "end_step .5. must be >= begin_step"),
    (lambda: PolynomialDecay(0.5, 0.9, begin_step=0, end_step=10, frequency=0), "frequency must be > 0"),
    (lambda: PolynomialDecay(-0.1, 0.9, begin_step=0, end_step=10), "initial_sparsity must be in"),
    (lambda: PolynomialDecay(0.1, 0.9, begin_step=0, end_step=10, power=0), "power must be >= 1"),
    (lambda: short_ramp(0.9, steps=-1), "steps must be an int >= 0"),
])
def test_schedule_objects_check_their_fields(make, message):
    with pytest.raises((TypeError, ValueError), match=message):
        make()


@pytest.mark.parametrize("arguments", [
    {"schedule": ConstantSparsity(0.9)},
    {"sparsity": 0.9, "begin_step": 0, "end_step": 0},
    {"schedule": short_ramp(0.9, steps=10)},
])
def test_rescale_survivors_goes_with_a_schedule_that_prunes_at_step_0(arguments):
    config = PacTrainConfig.from_arguments(rescale_survivors=True, **arguments)
    assert config.rescale_survivors and config.shared_settings()["rescale_survivors"] is True


@pytest.mark.parametrize("arguments, message", [
    ({"total_steps": 1000}, "first prunes at step 100"),
    ({"schedule": ConstantSparsity(0.9, begin_step=5)}, "first prunes at step 5"),
    ({"schedule": PolynomialDecay(0.0, 0.9, begin_step=0, end_step=10)}, "first prunes at step 0 to sparsity 0"),
])
def test_rescale_survivors_is_refused_where_step_0_prunes_nothing(arguments, message):
    with pytest.raises(ValueError, match=f"rescale_survivors=True needs a schedule that prunes at step 0.*{message}"):
        PacTrainConfig.from_arguments(rescale_survivors=True, **arguments)


def test_rescale_survivors_must_be_a_bool():
    with pytest.raises(TypeError, match="rescale_survivors must be a bool, got 1"):
        PacTrainConfig.from_arguments(rescale_survivors=1, schedule=ConstantSparsity(0.9))


def test_the_config_keeps_the_schedule_object_it_was_given_and_asks_it():
    given = ConstantSparsity(0.95, begin_step=0, end_step=200, frequency=100)
    config = PacTrainConfig.from_arguments(schedule=given)
    assert config.schedule is given and config == PacTrainConfig.from_arguments(schedule=given)
    assert [given.is_update_step(s) for s in (0, 50, 100, 200, 300)] == [True, False, True, True, False]
    assert given.target(150) == 0.95 and given.next_update_after(100) == 200 and given.last_update_at_or_before(99) == 0
    assert (config.sparsity, config.begin_step, config.end_step, config.frequency) == (0.95, 0, 200, 100)
    built = PacTrainConfig.from_arguments(sparsity=0.8, total_steps=1000).schedule
    assert built == PolynomialSchedule(0.8, begin_step=100, end_step=600, frequency=50) and built.polynomial() is built
