"""A mistake on one rank is an error on every rank, never a hang (2 ranks, Gloo, each job under a timeout).

Each case runs ``fault_worker.py`` under ``horovodrun`` and asserts how the job ends: its exit, the error
every rank printed and, where the case is a hang without the check, that every rank ended within 60 s of
Horovod's start (the job as a whole runs under a timeout that turns a hang into a failure).
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("fault_worker.py")
HOROVODRUN = Path(sys.executable).with_name("horovodrun")
HANG_LIMIT_S = 60  # how soon after Horovod's start a rank that would hang without the check must end
JOB_TIMEOUT_S = 150  # a job still running then is a hang: the test fails instead of waiting

pytestmark = pytest.mark.skipif(not HOROVODRUN.exists(), reason="horovodrun is not installed beside this Python")


def job(case: str, frontend: str = "torch", within: list[str] = (), **env_vars: str
        ) -> tuple[subprocess.CompletedProcess, float, dict[int, str]]:
    """Run a case; returns the process, the slowest rank's seconds from Horovod's start to its end (the
    job's seconds where no rank said), and each rank's last FAULT/DONE line. ``keras-legacy``: the Keras
    frontend under tf-keras 2. ``within``: a command prefix (``ip netns exec NS``); ``env_vars``: the job's
    environment besides this one's."""
    legacy = frontend == "keras-legacy"
    command = [*within, str(HOROVODRUN), "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, str(WORKER),
               "--case", case, "--frontend", "keras" if legacy else frontend]
    env = dict(os.environ, PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="3", **env_vars,
               **({"TF_USE_LEGACY_KERAS": "1"} if legacy else {}))
    start = time.monotonic()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=JOB_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"{case} ({frontend}) hung for {JOB_TIMEOUT_S} s:\n{expired.stdout}\n{expired.stderr}")
    reported = [float(seconds) for seconds in re.findall(r"SECONDS rank=\d+ ([\d.]+)", done.stdout)]
    seconds = max(reported) if reported else time.monotonic() - start
    endings = {int(m.group(2)): m.group(1) + m.group(3) for m in
               re.finditer(r"(FAULT|DONE) rank=(\d+)(.*)", done.stdout)}
    return done, seconds, endings


def assert_every_rank_raised(case: str, error: str, *phrases: str, frontend: str = "torch") -> None:
    done, seconds, endings = job(case, frontend)
    shown = done.stdout[-4000:] + done.stderr[-4000:]
    assert done.returncode != 0, shown
    assert sorted(endings) == [0, 1], f"each rank must say how it ended:\n{shown}"
    for rank, ending in endings.items():
        assert ending.startswith(f"FAULT {error}:"), f"rank {rank}: {ending}"
        for phrase in phrases:
            assert phrase in ending, f"rank {rank} does not say {phrase!r}: {ending}"
    assert seconds < HANG_LIMIT_S, f"{case} took {seconds:.0f} s"


@pytest.mark.parametrize("frontend", ["torch", "tensorflow", "tensorflow-broadcast", "keras", "keras-legacy"])
def test_schedule_frequency_that_differs_is_an_error_on_both_ranks_not_a_hang(frontend):
    """Whichever call meets the difference first (the first step, or the mask broadcast of the resume idiom and
    of Keras' broadcast callback) names it on every rank, not as a checkpoint's settings."""
    assert_every_rank_raised("frequency", "SettingsMismatchError", "frequency (rank 0: 4, rank 1: 8)",
                             frontend=frontend)


def test_total_steps_that_differ_by_one_batch_name_the_resolved_steps_and_the_cause():
    assert_every_rank_raised("total_steps", "SettingsMismatchError", "total_steps (rank 0: 110, rank 1: 109)",
                             "end_step (rank 0: 66, rank 1: 65)", "DistributedSampler")


def test_pruning_on_one_rank_only_is_an_error_on_both():
    assert_every_rank_raised("sparsity_off", "SettingsMismatchError", "sparsity (rank 0: 0.5, rank 1: 0.0)")


@pytest.mark.parametrize("frontend", ["torch", "tensorflow"])
def test_nan_weights_at_a_mask_update_raise_and_change_no_mask(frontend):
    """The worker asserts masks unchanged, none all-zero and sparsity below 1 where it catches the error."""
    assert_every_rank_raised("nan", "NonFiniteWeightsError", "No mask was changed", frontend=frontend)


def test_nan_from_one_rank_reaches_every_rank_as_the_same_error():
    assert_every_rank_raised("nan_one_rank", "NonFiniteWeightsError", "weights hold NaN or inf")


def test_weights_never_broadcast_are_named_as_the_cause_of_differing_masks():
    assert_every_rank_raised("no_broadcast", "MaskMismatchError", "Weights differ too", "hvd.broadcast_parameters")


@pytest.mark.parametrize("frontend", ["torch", "horovod"])
def test_an_exception_on_one_rank_ends_the_job_as_with_plain_horovod(frontend):
    done, seconds, endings = job("exception", frontend)
    assert done.returncode != 0
    assert endings.get(1, "").startswith("FAULT RuntimeError: a bug in rank 1"), done.stdout[-3000:]
    assert 0 not in endings or endings[0].startswith("FAULT"), "rank 0 must not report a finished run"
    assert seconds < JOB_TIMEOUT_S


