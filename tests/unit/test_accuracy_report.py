"""The accuracy report's plan and table (benchmarks/accuracy/accuracy.py), on made-up run results."""

import json
from pathlib import Path

import pytest

from benchmarks.accuracy import accuracy


def test_plan_runs_dense_once_per_seed_and_every_variant_per_seed():
    args = accuracy.parse_args(["--tasks", "image", "--sparsities", "0", "0.9", "--rankings", "layer", "erk"])
    names = [run.name for run in accuracy.planned_runs(args)]
    assert names == ["image-s0-seed1", "image-s0-seed2", "image-s0.9-seed1", "image-s0.9-seed2",
                     "image-s0.9-erk-seed1", "image-s0.9-erk-seed2"]
    flags = accuracy.example_args(accuracy.planned_runs(args)[4], args, Path("r.json"))
    assert flags[:2] == ["--model", "vgg"] and flags[flags.index("--ranking") + 1] == "erk"
    assert flags[flags.index("--seed") + 1] == "1" and flags[flags.index("--packed-values") + 1] == "inherit"


def test_a_window_other_than_the_default_is_a_variant_with_its_own_flag_and_row():
    args = accuracy.parse_args(["--tasks", "image", "--sparsities", "0", "0.9", "--seeds", "1",
                                "--windows", "0-0.30", "0.1-0.6"])
    runs = accuracy.planned_runs(args)
    assert [run.name for run in runs] == ["image-s0-seed1", "image-s0.9-erk-w0-0.3-seed1", "image-s0.9-erk-seed1"]
    flags = accuracy.example_args(runs[1], args, Path("r.json"))
    assert flags[flags.index("--prune-window") + 1:flags.index("--prune-window") + 3] == ["0", "0.3"]
    assert "--prune-window" not in accuracy.example_args(runs[2], args, Path("r.json"))
    with pytest.raises(SystemExit):
        accuracy.parse_args(["--windows", "0.6-0.1"])
    table = accuracy.markdown_table([made_up(0.0, 1, 0.92), dict(made_up(0.9, 1, 0.91), window="0-0.3")],
                                    accuracy.TASKS["image"])
    assert "| 0.9 | layer | fp32 | 0-0.3 | 10 | cosine | 0.900 | 0.9100 | 0.9100 | -1.00 pp |" in table


def test_a_ramp_is_a_window_with_the_examples_ramp_flag_and_masks_re_ranked_every_step():
    args = accuracy.parse_args(["--tasks", "image", "--sparsities", "0.95", "--seeds", "1", "--windows", "ramp0100"])
    (run,) = accuracy.planned_runs(args)
    assert run.name == "image-s0.95-erk-ramp100-seed1"
    flags = accuracy.example_args(run, args, Path("r.json"))
    assert flags[flags.index("--prune-ramp") + 1] == "100" and "--prune-window" not in flags
    table = accuracy.markdown_table([made_up(0.0, 1, 0.92), dict(made_up(0.95, 1, 0.91), window="ramp100")],
                                    accuracy.TASKS["image"])
    assert "| 0.95 | layer | fp32 | ramp100 | every step | cosine |" in table
    for argv in (["--windows", "ramp"], ["--windows", "ramp100", "--updates", "40"]):
        with pytest.raises(SystemExit):
            accuracy.parse_args(argv)


def test_rescaled_survivors_are_a_variant_of_windows_that_prune_at_step_0():
    args = accuracy.parse_args(["--tasks", "image", "--sparsities", "0", "0.95", "--seeds", "1", "--windows", "0-0",
                                "--rescale-survivors"])
    dense, run = accuracy.planned_runs(args)
    assert (dense.name, run.name) == ("image-s0-seed1", "image-s0.95-erk-w0-0-rescale-seed1")
    assert "--rescale-survivors" in accuracy.example_args(run, args, Path("r.json"))
    assert "--rescale-survivors" not in accuracy.example_args(dense, args, Path("r.json"))
    with pytest.raises(SystemExit):
        accuracy.parse_args(["--windows", "0.1-0.6", "--rescale-survivors"])
    rows = [made_up(0.0, 1, 0.92), dict(made_up(0.95, 1, 0.91), window="0-0"),
            dict(made_up(0.95, 1, 0.915), window="0-0", rescale_survivors=True)]
    table = accuracy.markdown_table(rows, accuracy.TASKS["image"])
    assert "| 0.95 | layer | fp32 | 0-0 | 10 | cosine | 0.950 | 0.9100 |" in table
    assert "| 0.95 | layer | fp32 | 0-0, rescaled | 10 | cosine | 0.950 | 0.9150 | 0.9150 | -0.50 pp |" in table


