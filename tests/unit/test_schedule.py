import math

import pytest

from pactrain_hvd.core import PolynomialSchedule, rewound_cosine
from pactrain_hvd.core.config import PacTrainConfig
from pactrain_hvd.core.schedule import schedule_steps


def test_cubic_targets_match_zhu_gupta():
    schedule = PolynomialSchedule(final_sparsity=0.9, begin_step=100, end_step=500, frequency=100)
    assert schedule.target(0) == 0.0
    assert schedule.target(100) == 0.0
    assert schedule.target(300) == pytest.approx(0.9 - 0.9 * 0.5**3)
    assert schedule.target(500) == 0.9
    assert schedule.target(10_000) == 0.9


def test_update_steps_include_end_and_stop_after_it():
    schedule = PolynomialSchedule(final_sparsity=0.8, begin_step=10, end_step=35, frequency=10)
    assert [t for t in range(60) if schedule.is_update_step(t)] == [10, 20, 30, 35]
    assert schedule.last_update_at_or_before(9) is None
    assert schedule.last_update_at_or_before(27) == 20
    assert schedule.last_update_at_or_before(99) == 35


def test_one_shot_prunes_once_to_final():
    schedule = PolynomialSchedule(final_sparsity=0.9, begin_step=5, end_step=5, frequency=100)
    assert [t for t in range(20) if schedule.is_update_step(t)] == [5]
    assert schedule.target(5) == 0.9


def test_zero_sparsity_never_updates():
    schedule = PolynomialSchedule(final_sparsity=0.0, begin_step=0, end_step=0)
    assert not any(schedule.is_update_step(t) for t in range(10))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(final_sparsity=1.0), "final_sparsity must be in"),
        (dict(final_sparsity=-0.1), "final_sparsity must be in"),
        (dict(final_sparsity=0.5, begin_step=10, end_step=5), "end_step"),
        (dict(final_sparsity=0.5, frequency=0), "frequency must be > 0"),
        (dict(final_sparsity=0.5, begin_step=-1), "begin_step must be >= 0"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PolynomialSchedule(**kwargs)


def test_non_integer_step_is_rejected():
    with pytest.raises(TypeError, match="frequency must be an int"):
        PolynomialSchedule(final_sparsity=0.5, frequency=2.5)


def test_total_steps_places_the_window_in_the_run():
    assert schedule_steps(total_steps=1000) == (100, 600, 50)
    assert schedule_steps(total_steps=7) == (0, 4, 1)
    assert schedule_steps() == (0, 1000, 100)  # the fixed clock without a run length


def test_given_steps_win_over_the_run_window():
    assert schedule_steps(total_steps=1000, end_step=300) == (100, 300, 20)
    assert schedule_steps(total_steps=1000, begin_step=0, frequency=7) == (0, 600, 7)
    assert schedule_steps(begin_step=5) == (5, 1000, 100)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(total_steps=0), ValueError, "total_steps must be a positive int"),
    (dict(total_steps=10.0), ValueError, "total_steps must be a positive int"),
    (dict(total_steps=10, end_step="5"), TypeError, "end_step must be an int, got str"),
])
def test_bad_run_arguments_name_the_argument(kwargs, error, message):
    with pytest.raises(error, match=message):
        schedule_steps(**kwargs)


def test_config_follows_total_steps():
    schedule = PacTrainConfig.from_arguments(sparsity=0.9, total_steps=2000).schedule
    assert (schedule.begin_step, schedule.end_step, schedule.frequency) == (200, 1200, 100)
    assert schedule.target(1200) == pytest.approx(0.9) and schedule.target(200) == 0.0


@pytest.mark.parametrize("begin, end, frequency", [(0, 10, 3), (5, 5, 1), (2, 20, 5), (0, 0, 7), (3, 9, 100)])
def test_next_update_is_the_schedules_next_update_step(begin, end, frequency):
    schedule = PolynomialSchedule(0.9, begin, end, frequency)
    for step in range(-1, end + 5):
        expected = next((s for s in range(step + 1, end + 1) if schedule.is_update_step(s)), None)
        assert schedule.next_update_after(step) == expected, step
    assert PolynomialSchedule(0.0, 0, 10, 1).next_update_after(-1) is None


def test_rewound_cosine_anneals_again_from_the_first_mask_changes_rate_after_the_last():
    factor = rewound_cosine(PolynomialSchedule(0.8, begin_step=10, end_step=60, frequency=5), 100)
    cosine = [0.5 * (1 + math.cos(math.pi * step / 100)) for step in range(100)]
    rates = [factor(step) for step in range(100)]
    assert rates[:60] == pytest.approx(cosine[:60])
    assert rates[60] == pytest.approx(cosine[10]) and rates[60] > 2 * cosine[60]
    assert all(a >= b for a, b in zip(rates[60:], rates[61:])) and rates[-1] < 0.01


@pytest.mark.parametrize("schedule", [PolynomialSchedule(0.0, begin_step=10, end_step=60),  # nothing to prune
                                      PolynomialSchedule(0.8, begin_step=10, end_step=100)])  # no step after the last change
def test_rewound_cosine_without_a_rewind_is_plain_cosine(schedule):
    factor = rewound_cosine(schedule, 100)
    assert [factor(step) for step in range(100)] == pytest.approx([0.5 * (1 + math.cos(math.pi * s / 100)) for s in range(100)])


@pytest.mark.parametrize("total_steps", [0, -5, 10.0, True])
def test_rewound_cosine_needs_a_positive_int_of_steps(total_steps):
    with pytest.raises(ValueError, match="total_steps"):
        rewound_cosine(PolynomialSchedule(0.8), total_steps)
