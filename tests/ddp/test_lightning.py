"""PyTorch Lightning with the PacTrain callback, the real package, 2 CPU processes (DDP, Gloo), under a timeout,
with accumulate_grad_batches, gradient_clip_val and deterministic=True: ranks identical, zeros kept, packed int3
bytes, and a resume from the one checkpoint rank 0 writes that gives each rank back its own error memory."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("lightning")
WORKER = Path(__file__).with_name("lightning_worker.py")


def run(out: Path, *arguments: str) -> list[dict]:
    out.mkdir()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[2]),
                                                                      os.environ.get("PYTHONPATH")])))
    try:
        done = subprocess.run([sys.executable, str(WORKER), str(out), *arguments], capture_output=True, text=True,
                              timeout=240, cwd=out, env=env)
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"the Lightning job hung:\n{expired.stdout}\n{expired.stderr}")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return [dict(torch.load(out / f"rank{rank}.pt"), start=torch.load(out / f"start{rank}.pt")) for rank in (0, 1)]


def test_lightning_callback_trains_packs_and_resumes_each_ranks_state(tmp_path):
    whole = run(tmp_path / "whole", "8")
    first = run(tmp_path / "first", "4", str(tmp_path / "half.ckpt"))
    resumed = run(tmp_path / "resumed", "8", "--resume", str(tmp_path / "half.ckpt"))
    for ranks in (whole, first, resumed):
        for name, weight in ranks[0]["weights"].items():
            assert torch.equal(weight, ranks[1]["weights"][name]), f"{name} differs across ranks"
    final = whole[0]
    assert final["step"] == 8 and sorted(final["masks"]) == ["net.0.weight", "net.2.weight"]
    for name, mask in final["masks"].items():
        assert int(mask.sum()) == round(0.1 * mask.numel()), name
        assert not final["weights"][name][~mask].any(), f"pruned weights of {name} are not 0"
    assert final["sent_bytes"] < 0.1 * 4 * sum(w.numel() for w in final["weights"].values())  # int32 lane words
    assert resumed[0]["step"] == 8
    for rank in (0, 1):  # each rank resumes with the error memory it saved, from the one file rank 0 wrote
        saved, loaded = first[rank]["memory"], resumed[rank]["start"]
        assert saved.keys() == loaded.keys() and saved
        assert all(torch.equal(saved[name], loaded[name]) for name in saved), f"rank {rank}'s error memory"
    assert any(not torch.equal(first[0]["memory"][n], first[1]["memory"][n]) for n in first[0]["memory"])
