"""The Python snippets of README.md and docs/*.md run, on 2 ranks, and leave what they promise.

Each ```python block carries a marker (tests/docs/doc_examples.py): the Horovod ones run under
``horovodrun -np 2 -H localhost:2 --gloo`` (one job per framework), the DDP ones under
``torchrun --nproc-per-node 2``; every rank then asserts that its weights are bitwise rank 0's and
that every pruned weight is exactly 0. A partial snippet is reported here as skipped, with its reason.
A renamed argument, a missing import or a changed default in the documented API fails these tests.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from doc_examples import KINDS, ROOT, python_blocks, runnable

RUNNER = Path(__file__).with_name("run_examples.py")
TIMEOUT_S = 600
OK = re.compile(r"ok (\S+) \[rank (\d)\]: ranks identical(?:, (\d+) pruned weights 0)?")


def test_every_python_block_says_how_it_runs():
    unmarked = [b.id for b in python_blocks() if b.kind not in KINDS]
    assert not unmarked, f"a ```python block without <!-- example: {'|'.join(KINDS)} ... --> before it: {unmarked}"
    assert all(b.setup for b in python_blocks() if b.kind == "partial"), "a partial snippet says why"


@pytest.mark.parametrize("block", runnable("partial"), ids=lambda b: b.id)
def test_partial_snippet(block):
    compile(block.code.replace("...", "None"), block.id, "exec")  # still Python, even when partial
    pytest.skip(f"partial snippet, not run: {block.setup}")


def launcher(kind: str) -> list[str]:
    if kind == "ddp":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    horovodrun = Path(sys.executable).with_name("horovodrun")
    return [str(horovodrun) if horovodrun.exists() else shutil.which("horovodrun") or "horovodrun",
            "-np", "2", "-H", "localhost:2", "--gloo"]


@pytest.mark.parametrize("kind", ["torch", "tensorflow", "ddp"])
def test_snippets_run_on_two_ranks(kind):
    pytest.importorskip("horovod.torch" if kind != "tensorflow" else "horovod.tensorflow")
    blocks = runnable(kind)
    assert blocks, f"no {kind} snippets"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               TF_CPP_MIN_LOG_LEVEL="3", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    python = [] if kind == "ddp" else [sys.executable]  # torchrun takes the script, horovodrun the command
    command = [*launcher(kind), *python, str(RUNNER), kind]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{' '.join(command)} exited {result.returncode}:\n{output[-6000:]}"
    found = {(m.group(1), m.group(2)): m.group(3) for m in OK.finditer(output)}
    for block in blocks:
        for rank in ("0", "1"):
            assert (block.id, rank) in found, f"{block.id} reported nothing on rank {rank}:\n{output[-4000:]}"
        if block.page.name == "README.md":  # the landing page's snippets train past their schedule
            assert int(found[(block.id, "0")] or 0) > 0, f"{block.id}: nothing pruned"
    print("\n".join(line for line in output.splitlines() if OK.search(line)))
