"""``example_support.progress``: whole lines off a terminal, the bar only where it reaches one."""

import io

import pytest

from example_support.progress import Progress, progress_line, wants_live_bar


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_lines_at_every_quarter_and_nothing_else():
    stream, clock = io.StringIO(), FakeClock()
    bar = Progress(range(8), desc="epoch 1", stream=stream, live=False, clock=clock)
    for step in bar:
        clock.now += 0.5
        bar.set_postfix(loss=f"{1 / (step + 1):.3f}")
    assert stream.getvalue().splitlines() == [
        "epoch 1:  25% 2/8 steps, 1 s, 2.0 steps/s, loss=0.500",
        "epoch 1:  50% 4/8 steps, 2 s, 2.0 steps/s, loss=0.250",
        "epoch 1:  75% 6/8 steps, 3 s, 2.0 steps/s, loss=0.167",
        "epoch 1: 100% 8/8 steps, 4 s, 2.0 steps/s, loss=0.125",
    ]
    assert "\r" not in stream.getvalue()


def test_a_slow_loop_gets_a_line_every_few_seconds_and_a_last_line_where_it_stopped():
    stream, clock = io.StringIO(), FakeClock()
    with Progress(total=100, desc="bench", unit="job", stream=stream, live=False, every_seconds=10, clock=clock) as bar:
        for _ in range(3):
            clock.now += 6
            bar.update()
    assert stream.getvalue().splitlines() == ["bench:   2% 2/100 jobs, 12 s, 6.0 s/job",
                                              "bench:   3% 3/100 jobs, 18 s, 6.0 s/job"]


def test_disabled_ranks_print_nothing():
    stream = io.StringIO()
    bar = Progress(range(4), stream=stream, enabled=False, live=False)
    assert list(bar) == [0, 1, 2, 3]
    bar.write("rank 1 says")
    assert stream.getvalue() == ""


def test_write_and_unknown_total():
    stream, clock = io.StringIO(), FakeClock()
    bar = Progress(iter(range(3)), desc="", stream=stream, live=False, clock=clock)
    bar.write("Iter #0: 12.5 img/sec")
    for _ in bar:
        clock.now += 1
    assert stream.getvalue().splitlines() == ["Iter #0: 12.5 img/sec", "3 steps, 3 s, 1.0 steps/s"]


def test_the_bar_only_where_it_reaches_a_terminal():
    assert wants_live_bar(Terminal(), environ={}) is True
    assert wants_live_bar(io.StringIO(), environ={}) is False
    assert wants_live_bar(Terminal(), environ={"OMPI_COMM_WORLD_RANK": "0"}) is False  # mpirun's pty
    assert wants_live_bar(io.StringIO(), environ={"PACTRAIN_PROGRESS": "bar"}) is True
    assert wants_live_bar(Terminal(), environ={"PACTRAIN_PROGRESS": "lines"}) is False
    with pytest.raises(ValueError, match="PACTRAIN_PROGRESS must be 'bar' or 'lines', got 'fancy'"):
        wants_live_bar(Terminal(), environ={"PACTRAIN_PROGRESS": "fancy"})


def test_a_live_bar_leaves_no_line_of_its_own():
    stream = Terminal()
    bar = Progress(range(3), desc="epoch 1", stream=stream, live=True)
    bar.write("a message")
    list(bar)
    assert "a message\n" in stream.getvalue()
    assert "epoch 1" in stream.getvalue()  # drawn, then cleared (leave=False)


def test_progress_line_rate_before_any_time_passed():
    assert progress_line("x", 0, 10, 0.0, "step", {}) == "x:   0% 0/10 steps, 0 s, - steps/s"


def test_every_percent_is_checked():
    with pytest.raises(ValueError, match="every_percent must be in"):
        Progress(total=3, every_percent=0, live=False)
