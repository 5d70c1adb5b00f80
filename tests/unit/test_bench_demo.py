"""``make demo``'s table, bytes and plot, and the benchmark's job count, from made-up runs."""

import json

import pytest

from benchmarks.demo.demo import DemoRun, aligned_table, plot_curves, results_table, write_outputs
from benchmarks.links.links import LinkSpec, Loopback, in_namespace
from benchmarks.runner.config import BenchConfig, job_count


def made_up(title, samples_per_s, accuracy, sent, nic=None, wall=60.0):
    result = {"samples_per_s": samples_per_s, "test_accuracy": accuracy, "sent_bytes_per_step": sent,
              "world_size": 2, "curve": [[0.0, 0, 0.1], [10.0, 60, 0.8], [20.0, 120, accuracy]]}
    return DemoRun(title, [], result=result, wall_s=wall, nic_tx_bytes_per_step=nic)


def test_the_table_on_emulated_links_reads_the_nic_counters():
    runs = [made_up("dense Horovod", 202.4, 0.8525, 6.52e6, nic=6.97e6, wall=85.2),
            made_up("PacTrain 0.9", 897.0, 0.8455, 1.20e6, nic=1.33e6, wall=26.4)]
    assert results_table(runs) == (
        "| run           | samples/s | MB/step on the NIC | test accuracy | wall time |\n"
        "|---------------|----------:|-------------------:|--------------:|----------:|\n"
        "| dense Horovod |       202 |               6.97 |         0.853 |      85 s |\n"
        "| PacTrain 0.9  |       897 |               1.33 |         0.846 |      26 s |\n"
        "\n"
        "PacTrain: 4.4x the samples/s of dense Horovod, 5.2x fewer bytes per step, test accuracy -0.7 points.")


def test_on_loopback_the_bytes_are_the_ring_all_reduce_of_what_horovod_was_handed():
    runs = [made_up("dense Horovod", 2000, 0.85, 6.0e6), made_up("PacTrain 0.9", 1500, 0.84, 1.5e6)]
    assert runs[0].mb_per_step == pytest.approx(6.0)  # 2 (n-1)/n B, n = 2
    table = results_table(runs)
    assert table.splitlines()[0].startswith("| run           | samples/s | MB/step (estimated) |")
    assert "| PacTrain 0.9  |      1500 |                1.50 |         0.840 |      60 s |" in table.splitlines()
    assert "0.8x the samples/s" in table and "4.0x fewer bytes" in table


def test_aligned_table_pads_every_column():
    assert aligned_table(["a", "bb"], [["xyz", "1"]]).splitlines() == ["| a   | bb |", "|-----|---:|", "| xyz |  1 |"]


def test_plot_curves_writes_a_png(tmp_path):
    runs = [made_up("dense Horovod", 200, 0.85, 6e6), made_up("PacTrain 0.9", 900, 0.84, 1.2e6)]
    path = plot_curves(runs, "test", tmp_path / "demo.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_loopback_runs_commands_here():
    assert in_namespace(Loopback(2).worker_namespace(0), ["python", "x.py"]) == ["python", "x.py"]
    assert in_namespace("ns", ["python"]) == ["ip", "netns", "exec", "ns", "python"]
    assert Loopback(2).worker_device(1) == "lo"


def test_job_count_counts_bounds_methods_and_rounds_of_blocks_not_wholly_skipped():
    config = BenchConfig(models=["resnet18", "vgg16"], methods=["dense", "pactrain-0.9"],
                         links=[LinkSpec(100.0), LinkSpec(None)], repeats=2, skip=["vgg16/unthrottled/*"])
    assert job_count(config) == 3 * 2 * 3  # 3 blocks (model, link) x 2 rounds x (bound + 2 methods)


def test_write_outputs_puts_table_notes_and_picture_side_by_side(tmp_path):
    runs = [made_up("dense Horovod", 200, 0.85, 6e6, nic=6.9e6), made_up("PacTrain 0.9", 900, 0.84, 1.2e6, nic=1.3e6)]
    table, picture = write_outputs(runs, "emulated 100 Mbit/s link per worker", tmp_path / "demo")
    assert picture == tmp_path / "demo" / "demo.png" and picture.is_file()
    markdown = (tmp_path / "demo" / "results.md").read_text()
    assert markdown.startswith("`make demo`, link: emulated 100 Mbit/s link per worker.\n\n| run ")
    assert "- MB/step on the NIC: each worker's kernel tx counter" in table and table in markdown
    assert markdown.endswith("![test accuracy against training time](demo.png)\n")
    saved = json.loads((tmp_path / "demo" / "results.json").read_text())
    assert [run["mb_per_step"] for run in saved["runs"]] == pytest.approx([6.9, 1.3])


def test_the_table_compares_pactrain_with_horovod_fp16_too():
    runs = [made_up("dense Horovod", 200, 0.85, 6e6, nic=7.0e6), made_up("Horovod fp16", 350, 0.85, 3e6, nic=3.5e6),
            made_up("PacTrain 0.9", 800, 0.84, 1.2e6, nic=1.4e6)]
    table = results_table(runs)
    assert [line.split("|")[1].strip() for line in table.splitlines()[2:5]] == ["dense Horovod", "Horovod fp16", "PacTrain 0.9"]
    assert table.endswith("Against Horovod fp16: 2.3x the samples/s, 2.5x fewer bytes per step.")


def test_the_demo_writes_to_an_untracked_folder_unless_asked_to_record():
    from benchmarks.demo.demo import REPO, parse_args

    assert parse_args([]).out == REPO / "demo-output"
    assert parse_args(["--record"]).out == REPO / "reports" / "demo"
