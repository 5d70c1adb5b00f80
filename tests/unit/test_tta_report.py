"""The time-to-accuracy report's arithmetic on made-up curves."""

import pytest

from benchmarks.tta.tta_report import adopt_reference, at_budget, cell_markdown, late_x_bound, summarize, time_to


def run(curve, metric="test_accuracy", steps=4):
    return {"metric": metric, "curve": curve, "train_s": curve[-1][0], "size": 2, "batch_size": 64, "steps": steps,
            "nic_tx_bytes": [2e6, 4e6]}


def cell(runs):
    return {"runs": runs, "bound": {"samples_per_s": 100.0}, "steps": 4, "eval_every": 2}


def test_times_to_target_budget_and_speedup():
    summary = summarize(cell({
        "dense": run([[40, 2, 0.80, 0], [80, 4, 0.90, 0]]),
        "fp16": run([[20, 2, 0.80, 0], [40, 4, 0.90, 0]]),
        "topk": run([[10, 2, 0.70, 0], [20, 4, 0.85, 0]]),
        "pactrain-0.9-fp16": run([[5, 2, 0.85, 0], [10, 4, 0.896, 0]]),
    }))
    assert summary["target"] == pytest.approx(0.895) and summary["lower_target"] == 0.85
    rows = summary["rows"]
    assert rows["pactrain-0.9-fp16"]["time_to_target"] == 10 and rows["fp16"]["time_to_target"] == 40
    assert rows["topk"]["time_to_target"] is None and rows["topk"]["time_to_lower"] == 20
    assert summary["budget_s"] == 10 and rows["dense"]["at_budget"] is None and rows["topk"]["at_budget"] == 0.70
    assert rows["fp16"]["samples_per_s"] == pytest.approx(2 * 64 * 4 / 40)
    assert rows["fp16"]["x_bound"] == pytest.approx(0.128) and rows["fp16"]["nic_mb"] == 3.0
    assert summary["verdict"] == {"pactrain": "pactrain-0.9-fp16", "pactrain_s": 10, "peer": "fp16", "peer_s": 40,
                                  "speedup_over_best_peer": 4.0, "speedup_over_fp16": 4.0}


def test_perplexity_is_better_lower():
    curve = [[1, 1, 9.0, 0], [2, 2, 5.0, 0]]
    assert time_to(curve, 5.15, "val_perplexity") == 2 and time_to(curve, 4.0, "val_perplexity") is None
    assert at_budget(curve, 1.5) == 9.0
    summary = summarize(cell({"fp16": run(curve, "val_perplexity"), "dense": run([[3, 2, 6.0, 0]], "val_perplexity")}))
    assert summary["target"] == pytest.approx(5.15) and summary["lower_target"] == 6.0


def test_a_capped_run_reports_the_steps_it_did():
    capped = dict(cell({"fp16": run([[20, 2, 0.80, 0], [40, 4, 0.90, 0]]),
                        "dense": run([[30, 2, 0.75, 0]], steps=2)}), budget_s=25.0)
    summary = summarize(capped)
    assert summary["rows"]["dense"]["steps"] == 2
    assert summary["rows"]["dense"]["samples_per_s"] == pytest.approx(2 * 64 * 2 / 30)
    text = cell_markdown("image/25mbit/4w", capped, summary)
    assert "4 steps per method or until the first evaluation past 25 s of training" in text
    # the lower target is the worst final of the runs that did all their steps: the capped run does not set it
    assert "| dense | 0.7500 | not reached | not reached | 0.7500 | 2 | 30 |" in text


def test_late_throughput_is_the_last_third_of_steps_against_the_bound():
    steps = dict(run([[6, 6, 0.9, 0]], steps=6), step_s=[2.0, 2.0, 2.0, 2.0, 0.5, 0.4])
    assert late_x_bound(steps, {"step_s": 0.2}) == pytest.approx(0.2 / 0.45)
    assert late_x_bound(run([[1, 1, 0.5, 0]]), {"step_s": 0.2}) is None


