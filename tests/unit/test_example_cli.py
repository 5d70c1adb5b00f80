"""The examples' PacTrain flags (examples/example_support/cli.py) become the schedule they ask for."""

import argparse

import pytest

from example_support.cli import add_pactrain_arguments, schedule_arguments
from pactrain_hvd.core import PacTrainConfig


def parsed(*argv):
    parser = argparse.ArgumentParser()
    add_pactrain_arguments(parser)
    return parser.parse_args(list(argv))


def test_no_flags_leave_the_schedule_to_total_steps():
    schedule = PacTrainConfig.from_arguments(**schedule_arguments(parsed(), 1000)).schedule
    assert (schedule.begin_step, schedule.end_step, schedule.frequency) == (100, 600, 50)


def test_a_window_is_fractions_of_the_run_and_keeps_ten_updates():
    schedule = PacTrainConfig.from_arguments(**schedule_arguments(parsed("--prune-window", "0", "0.3"), 1407)).schedule
    assert (schedule.begin_step, schedule.end_step, schedule.frequency) == (0, 422, 42)


def test_a_number_of_updates_sets_the_frequency_inside_the_window():
    schedule = PacTrainConfig.from_arguments(**schedule_arguments(parsed("--prune-updates", "40"), 1407)).schedule
    assert (schedule.begin_step, schedule.end_step, schedule.frequency) == (140, 844, 17)
    schedule = PacTrainConfig.from_arguments(
        **schedule_arguments(parsed("--prune-window", "0", "0.3", "--prune-updates", "5"), 1407)).schedule
    assert (schedule.begin_step, schedule.end_step, schedule.frequency) == (0, 422, 84)


@pytest.mark.parametrize("argv", [("--prune-updates", "10", "--prune-frequency", "7"), ("--prune-updates", "0")])
def test_updates_with_a_frequency_or_not_positive_are_refused(argv):
    with pytest.raises(SystemExit, match="--prune-updates"):
        schedule_arguments(parsed(*argv), 1000)


@pytest.mark.parametrize("argv", [("--prune-window", "0", "0.3", "--prune-end", "50"),
                                  ("--prune-window", "0.5", "0.2")])
def test_a_window_with_steps_or_backwards_is_refused(argv):
    with pytest.raises(SystemExit, match="--prune-window"):
        schedule_arguments(parsed(*argv), 1000)


def test_a_ramp_packs_from_step_0_and_re_ranks_every_step():
    args = parsed("--sparsity", "0.95", "--prune-ramp", "100")
    schedule = PacTrainConfig.from_arguments(sparsity=args.sparsity, **schedule_arguments(args, 1407)).schedule
    assert (schedule.begin_step, schedule.end_step, schedule.frequency) == (0, 100, 1)
    assert (schedule.initial_sparsity, schedule.final_sparsity) == (0.5, 0.95)


@pytest.mark.parametrize("argv", [("--prune-ramp", "100", "--prune-window", "0", "0.3"),
                                  ("--prune-ramp", "100", "--prune-updates", "5"), ("--prune-ramp", "-1")])
def test_a_ramp_beside_other_prune_flags_or_negative_is_refused(argv):
    with pytest.raises(SystemExit, match="--prune-ramp"):
        schedule_arguments(parsed(*argv), 1000)
