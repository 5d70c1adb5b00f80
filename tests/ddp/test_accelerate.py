"""Hugging Face Accelerate's recipe for the DDP hook, with the real package, 2 processes under torchrun (CPU)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.runner.jobs import free_port

pytest.importorskip("accelerate")
WORKER = Path(__file__).with_name("accelerate_worker.py")


def test_accelerate_prepared_optimizer_and_checkpointing(tmp_path):
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
               "--master-port", str(free_port()), str(WORKER), str(tmp_path / "state")]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=180, cwd=tmp_path)
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"the Accelerate job hung:\n{expired.stdout}\n{expired.stderr}")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert sorted(re.findall(r"OK rank (\d)", done.stdout)) == ["0", "1"], done.stdout[-3000:]  # lines may interleave
