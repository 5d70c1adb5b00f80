"""Scripts written in Horovod's idiom, with the PacTrain lines (optimizer or tape, callbacks by prefix), run as
a Horovod user runs them: ``horovodrun -np 2 -H localhost:2 --gloo``, once under Keras 3 and once under tf-keras
2 (``TF_USE_LEGACY_KERAS=1``), each job under a timeout. Every script ends by proving on every rank that ranks
hold the same weights, optimizer variables and masks (allgathered, compared bitwise) and that pruned weights
are 0 (``checks.py``); one job runs them all (``run_all.py``), one TensorFlow start per rank and Keras.
"""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
HOROVODRUN = Path(sys.executable).with_name("horovodrun")
SCRIPTS = ["tape_loop.py", "keras_fit.py", "keras_synthetic_benchmark.py", "keras_elastic.py"]
TIMEOUT_S = int(os.environ.get("PACTRAIN_COMPAT_TIMEOUT", "300"))


@pytest.mark.skipif(not HOROVODRUN.exists(), reason="horovodrun is not installed beside this Python")
@pytest.mark.parametrize("legacy_keras", ["0", "1"], ids=["keras3", "tf-keras2"])
def test_horovod_style_scripts_train_with_ranks_identical(legacy_keras, tmp_path):
    env = dict(os.environ, TF_USE_LEGACY_KERAS=legacy_keras, PYTHONUNBUFFERED="1",
               TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"),
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    command = [str(HOROVODRUN), "-np", "2", "-H", "localhost:2", "--gloo",
               sys.executable, str(HERE / "run_all.py"), *SCRIPTS]
    log = tmp_path / "horovodrun.log"
    with open(log, "w") as output:
        job = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=output, stderr=subprocess.STDOUT,
                               start_new_session=True)
        try:
            returncode = job.wait(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(job.pid, signal.SIGTERM)  # horovodrun ends its workers on SIGTERM
            try:
                job.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(job.pid, signal.SIGKILL)
                job.wait()
            pytest.fail(f"the job ran past {TIMEOUT_S} s:\n" + log.read_text()[-6000:])
    text = log.read_text()
    assert returncode == 0, text[-6000:]
    for script in SCRIPTS:
        for rank in range(2):
            assert f"{script}: rank {rank} agrees on" in text, f"{script} did not finish on rank {rank}:\n{text[-6000:]}"
