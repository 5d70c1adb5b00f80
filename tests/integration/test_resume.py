"""Train k steps, checkpoint, kill the job; resume for m steps: equal to an uninterrupted k + m run."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

WORKER = Path(__file__).with_name("resume_worker.py")
HOROVODRUN = Path(sys.executable).with_name("horovodrun")


def horovodrun(*args: str) -> subprocess.CompletedProcess:
    command = [str(HOROVODRUN), "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, str(WORKER), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONUNBUFFERED="1"))


@pytest.mark.skipif(not HOROVODRUN.exists(), reason="horovodrun is not installed beside this Python")
@pytest.mark.parametrize("values", ["inherit", "ternary"])
def test_resume_after_kill_is_bitwise_an_uninterrupted_run(tmp_path, values):
    checkpoint, resumed, uninterrupted = tmp_path / "ckpt.pt", tmp_path / "resumed.pt", tmp_path / "straight.pt"
    killed = horovodrun("--steps", "7", "--checkpoint", str(checkpoint), "--die-after-checkpoint",
                        "--result", str(tmp_path / "unused.pt"), "--packed-values", values)
    assert killed.returncode != 0, "the first job was meant to die"
    written = [checkpoint] if values == "inherit" else [tmp_path / f"ckpt.pt.rank{rank}" for rank in (0, 1)]
    assert all(path.exists() for path in written)
    for run in (horovodrun("--steps", "8", "--checkpoint", str(checkpoint), "--resume", "--result", str(resumed),
                           "--packed-values", values),
                horovodrun("--steps", "15", "--checkpoint", str(checkpoint), "--result", str(uninterrupted),
                           "--packed-values", values)):
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    a, b = torch.load(resumed), torch.load(uninterrupted)
    for name, tensor in b["model"].items():
        assert torch.equal(a["model"][name], tensor), name
    assert a["optimizer"]["pactrain"]["step"] == b["optimizer"]["pactrain"]["step"] == 15
    for name, mask in b["optimizer"]["pactrain"]["masks"].items():
        assert torch.equal(a["optimizer"]["pactrain"]["masks"][name], mask), name
    for key, state in b["optimizer"]["state"].items():
        assert torch.equal(a["optimizer"]["state"][key]["momentum_buffer"], state["momentum_buffer"])
    if values == "ternary":  # rank 0's error memory carried over exactly (the noise is the step's)
        ours, theirs = a["optimizer"]["pactrain"]["quantized"], b["optimizer"]["pactrain"]["quantized"]
        assert ours["residuals"].keys() == theirs["residuals"].keys() and len(theirs["residuals"]) >= 1
        for name, residual in theirs["residuals"].items():
            assert torch.equal(ours["residuals"][name], residual), name
