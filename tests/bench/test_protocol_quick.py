"""The protocol's whole path in minutes: ``python -m benchmarks protocol run quick.toml`` in a subprocess.

Both stages of a 4-step protocol, every family (local steps too) behind emulated 100 Mbit/s NICs: the record holds every run
with what a reader needs to recompute the verdicts, and the bytes on the NICs order as the methods send.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.links.links import namespaces_unavailable
from benchmarks.protocol.spec import load_protocol
from benchmarks.protocol.verdicts import verdicts

REPO = Path(__file__).resolve().parents[2]
QUICK = REPO / "benchmarks" / "protocol" / "quick.toml"

pytestmark = pytest.mark.skipif(bool(namespaces_unavailable()), reason=namespaces_unavailable() or "")


def test_quick_protocol(tmp_path):
    record_path = tmp_path / "record.json"
    command = [sys.executable, "-m", "benchmarks", "protocol", "run", str(QUICK), "--record", str(record_path)]
    run = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    protocol = load_protocol(QUICK)
    record = json.loads(record_path.read_text())
    runs = record["runs"]
    assert len(runs) == 18 and record["protocol"]["digest"] == protocol.digest
    assert {(r["stage"], r["seed"]) for r in runs} == {("selection", 0), ("final", 1)}
    for entry in runs:
        assert [point[1] for point in entry["curve"]] == [2, 4] and len(entry["eval_elapsed_s"]) == 2
        assert entry["wall_s"] > entry["elapsed_s"] > entry["train_s"] > 0 and entry["commit"]
        assert entry["data_seed"] == entry["seed"] and set(entry["phases_s_median"]) >= {"compute", "update"}
    linked = {r["method"]: r for r in runs if r["stage"] == "final" and r["cell"] == "image-100mbit"}
    assert linked["pactrain-0.9-int3-w0-0"]["probed_mbit_per_s"] == pytest.approx(100, rel=0.15)
    sent = {method: sum(r["nic_tx_bytes"]) / 2 / r["steps"] for method, r in linked.items()}
    # Survivors of 0.9 in 4-bit codes, then a random tenth in fp16, then every coordinate in fp16.
    assert sent["pactrain-0.9-int3-w0-0"] < sent["randomk-0.1"] < 0.2 * sent["fp16"], sent
    assert 0.85 * 4_337_322 * 2 < sent["fp16"] < 1.3 * 4_337_322 * 2, sent
    # Local steps: one sync every 2 steps, of the survivors in 4-bit codes, or of every coordinate in fp16.
    assert sent["pactrain-0.9-int3-w0-0-sync2"] < 0.75 * sent["pactrain-0.9-int3-w0-0"], sent
    assert 0.3 * sent["fp16"] < sent["diloco-h2-fp16"] < 0.7 * sent["fp16"], sent
    saved = json.loads((tmp_path / "verdicts.json").read_text())
    assert saved == json.loads(json.dumps(verdicts(protocol, record), sort_keys=True))
    assert saved["cells"]["image-100mbit"]["verdicts"]["pactrain"]["train"]["outcome"] in ("win", "loss", "tie")
    assert "| `image-100mbit` |" in (tmp_path / "results.md").read_text()
