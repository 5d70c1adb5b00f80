"""``pactrain-plan``: end to end on user modules the project never trained, and bad input named by its argument."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pactrain_hvd.planner.cli import link_bits_per_s, main

FIXTURE = Path(__file__).parent / "fixtures" / "planner_resnet50.py"
REPO = Path(__file__).resolve().parents[2]


def test_link_rates():
    assert link_bits_per_s("10gbit") == 10e9
    assert link_bits_per_s("100mbit") == 100e6
    assert link_bits_per_s("1.5Gbps") == 1.5e9
    assert link_bits_per_s("100 Mbit/s") == 100e6


def test_resnet50_sized_user_module_in_seconds(capsys, tmp_path):
    started = time.perf_counter()
    out_json = tmp_path / "plan.json"
    assert main(["--model", f"{FIXTURE}:resnet50", "--workers", "16", "--link", "1gbit", "--step-time", "0.2",
                 "--json", str(out_json)]) == 0
    assert time.perf_counter() - started < 30
    out = capsys.readouterr().out
    assert "25.56 M parameters" in out and "Recommendation:" in out and "Assumed:" in out
    plan = json.loads(out_json.read_text())
    rows = {row["method"]: row for row in plan["rows"]}
    assert rows["dense"]["handed_bytes"] == 4 * 25_557_032
    assert rows["fp16"]["handed_bytes"] == 2 * 25_557_032
    # at 1 Gbit/s and 16 workers a dense ResNet-50 step waits for the network; PacTrain 0.9's does less
    assert rows["pactrain-0.9-fp16"]["step_s"] < rows["dense"]["step_s"]
    assert plan["choice"] != "dense"


def test_a_model_file_imports_its_neighbours(capsys, tmp_path):
    """A FILE.py model resolves its own imports beside it, as ``python FILE.py`` would."""
    (tmp_path / "neighbour_layers.py").write_text("import torch\nWIDTH = 24\n")
    (tmp_path / "net.py").write_text("import torch\nfrom neighbour_layers import WIDTH\n"
                                     "def make():\n    return torch.nn.Linear(WIDTH, 10)\n")
    assert main(["--model", f"{tmp_path / 'net.py'}:make", "--workers", "2", "--link", "1gbit", "--step-time", "0.1"]) == 0
    assert "2 trainable tensors, 250 parameters" in capsys.readouterr().out


def test_compute_bound_cluster_keeps_the_dense_reduction(capsys):
    assert main(["--model", f"{FIXTURE}:tiny", "--workers", "4", "--link", "100gbit", "--step-time", "0.1"]) == 0
    assert "Recommendation: dense: compute-bound" in capsys.readouterr().out


def test_curves_give_time_to_target(capsys, tmp_path):
    curves = tmp_path / "curves.json"
    curves.write_text(json.dumps({"metric": "accuracy", "workers": 2, "target": 0.7, "curves": {
        "dense": [[100, 0.6], [200, 0.7]], "pactrain-0.9-fp16": [[100, 0.6], [200, 0.65], [300, 0.7]],
        "topk": [[100, 0.7]]}}))
    assert main(["--model", f"{FIXTURE}:tiny", "--workers", "8", "--link", "10mbit", "--step-time", "0.01",
                 "--methods", "dense,pactrain-0.9-fp16,topk", "--curve", str(curves)]) == 0
    out = capsys.readouterr().out
    assert "time to target" in out and "(curve of 2 workers)" in out  # Top-k's curve holds for 2 workers only
    assert "target 0.7" in out


def test_cycle_time_and_coordination_on_a_slow_link(capsys, tmp_path):
    """At a few Mbit/s Horovod's coordination costs time at a 1 ms cycle; at 25 ms a step waits up to a cycle for
    its gradients instead (on this tiny model's 1 kB payload, the larger cost)."""
    steps = {}
    for label, extra in (("1 ms", []), ("25 ms", ["--cycle-ms", "25"]),
                         ("none", ["--cycle-bytes", "0", "--overhead-bytes", "0"])):
        out_json = tmp_path / "plan.json"
        assert main(["--model", f"{FIXTURE}:tiny", "--workers", "2", "--link", "5mbit", "--step-time", "0.1",
                     "--methods", "topk-0.001", "--json", str(out_json), *extra]) == 0
        steps[label] = json.loads(out_json.read_text())["rows"][0]["step_s"]
    # at most one cycle, plus the 17.5 kB a step beyond the cycles at 5 Mbit/s
    assert steps["none"] < steps["1 ms"] and steps["none"] < steps["25 ms"] < steps["none"] + 0.025 + 17_500 / 625e3
    assert "242 B each cycle the loop is idle plus 17,500 B a step" in capsys.readouterr().out


@pytest.mark.parametrize("load, said", [(0.5, "load 0.5 on 2 cores)"),
                                        (5.0, "load 5.0 on 2 cores: other work shared the CPU, so these times are high)")])
def test_profile_measures_here_and_names_the_load_it_met(capsys, monkeypatch, load, said):
    monkeypatch.setattr("os.getloadavg", lambda: (load, 0.0, 0.0))
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    assert main(["--model", f"{FIXTURE}:tiny", "--workers", "2", "--link", "100mbit", "--profile",
                 "--input-shape", "1,8,8", "--batch-size", "4", "--methods", "dense,fp16,pactrain-0.9-fp16"]) == 0
    assert f"measured here (cpu, batch 4, {said}: forward + backward" in capsys.readouterr().out


@pytest.mark.parametrize("arguments, named", [
    (["--link", "10"], "--link"),
    (["--workers", "0"], "--workers"),
    (["--step-time", "-1"], "--step-time"),
    (["--latency-ms", "-2"], "--latency-ms"),
    (["--methods", "dense,sgd"], "unknown method 'sgd'"),
    (["--model", "no_such_module_anywhere:make"], "--model"),
    (["--model", f"{FIXTURE}:nothing"], "no attribute 'nothing'"),
    (["--curve", "/no/such/curves.json"], "--curve"),
    (["--compress-time", "fp16"], "--compress-time"),
    (["--cycle-bytes", "-1"], "--cycle-bytes"),
])
def test_bad_input_names_the_argument(capsys, arguments, named):
    base = {"--model": f"{FIXTURE}:tiny", "--workers": "2", "--link": "1gbit", "--step-time": "0.1"}
    given = dict(zip(arguments[::2], arguments[1::2]))
    argv = [item for key, value in {**base, **given}.items() for item in (key, value)]
    assert main(argv) == 2
    assert named in capsys.readouterr().err


def test_profile_needs_an_input_shape(capsys):
    assert main(["--model", f"{FIXTURE}:tiny", "--workers", "2", "--link", "1gbit", "--profile"]) == 2
    assert "--input-shape" in capsys.readouterr().err


def test_step_time_or_profile_is_required(capsys):
    with pytest.raises(SystemExit):
        main(["--model", f"{FIXTURE}:tiny", "--workers", "2", "--link", "1gbit"])
    assert "--step-time" in capsys.readouterr().err


def test_python_dash_m_runs_without_horovod():
    done = subprocess.run([sys.executable, "-m", "pactrain_hvd.planner", "--model", f"{FIXTURE}:tiny", "--workers", "2",
                           "--link", "1gbit", "--step-time", "0.1"], capture_output=True, text=True, timeout=120,
                          cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert "Recommendation:" in done.stdout
    check = ("import sys; from pactrain_hvd.planner.cli import main; "
             f"rc = main(['--model', {str(FIXTURE)!r} + ':tiny', '--workers', '2', '--link', '1gbit', '--step-time', '0.1']); "
             "sys.exit(3 if any(m.split('.')[0] in ('horovod', 'tensorflow') for m in sys.modules) else rc)")
    assert subprocess.run([sys.executable, "-c", check], capture_output=True, timeout=120, cwd=REPO).returncode == 0