@pytest.mark.parametrize("frontend", ["torch", "horovod"])
def test_a_killed_rank_ends_the_job_as_with_plain_horovod(frontend):
    done, seconds, endings = job("kill", frontend)
    assert done.returncode != 0
    assert 1 not in endings, "rank 1 was killed: it prints nothing"
    assert 0 not in endings or endings[0].startswith("FAULT"), "rank 0 must not report a finished run"
    assert seconds < JOB_TIMEOUT_S


def test_a_rank_killed_inside_a_mask_update_ends_the_job_as_a_kill_elsewhere_does():
    done, seconds, endings = job("kill_in_mask_update")
    assert done.returncode != 0
    assert 1 not in endings, "rank 1 was killed while ranking masks: it prints nothing"
    assert 0 not in endings or endings[0].startswith("FAULT"), "rank 0 must not report a finished run"
    assert seconds < JOB_TIMEOUT_S


@pytest.mark.parametrize("frontend", ["torch", "horovod"])
def test_a_rank_stopped_past_the_gloo_timeout_ends_the_job_as_with_plain_horovod(frontend):
    """Rank 1 is stopped (SIGSTOP) for 20 s under a 5 s Gloo timeout, then continued: the job ends, non-zero,
    through Horovod's own timeout handling, with PacTrain as with ``hvd.DistributedOptimizer``."""
    done, seconds, endings = job("stop", frontend, HOROVOD_GLOO_TIMEOUT_SECONDS="5")
    assert done.returncode != 0, done.stdout[-3000:]
    assert not any(ending.startswith("DONE") for ending in endings.values()), endings
    assert seconds < JOB_TIMEOUT_S


@pytest.fixture()
def lossy_namespace():
    """A network namespace whose loopback drops 3 % of packets and holds each for 5 ms (iptables' random match and
    NFQUEUE with ``benchmarks.links.delay``); skipped where this machine cannot make one."""
    from benchmarks.links.links import namespaces_unavailable

    if namespaces_unavailable() or not shutil.which("iptables-legacy"):
        pytest.skip(namespaces_unavailable() or "iptables-legacy is not installed")
    name = f"ptb-{os.getpid()}-faults"
    inside = ["ip", "netns", "exec", name]
    delay = None
    try:
        subprocess.run(["ip", "netns", "add", name], check=True)
        for rule in (["ip", "link", "set", "lo", "up"],
                     ["iptables-legacy", "-A", "INPUT", "-i", "lo", "-m", "statistic", "--mode", "random",
                      "--probability", "0.03", "-j", "DROP"],
                     ["iptables-legacy", "-A", "INPUT", "-i", "lo", "-j", "NFQUEUE", "--queue-num", "0"]):
            subprocess.run(inside + rule, check=True)
        delay = subprocess.Popen(inside + [sys.executable, "-m", "benchmarks.links.delay", "--delay-ms", "5"],
                                 stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2])
        assert delay.stdout.readline().strip() == "ready"
        yield inside
    finally:
        if delay is not None:
            delay.kill()
            delay.wait()
        subprocess.run(["ip", "netns", "del", name], check=False)


def test_lost_and_delayed_packets_change_no_weight(lossy_namespace):
    """TCP recovers what the link loses: the job behind a lossy, slow loopback ends with the weights of a clean one."""
    runs = {}
    for where, within in (("clean", []), ("lossy", lossy_namespace)):
        done, _, endings = job("clean", within=within)
        assert done.returncode == 0 and sorted(endings) == [0, 1], done.stdout[-3000:] + done.stderr[-3000:]
        runs[where] = endings
    assert runs["lossy"] == runs["clean"] and runs["clean"][0].startswith("DONE steps=12 weights="), runs


@pytest.mark.parametrize("mode", ["plain", "inherit", "int3"])
def test_a_killed_ddp_peer_is_an_error_on_the_surviving_rank_as_with_plain_ddp(mode):
    """Under the DDP hook, as under DDP's own all-reduce, the surviving rank raises Gloo's peer-loss error and exits
    non-zero. Gloo's own threads sometimes abort that exit (SIGABRT: ``terminate called ...``) after the error was
    raised, with either hook: a Gloo defect at teardown, so an abort is accepted where the error came first."""
    from benchmarks.runner.jobs import free_port

    worker = Path(__file__).with_name("ddp_peer_worker.py")
    for _ in range(2):
        port = str(free_port())
        peer = subprocess.Popen([sys.executable, str(worker), "1", mode, port], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            done = subprocess.run([sys.executable, str(worker), "0", mode, port], capture_output=True, text=True,
                                  timeout=JOB_TIMEOUT_S)
        finally:
            peer.kill()
            peer.wait()
        lost = re.search(r"PEER-LOST RuntimeError: .*gloo", done.stdout)  # reset, closed, broken pipe or timed out
        assert lost, done.stdout[-2000:] + done.stderr[-2000:]
        assert done.returncode in (1, -signal.SIGABRT), f"exit {done.returncode}: {done.stderr[-2000:]}"
        if done.returncode != 1:  # Gloo's teardown: "terminate called after throwing ... gloo::IoException" or
            assert "terminate called" in done.stderr, done.stderr[-2000:]  # "... without an active exception"
