"""Horovod elastic: SIGKILL one of two workers mid-run; training rolls back to the last commit and finishes.

The same timeline for PyTorch (``hvd.elastic.TorchState``), Keras 3 and tf-keras 2
(``ptk.elastic.KerasState``).

Two host names that both mean this machine (``localhost:1``, ``127.0.0.1:1``) from a discovery
script: Horovod blacklists the host of a failed worker, and with a single host name it would
blacklist the whole job. ``--blacklist-cooldown-range 1 2`` brings the killed worker's host back
after about 2 s, so a fresh worker joins the survivor and receives its state.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

WORKERS = {  # case: (worker script, extra environment, extra arguments)
    "torch": ("elastic_worker.py", {}, []),
    "torch-ternary": ("elastic_worker.py", {}, ["--packed-values", "ternary"]),
    "keras3": ("keras_elastic_worker.py", {}, []),
    "tf-keras2": ("keras_elastic_worker.py", {"TF_USE_LEGACY_KERAS": "1"}, []),
}
HOROVODRUN = Path(sys.executable).with_name("horovodrun")
STEPS, COMMIT_EVERY, KILL_AT, REJOIN_BY = 24, 4, 10, 12
TIMEOUT_S = 300


def read_logs(out: Path) -> dict[int, list[dict]]:
    logs = {}
    for path in sorted(out.glob("log.*.jsonl")):
        lines = path.read_text().splitlines()
        logs[int(path.name.split(".")[1])] = [json.loads(line) for line in lines if line.endswith("}")]
    return logs


def kill_tree(launcher: subprocess.Popen, out: Path, worker: Path) -> None:
    """Kill horovodrun, its descendants (workers run in sessions of their own) and every logged worker."""
    pids = {launcher.pid}
    try:
        pids.update(child.pid for child in psutil.Process(launcher.pid).children(recursive=True))
    except psutil.NoSuchProcess:
        pass
    for pid in read_logs(out):
        try:
            if str(worker) in " ".join(psutil.Process(pid).cmdline()):
                pids.add(pid)
        except psutil.NoSuchProcess:
            pass
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    launcher.wait(timeout=30)


def load_final(path: Path) -> tuple[dict, dict, dict]:
    """(counters, weights, masks) a worker saved at the end."""
    with np.load(path) as saved:
        counters = {key: int(saved[key]) for key in ("step", "opt_step", "size")}
        weights = {key.split("|", 1)[1]: saved[key] for key in saved.files if key.startswith("weight|")}
        masks = {key.split("|", 1)[1]: saved[key] for key in saved.files if key.startswith("mask|")}
    return counters, weights, masks


@pytest.mark.skipif(not HOROVODRUN.exists(), reason="horovodrun is not installed beside this Python")
@pytest.mark.parametrize("frontend", sorted(WORKERS))
def test_kill_one_worker_rolls_back_to_commit_and_the_rejoined_worker_gets_the_masks(tmp_path, frontend):
    script, extra_env, extra_args = WORKERS[frontend]
    worker = Path(__file__).with_name(script)
    out = tmp_path / "out"
    out.mkdir()
    discovery = tmp_path / "discover.sh"
    discovery.write_text("#!/bin/sh\necho localhost:1\necho 127.0.0.1:1\n")
    discovery.chmod(0o755)
    command = [str(HOROVODRUN), "-np", "2", "--min-np", "1", "--max-np", "2", "--host-discovery-script", str(discovery),
               "--blacklist-cooldown-range", "1", "2", "--gloo",
               sys.executable, str(worker), "--out", str(out), "--steps", str(STEPS),
               "--commit-every", str(COMMIT_EVERY), "--kill-at", str(KILL_AT), "--rejoin-by", str(REJOIN_BY),
               *extra_args]
    # A joining worker spends tens of seconds importing torch on a loaded machine while the survivor
    # waits for it in hvd.init(); Gloo's default rendezvous timeout is 30 s.
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               HOROVOD_GLOO_TIMEOUT_SECONDS=os.environ.get("HOROVOD_GLOO_TIMEOUT_SECONDS", "180"), **extra_env)
    with open(tmp_path / "horovodrun.log", "w") as launcher_log:
        launcher = subprocess.Popen(command, stdout=launcher_log, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)
    victim_file, deadline = out / "victim.pid", time.time() + TIMEOUT_S
    try:
        while not victim_file.exists() and launcher.poll() is None and time.time() < deadline:
            time.sleep(0.2)
        assert victim_file.exists(), "no worker reached the kill point:\n" + (tmp_path / "horovodrun.log").read_text()[-4000:]
        victim = int(victim_file.read_text())
        os.kill(victim, signal.SIGKILL)
        returncode = launcher.wait(timeout=max(1.0, deadline - time.time()))
    finally:
        kill_tree(launcher, out, worker)
    assert returncode == 0, (tmp_path / "horovodrun.log").read_text()[-6000:]

    logs = read_logs(out)
    survivors = [pid for pid, events in logs.items() if any(e["event"] == "reset" for e in events)]
    assert len(survivors) == 1 and victim not in survivors, {pid: len(events) for pid, events in logs.items()}
    survivor = survivors[0]
    survivor_events = logs[survivor]
    rejoined = [pid for pid in logs if pid not in (victim, survivor)]
    assert len(rejoined) == 1, f"expected one respawned worker, got {rejoined}"
    rejoined_events = logs[rejoined[0]]
    first_reset = next(i for i, e in enumerate(survivor_events) if e["event"] == "reset")

    # The victim stopped before step KILL_AT; the survivor had trained past the commit at KILL_AT - 2.
    assert max(e["step"] for e in logs[victim] if e["event"] == "step") == KILL_AT
    commit = KILL_AT - KILL_AT % COMMIT_EVERY
    commits = {e["step"]: e for e in survivor_events if e["event"] == "commit"}
    steps_before_kill = [e for e in survivor_events[:first_reset] if e["event"] == "step"]
    assert steps_before_kill[-1]["step"] == KILL_AT
    # The uncommitted steps changed the masks (schedule step 8), so the rollback is visible in them.
    assert steps_before_kill[-1]["masks"] != commits[commit]["masks"]

    # Rollback: the first reset after the kill restored step, schedule position and masks of the commit.
    reset = survivor_events[first_reset]
    assert (reset["step"], reset["opt_step"], reset["size"]) == (commit, commit, 1)
    assert reset["masks"] == commits[commit]["masks"]

    # Rejoin: both workers enter the training function at the same commit with the same masks.
    rejoin = next(e for e in rejoined_events if e["event"] == "enter")
    survivor_rejoin = next(e for e in survivor_events if e["event"] == "enter" and e["size"] == 2 and e["step"] > 0)
    assert rejoin["size"] == 2 and rejoin["step"] == survivor_rejoin["step"] >= REJOIN_BY
    assert rejoin["opt_step"] == survivor_rejoin["opt_step"] == rejoin["step"]
    assert rejoin["masks"] == survivor_rejoin["masks"]
    # Masks kept changing after the rejoin (steps 14, 17, 20) and stayed equal on both workers.
    after = {pid: [(e["step"], e["masks"]) for e in logs[pid] if e["event"] == "step" and e["step"] > rejoin["step"]]
             for pid in (survivor, rejoined[0])}
    assert after[survivor] == after[rejoined[0]]
    assert len({masks for _, masks in after[survivor]}) >= 3
    if frontend == "torch-ternary":  # ternary digits follow the world size: 13 per word for 2 ranks, 19 alone
        lanes = {(e["size"], e["lanes"]) for e in survivor_events if e["event"] == "step"}
        assert lanes == {(2, 13), (1, 19)}, lanes

    finals = [load_final(out / f"final.rank{rank}.npz") for rank in (0, 1)]
    for counters, _, _ in finals:
        assert counters == {"step": STEPS, "opt_step": STEPS, "size": 2}
    (_, weights, masks), (_, other_weights, other_masks) = finals
    assert weights.keys() == other_weights.keys()
    for name, weight in weights.items():
        np.testing.assert_array_equal(weight, other_weights[name], err_msg=name)
    assert masks.keys() == other_masks.keys() and len(masks) == 3  # the three weight matrices
    for name, mask in masks.items():
        np.testing.assert_array_equal(mask, other_masks[name], err_msg=name)
        assert abs(mask.mean() - 0.1) < 0.01, name  # final sparsity 0.9
        assert np.count_nonzero(weights[name][~mask]) == 0, name
