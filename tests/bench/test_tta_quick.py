"""Time to accuracy end to end: ``python -m benchmarks tta --quick`` in a subprocess.

Real training of the image workload (FashionVGG, 4.3 M parameters) for a few steps per method,
each worker behind its emulated 100 Mbit/s NIC, PacTrain on Horovod and on torch DDP. Asserts bytes
and sanity, not speed.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.links.links import namespaces_unavailable

REPO = Path(__file__).resolve().parents[2]
GRADIENT_MB = 4_337_322 * 4 / 1e6  # FashionVGG's fp32 gradient

pytestmark = pytest.mark.skipif(bool(namespaces_unavailable()), reason=namespaces_unavailable() or "")


def test_quick_time_to_accuracy(tmp_path):
    record_path = tmp_path / "record.json"
    run = subprocess.run([sys.executable, "-m", "benchmarks", "tta", "--quick", "--record", str(record_path)],
                         cwd=REPO, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    cell = json.loads(record_path.read_text())["cells"]["image/100mbit/2w"]
    assert cell["probed_mbit_per_s"] == pytest.approx(100, rel=0.15)
    runs = cell["runs"]
    assert set(runs) == {"dense", "fp16", "topk", "powersgd", "pactrain-0.9-fp16", "pactrain-0.95-ternary-w0-0",
                         "ddp-pactrain-0.9-fp16"}
    for method, result in runs.items():
        assert [point[1] for point in result["curve"]] == [3, 6], method
        assert all(0.0 <= point[2] <= 1.0 for point in result["curve"]), method
        assert result["parameters"] == 4_337_322 and result["size"] == 2
    nic_mb = {method: sum(r["nic_tx_bytes"]) / 2 / 1e6 for method, r in runs.items()}
    # Dense ring all-reduce of 2 workers: each sends one gradient per step, plus the start-up broadcast.
    assert 6 * GRADIENT_MB <= nic_mb["dense"] <= 1.4 * 7 * GRADIENT_MB, nic_mb
    assert nic_mb["fp16"] == pytest.approx(nic_mb["dense"] / 2, rel=0.25), nic_mb
    for method in ("topk", "powersgd", "pactrain-0.9-fp16", "pactrain-0.95-ternary-w0-0", "ddp-pactrain-0.9-fp16"):
        assert nic_mb[method] < nic_mb["fp16"], nic_mb
    for method in ("pactrain-0.9-fp16", "ddp-pactrain-0.9-fp16"):  # the same schedule on Horovod and on DDP
        assert runs[method]["sparsity"] == pytest.approx(0.9, abs=0.01), method
    first = runs["pactrain-0.95-ternary-w0-0"]  # sparse from the first step: step 1 already hands the final bytes
    assert first["sparsity"] == pytest.approx(0.95, abs=0.01) and len(first["handed_bytes"]) == 6
    assert len(set(first["handed_bytes"])) == 1 and len(set(first["packed_tensors"])) == 1 and first["packed_tensors"][0] > 0
    assert first["handed_bytes"][0] < 0.2 * GRADIENT_MB * 1e6 / 2  # under a fifth of fp16's bytes
    gradual = runs["pactrain-0.9-fp16"]["handed_bytes"]  # the default window starts dense
    assert gradual[0] > first["handed_bytes"][0]
    report = (tmp_path / "results.md").read_text()
    assert "| pactrain-0.9-fp16 |" in report and (tmp_path / "image-100mbit-2w.png").is_file()


def test_one_command_mixes_torch_and_tensorflow_methods(tmp_path):
    """``tf-`` methods go to the TensorFlow worker (same flags, same record), beside torch's."""
    record_path = tmp_path / "record.json"
    run = subprocess.run([sys.executable, "-m", "benchmarks", "tta", "--workloads", "image", "--links", "100mbit",
                          "--workers", "2", "--steps", "4", "--eval-every", "2", "--eval-samples", "1000",
                          "--methods", "fp16", "tf-fp16", "tf-pactrain-0.95-ternary-w0-0", "--record", str(record_path)],
                         cwd=REPO, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    cell = json.loads(record_path.read_text())["cells"]["image/100mbit/2w"]
    runs = cell["runs"]
    assert cell["bound"]["framework"] == "torch"  # a mixed part: torch's bound
    for method, result in runs.items():
        assert [point[1] for point in result["curve"]] == [2, 4], method
        assert all(0.0 <= point[2] <= 1.0 for point in result["curve"]), method
        assert result["parameters"] == 4_337_322 and result["size"] == 2 and result["batch_size"] == 64
        assert result.get("framework", "torch") == ("tensorflow" if method.startswith("tf-") else "torch")
    nic_mb = {method: sum(r["nic_tx_bytes"]) / 2 / 1e6 for method, r in runs.items()}
    assert nic_mb["tf-fp16"] == pytest.approx(nic_mb["fp16"], rel=0.25), nic_mb  # the same fp16 ring, 4 steps
    sparse = runs["tf-pactrain-0.95-ternary-w0-0"]  # sparse from the first step, as torch's
    assert sparse["sparsity"] == pytest.approx(0.95, abs=0.01) and len(set(sparse["handed_bytes"])) == 1
    assert sparse["handed_bytes"][0] < 0.2 * GRADIENT_MB * 1e6 / 2 and nic_mb["tf-pactrain-0.95-ternary-w0-0"] < nic_mb["tf-fp16"]
    assert "| tf-pactrain-0.95-ternary-w0-0 |" in (tmp_path / "results.md").read_text()