def test_a_part_without_fp16_takes_its_target_from_another_parts_fp16():
    key = "image/25mbit/4w"
    part = {"cells": {key: cell({"topk": run([[10, 2, 0.80, 0], [20, 4, 0.86, 0]]),
                                 "pactrain-0.9-ternary": run([[5, 2, 0.84, 0], [12, 4, 0.87, 0]])})}}
    before = summarize(part["cells"][key])
    assert before["target"] == pytest.approx(0.855)  # no fp16 here: the first run's final, loosened
    earlier = {"cells": {key: cell({"fp16": run([[900, 4, 0.8435, 0]]), "topk": run([[99, 4, 0.5, 0]])})}}
    adopt_reference(part, earlier, "earlier/record.json")
    summary = summarize(part["cells"][key])
    assert summary["target"] == pytest.approx(0.8385)
    assert summary["rows"]["pactrain-0.9-ternary"]["time_to_target"] == 5 and summary["rows"]["topk"]["time_to_target"] == 20
    assert summary["verdict"]["speedup_over_best_peer"] == 4.0
    assert "Target 0.8385 (fp16's final in earlier/record.json, loosened)" in cell_markdown(key, part["cells"][key], summary)
    own = {"cells": {key: cell({"fp16": run([[40, 4, 0.90, 0]])})}}
    adopt_reference(own, earlier, "earlier/record.json")  # a part with its own fp16 keeps it
    assert "reference" not in own["cells"][key] and summarize(own["cells"][key])["target"] == pytest.approx(0.895)


def test_a_budget_stopped_fp16_yields_its_target_to_an_unconstrained_loopback_run_and_is_bounded_below():
    part = {"cells": {"image/5mbit/2w": dict(cell({
        "fp16": dict(run([[300, 2, 0.70, 0]], steps=2), step_s=[150.0, 150.0]),
        "pactrain-0.95-ternary-w0-0": run([[10, 2, 0.84, 0], [20, 4, 0.885, 0]]),
        "powersgd": run([[20, 2, 0.85, 0], [40, 4, 0.886, 0]])}), workload="image", workers=2, budget_s=250.0,
                                           bound={"samples_per_s": 100.0, "step_s": 1.0})}}
    loopback = {"cells": {"image/10mbit/2w": dict(cell({"fp16": run([[4, 2, 0.85, 0], [8, 4, 0.89, 0]])}),
                                                  workload="image", workers=2, where="loopback, unshaped (asked)")}}
    adopt_reference(part, loopback, "ref/record.json")
    summary = summarize(part["cells"]["image/5mbit/2w"])
    assert summary["target"] == pytest.approx(0.885) and summary["target_source"] == "fp16's final in ref/record.json"
    assert summary["lower_target"] == pytest.approx(0.885)  # the budget-stopped fp16's 0.70 does not set it
    fp16 = summary["rows"]["fp16"]
    assert fp16["time_to_target"] is None and fp16["time_to_target_at_least"] == 4 * 150.0
    assert summary["verdict"]["speedup_over_best_peer"] == 2.0 and summary["verdict"]["speedup_over_fp16_at_least"] == 30.0
    text = cell_markdown("image/5mbit/2w", part["cells"]["image/5mbit/2w"], summary)
    assert "| fp16 | 0.7000 | >= 600 s (stopped; steps to target x step time) |" in text
    assert "at least 30.00x sooner than fp16 (stopped by the budget)" in text


def test_the_header_names_the_batch_and_cycle_time_a_cell_ran_with():
    older = cell({"fp16": run([[20, 2, 0.80, 0], [40, 4, 0.90, 0]])})
    assert "per-worker batch 64, HOROVOD_CYCLE_TIME 1 ms;" in cell_markdown("image/5mbit/2w", older, summarize(older))
    newer = dict(cell({"fp16": dict(run([[20, 2, 0.80, 0], [40, 4, 0.90, 0]]), batch_size=16)}), cycle_time_ms=20.0)
    assert "per-worker batch 16, HOROVOD_CYCLE_TIME 20 ms;" in cell_markdown("image/2mbit/8w", newer, summarize(newer))