def test_a_mask_update_count_other_than_the_default_is_a_variant_with_its_own_flag_and_row():
    args = accuracy.parse_args(["--tasks", "image", "--sparsities", "0.8", "--seeds", "1", "--updates", "10", "40"])
    runs = accuracy.planned_runs(args)
    assert [run.name for run in runs] == ["image-s0.8-erk-seed1", "image-s0.8-erk-u40-seed1"]
    assert "--prune-updates" not in accuracy.example_args(runs[0], args, Path("r.json"))
    flags = accuracy.example_args(runs[1], args, Path("r.json"))
    assert flags[flags.index("--prune-updates") + 1] == "40"
    table = accuracy.markdown_table([made_up(0.0, 1, 0.92), dict(made_up(0.8, 1, 0.918), updates=40)],
                                    accuracy.TASKS["image"])
    assert "| 0.8 | layer | fp32 | 0.1-0.6 | 40 | cosine | 0.800 | 0.9180 | 0.9180 | -0.20 pp |" in table


def made_up(sparsity, seed, metric, ranking="layer"):
    return {"task": "image", "sparsity_target": sparsity, "values": "fp32", "ranking": ranking, "seed": seed,
            "sparsity": sparsity, "test_accuracy": metric, "sent_bytes": 4e6, "dense_bytes": 8e6, "steps": 4,
            "final_bytes_per_step": 5e5, "wall_seconds": 10.0, "parameters": 4_340_000}


def test_table_averages_seeds_and_compares_with_the_dense_mean():
    runs = [made_up(0.0, 1, 0.92), made_up(0.0, 2, 0.93), made_up(0.9, 1, 0.921), made_up(0.9, 2, 0.92),
            {"task": "image", "sparsity_target": 0.95, "error": "exit 1", "log": "x.log"}]
    table = accuracy.markdown_table(runs, accuracy.TASKS["image"])
    dense_row, sparse_row = [line for line in table.splitlines() if line.startswith("| 0")]
    assert "| 0.9250 | 0.9200, 0.9300 | +0.00 pp |" in dense_row
    assert "| 0.9205 | 0.9210, 0.9200 | -0.45 pp | 4 | 500 | 2000 | 10 |" in sparse_row
    assert "4,340,000 parameters" in table and "Failed: x.log (exit 1)" in table


def test_language_rows_compare_perplexity_in_percent():
    runs = [dict(made_up(s, 1, 0), task="language", val_perplexity=p) for s, p in ((0.0, 4.0), (0.8, 4.1))]
    table = accuracy.markdown_table(runs, accuracy.TASKS["language"])
    assert "| +2.5 % |" in table.splitlines()[-1]
    with pytest.raises(SystemExit):
        accuracy.parse_args(["--rankings", "row"])


def test_final_mask_bytes_prefer_the_last_step_over_the_last_epoch_mean():
    history = [{"sent_bytes": 9_000, "steps": 3}, {"sent_bytes": 6_000, "steps": 3}]
    assert accuracy.final_mask_bytes_per_step({"history": history}) == 2_000
    assert accuracy.final_mask_bytes_per_step({"history": history, "last_step_sent_bytes": 1_500}) == 1_500.0
    assert accuracy.final_mask_bytes_per_step({"history": []}) is None


def test_final_mask_column_uses_only_seeds_that_record_the_last_step():
    epoch_mean = made_up(0.9, 1, 0.92)
    last_step = dict(made_up(0.9, 2, 0.92), final_bytes_per_step=2e5, last_step_sent_bytes=2e5)
    table = accuracy.markdown_table([epoch_mean, last_step], accuracy.TASKS["image"])
    assert "| 4 | 200 | 2000 |" in table.splitlines()[-1]