def test_the_header_gives_the_load_each_run_met_not_only_the_last_parts():
    curve = [[20, 2, 0.80, 0], [40, 4, 0.90, 0]]
    parts = dict(cell({"fp16": dict(run(curve), load=[5.1, 5.0, 4.0]), "topk": dict(run(curve), load=[1.1, 2.0, 3.0])}),
                 load=[0.5, 0.4, 0.3])
    assert "; load as each run ended 1.1-5.1. Target" in cell_markdown("image/5mbit/2w", parts, summarize(parts))
    older = dict(cell({"fp16": run(curve)}), load=[0.5, 0.4, 0.3])
    assert "; load 0.5 0.4 0.3. Target" in cell_markdown("image/5mbit/2w", older, summarize(older))


def test_a_loopback_reference_of_the_same_global_batch_serves_another_number_of_workers():
    reference = {"cells": {"image/10mbit/2w": dict(cell({"fp16": run([[40, 4, 0.90, 0]])}), workload="image",
                                                   workers=2, where="loopback, unshaped (True)")}}
    eight = {"image/2mbit/8w": dict(cell({"powersgd": dict(run([[20, 4, 0.89, 0]]), batch_size=16)}),
                                    workload="image", workers=8),
             "image/2mbit/4w": dict(cell({"powersgd": dict(run([[20, 4, 0.89, 0]]), batch_size=64)}),
                                    workload="image", workers=4)}
    part = {"cells": eight}
    adopt_reference(part, reference, "reference/record.json")
    assert part["cells"]["image/2mbit/8w"]["reference"]["final"] == 0.90  # 8 x 16 = 2 x 64 images a step
    assert "reference" not in part["cells"]["image/2mbit/4w"]  # 4 x 64: another recipe


def test_a_tensorflow_cell_takes_tf_fp16_as_its_reference_and_names_a_part_that_evaluated_more_often():
    part = {"cells": {"image/5mbit/2w": dict(cell({
        "tf-pactrain-0.98-ternary-w0-0": run([[10, 2, 0.84, 0], [20, 4, 0.885, 0]]),
        "tf-fp16": dict(run([[300, 1, 0.70, 0]], steps=1), step_s=[150.0], eval_every=1, budget_s=240.0)}),
        workload="image", workers=2, bound={"samples_per_s": 100.0, "step_s": 1.0})}}
    loopback = {"cells": {"image/5mbit/2w": dict(cell({"tf-fp16": run([[4, 2, 0.85, 0], [8, 4, 0.89, 0]])}),
                                                 workload="image", workers=2, where="loopback, unshaped (asked)")}}
    adopt_reference(part, loopback, "ref/record.json")
    summary = summarize(part["cells"]["image/5mbit/2w"])
    assert summary["target_source"] == "tf-fp16's final in ref/record.json"
    assert summary["rows"]["tf-fp16"]["time_to_target_at_least"] == 4 * 150.0
    assert summary["verdict"]["speedup_over_fp16_at_least"] == 30.0
    text = cell_markdown("image/5mbit/2w", part["cells"]["image/5mbit/2w"], summary)
    assert "| tf-fp16 (evaluation every 1, budget 240 s) | 0.7000 | >= 600 s" in text
    assert "reaches it in 20 s, at least 30.0x sooner than fp16 (stopped by the budget)" in text


def test_a_part_appends_to_a_cell_recorded_before_the_cycle_time_was_kept_only_at_1_ms():
    from argparse import Namespace

    from benchmarks.tta.tta import run_cell

    legacy = dict(cell({"fp16": run([[20, 2, 0.80, 0], [40, 4, 0.90, 0]])}), workload="image", workers=2, link="5mbit")
    record = {"cells": {"image/5mbit/2w": legacy}}
    asked = Namespace(steps=4, eval_every=2, budget_s=0.0, cycle_time_ms=1.0, batch_size=None, methods=["fp16"],
                      record="r.json")
    run_cell(asked, record, "image", "5mbit", 2, None, None)  # every method is in the record: nothing runs
    with pytest.raises(RuntimeError, match=r"ran \(steps, cycle ms, batch\) \(4, 1.0, None\); this run asks for \(4, 5.0"):
        run_cell(Namespace(**{**vars(asked), "cycle_time_ms": 5.0}), record, "image", "5mbit", 2, None, None)