def test_a_learning_rate_rewind_is_an_image_variant_whose_flag_comes_after_the_tasks_own():
    args = accuracy.parse_args(["--tasks", "image", "language", "--sparsities", "0.8", "--seeds", "1",
                                "--lr-schedules", "cosine", "cosine-rewind"])
    runs = accuracy.planned_runs(args)
    assert [run.name for run in runs] == ["image-s0.8-erk-seed1", "image-s0.8-erk-cosine-rewind-seed1",
                                          "language-s0.8-erk-seed1"]
    flags = accuracy.example_args(runs[1], args, Path("r.json"))
    assert flags[len(flags) - 1 - flags[::-1].index("--lr-schedule") + 1] == "cosine-rewind"
    assert flags.index("--lr-schedule", flags.index("--lr-schedule") + 1) > flags.index("--sparsity")


def test_tensorflow_image_rows_run_the_tf_example_with_the_image_recipe_and_compare_with_tf_dense():
    args = accuracy.parse_args(["--tasks", "image-tf", "--sparsities", "0", "0.9", "--values", "fp16", "--seeds", "1"])
    runs = accuracy.planned_runs(args)
    assert [run.name for run in runs] == ["image-tf-s0-seed1", "image-tf-s0.9-fp16-erk-seed1"]
    assert runs[0].task.script == "examples/tensorflow2_fashion_mnist.py"
    flags = accuracy.example_args(runs[1], args, Path("r.json"))
    assert flags[:4] == ["--model", "vgg", "--lr-schedule", "cosine"]  # the torch image task's model arguments
    assert flags[flags.index("--epochs") + 1] == "3" and flags[flags.index("--packed-values") + 1] == "fp16"
    torch_dense = made_up(0.0, 1, 0.95)  # another task: not TensorFlow's dense
    tf_runs = [dict(made_up(0.0, 1, 0.92), task="image-tf"), dict(made_up(0.9, 1, 0.917), task="image-tf", values="fp16")]
    table = accuracy.markdown_table([torch_dense, *tf_runs], accuracy.TASKS["image-tf"])
    assert "TensorFlow tape loop" in table
    assert "| 0.9 | layer | fp16 | 0.1-0.6 | 10 | cosine | 0.900 | 0.9170 | 0.9170 | -0.30 pp |" in table


def test_dense_from_another_report_sets_vs_dense_with_the_same_seeds_only(tmp_path):
    settings = {key: None for key in accuracy.PROTOCOL}
    baseline = tmp_path / "results.json"
    dense = [made_up(0.0, 1, 0.92), made_up(0.0, 2, 0.93), made_up(0.0, 3, 0.50)]
    baseline.write_text(json.dumps({"settings": settings, "runs": [dict(r, name=f"d{r['seed']}") for r in dense]}))
    borrowed = accuracy.dense_runs(baseline, settings)
    assert [r["seed"] for r in borrowed] == [1, 2, 3]
    table = accuracy.markdown_table([made_up(0.98, 1, 0.911), made_up(0.98, 2, 0.91)], accuracy.TASKS["image"], borrowed)
    assert "| 0.9105 | 0.9110, 0.9100 | -1.45 pp |" in table  # against seeds 1 and 2 (0.925), not seed 3
    table = accuracy.markdown_table([made_up(0.98, 1, 0.911), made_up(0.98, 2, 0.91), made_up(0.95, 1, 0.915)],
                                    accuracy.TASKS["image"], borrowed)
    assert "| 0.9150 | 0.9150 | -0.50 pp |" in table  # a row of seed 1 only: against seed 1 (0.92)
    with pytest.raises(SystemExit, match="same protocol"):
        accuracy.dense_runs(baseline, dict(settings, epochs=5))
    with pytest.raises(SystemExit, match="no such file"):
        accuracy.dense_runs(tmp_path / "missing.json", settings)


def test_plot_legend_names_the_learning_rate_only_where_a_task_can_change_it():
    image, language = accuracy.TASKS["image"], accuracy.TASKS["language"]
    assert accuracy.variant_label(image, "ternary", "erk", "0-0", 10, "cosine", True) == \
        "ternary erk window 0-0 10 updates cosine rescaled"
    assert accuracy.variant_label(language, "fp16", "global", "0.1-0.6", 40, "cosine", False) == \
        "fp16 global window 0.1-0.6 40 updates"
    assert accuracy.variant_label(image, "ternary", "erk", "ramp300", 10, "cosine", False) == \
        "ternary erk window ramp300 updates every step cosine"
    assert accuracy.lr_label(language, "cosine") == "its own"
