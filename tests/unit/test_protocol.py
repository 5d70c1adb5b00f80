"""The protocol's file, its verdict rule and the peers' helpers, on synthetic records (no training)."""

import json
from pathlib import Path

import pytest

from benchmarks.baselines.dgc import WARMUP_DENSITIES, index_dtype, warmup_density
from benchmarks.protocol import quiet, report
from benchmarks.protocol.run import Planned, done, load_record, plan
from benchmarks.protocol.spec import ProtocolError, load_protocol
from benchmarks.protocol.verdicts import NEVER, compare, curves_across_cells, selection, time_to_target, verdicts

REPO = Path(__file__).resolve().parents[2]
EVIDENCE = REPO / "benchmarks" / "protocol" / "evidence.toml"

SMALL = """
name = "small"
workers = 2
record = "record.json"
selection_cell = "slow"
selection_seeds = [0]
final_seeds = [1, 2, 3]
accuracy_margin = 0.005
perplexity_factor = 1.03
ratio = 1.25
seeds_to_win = 2

[workloads.image]
steps = 100
eval_every = 10
budget_s = 0
reference_budget_s = 5

[cells.slow]
workload = "image"
link = "10mbit"
rtt_ms = 0
cycle_ms = 25

[families.fp16]
role = "reference"
candidates = ["fp16"]

[families.pactrain]
role = "pactrain"
candidates = ["pactrain-0.9-int3-w0-0", "pactrain-0.95-ternary-w0-0"]

[families.topk]
role = "peer"
candidates = ["dgc-0.01", "dgc-0.001"]
"""


@pytest.fixture
def small(tmp_path):
    path = tmp_path / "small.toml"
    path.write_text(SMALL)
    return load_protocol(path)


def a_run(stage, cell, family, method, seed, reached_at=None, seconds_per_step=1.0, final=0.90, step_s=1.0):
    """Ten evaluations; the metric jumps to ``final`` at step ``reached_at`` (None: it stays at 0.5)."""
    curve = [[step * seconds_per_step, step, final if reached_at is not None and step >= reached_at else 0.5, 0]
             for step in range(10, 101, 10)]
    return {"stage": stage, "cell": cell, "family": family, "method": method, "seed": seed, "curve": curve,
            "eval_elapsed_s": [point[0] + 3 + i for i, point in enumerate(curve)], "eval_s": [1.0] * 10,
            "elapsed_s": curve[-1][0] + 13, "wall_s": curve[-1][0] + 18, "step_s_median": step_s,
            "bound": {"step_s": 0.25}}


def record_for(small, times: dict[str, dict[int, int | None]]) -> dict:
    """Selection runs of every candidate (the first of each family reaches the target first), then final runs
    that reach the target at ``times[family][seed]`` (a step, at 1 s a step; None: never)."""
    runs = [a_run("selection", "loopback/image", "fp16", "fp16", 0, reached_at=50)]
    for family in small.families.values():
        for order, method in enumerate(family.candidates):
            runs.append(a_run("selection", "slow", family.name, method, 0, reached_at=30 + 10 * order))
    for seed in small.final_seeds:
        runs.append(a_run("final", "loopback/image", "fp16", "fp16", seed, reached_at=60))
        for family, per_seed in times.items():
            method = small.families[family].candidates[0]
            runs.append(a_run("final", "slow", family, method, seed, reached_at=per_seed[seed]))
    return {"protocol": {"name": small.name, "digest": small.digest}, "runs": runs}


def test_the_evidence_protocol_gives_every_tuned_family_the_same_budget():
    protocol = load_protocol(EVIDENCE)
    tuned = [f for f in protocol.families.values() if f.role != "reference"]
    assert {len(f.candidates) for f in tuned} == {3}
    assert all(f.available for f in tuned) and {"diloco", "pactrain-local", "model-averaging"} <= protocol.families.keys()
    assert set(protocol.selection_seeds).isdisjoint(protocol.final_seeds) and len(protocol.final_seeds) == 3
    assert protocol.cells["image-10mbit-wan"].rtt_ms == 40 and protocol.cells["image-100mbit"].cycle_ms == 1


@pytest.mark.parametrize("edit, message", [
    (("selection_seeds = [0]", "selection_seeds = [1]"), "final_seeds must differ"),
    (('candidates = ["dgc-0.01", "dgc-0.001"]', 'candidates = ["dgc-2"]'), "families.topk"),
    (('link = "10mbit"', 'link = "10 parsecs"'), "cells.slow"),
    (('role = "peer"', 'role = "rival"'), "role 'rival'"),
    (("steps = 100\n", ""), "missing 'steps'"),
    (('selection_cell = "slow"', 'selection_cell = "fast"'), "selection_cell 'fast'"),
])
def test_a_protocol_that_cannot_run_as_written_is_refused_naming_the_key(tmp_path, edit, message):
    path = tmp_path / "bad.toml"
    path.write_text(SMALL.replace(*edit))
    with pytest.raises(ProtocolError, match=message):
        load_protocol(path)


def test_a_record_of_another_protocol_version_is_refused(small, tmp_path):
    path = tmp_path / "record.json"
    path.write_text(json.dumps({"protocol": {"name": "small", "digest": "0" * 64}, "runs": []}))
    with pytest.raises(ProtocolError, match="another version"):
        load_record(small, path)


def test_selection_picks_the_fastest_candidate_and_the_final_stage_waits_for_it(small):
    record = record_for(small, {})
    chosen = selection(small, record)
    assert chosen["complete"] and chosen["target"] == pytest.approx(0.895)
    assert chosen["families"]["topk"]["chosen"] == "dgc-0.01"
    assert chosen["families"]["pactrain"]["candidates"]["pactrain-0.95-ternary-w0-0"]["train_s"] == 40
    record["runs"] = [r for r in record["runs"] if r["method"] != "dgc-0.001"]
    assert {p.family for p in plan(small, record, "final")} == {"fp16", "pactrain"}, "topk waits for its selection"
    assert verdicts(small, record)["cells"]["slow"]["pending"] == "selection runs missing for topk"
    record["runs"] = [r for r in record["runs"] if r["stage"] == "final"]
    with pytest.raises(ProtocolError, match="no family's selection is complete"):
        plan(small, record, "final")


def test_the_final_plan_runs_each_chosen_setting_on_every_seed_with_one_target_run_per_seed(small):
    planned = plan(small, record_for(small, {}), "final")
    assert Planned("final", "loopback/image", "fp16", "fp16", 2) in planned
    assert sum(p.cell == "slow" for p in planned) == 3 * 3  # fp16, pactrain, topk on three seeds
    assert {p.method for p in planned if p.family == "pactrain"} == {"pactrain-0.9-int3-w0-0"}


@pytest.mark.parametrize("pactrain, topk, outcome", [
    ({1: 40, 2: 40, 3: 80}, {1: 60, 2: 60, 3: 60}, "win"),    # 1.5x sooner on the median, sooner on 2 of 3
    ({1: 40, 2: 90, 3: 90}, {1: 60, 2: 60, 3: 60}, "loss"),  # the peer is 1.5x sooner, on 2 of 3
    ({1: 50, 2: 50, 3: 50}, {1: 60, 2: 60, 3: 60}, "tie"),   # sooner on every seed, but only 1.2x
    ({1: 40, 2: 40, 3: None}, {1: None, 2: None, 3: 60}, "win"),  # a seed that never reaches counts as never
    ({1: None, 2: None, 3: None}, {1: None, 2: None, 3: None}, "loss"),  # fp16 reaches it: the best peer
])
def test_the_verdict_rule(small, pactrain, topk, outcome):
    record = record_for(small, {"pactrain": pactrain, "topk": topk, "fp16": {1: 100, 2: 100, 3: 100}})
    cell = verdicts(small, record)["cells"]["slow"]
    verdict = cell["verdicts"]["pactrain"]["train"]
    assert verdict["outcome"] == outcome


def test_the_reference_on_a_link_is_timed_from_its_steps_and_its_loopback_curve(small):
    record = record_for(small, {"pactrain": {1: 40, 2: 40, 3: 40}, "topk": {1: 60, 2: 60, 3: 60},
                                "fp16": {1: 10, 2: 10, 3: 10}})
    for run in record["runs"]:
        if run["cell"] == "slow" and run["family"] == "fp16":
            run["step_s_median"] = 7.0  # the link sets its step; its loopback curve reaches the target at step 60
    cell = verdicts(small, record)["cells"]["slow"]
    assert cell["families"]["fp16"]["median_train_s"] == pytest.approx(60 * 7.0)
    assert cell["verdicts"]["pactrain"]["train"]["against_reference"]["outcome"] == "win"
    assert cell["verdicts"]["pactrain"]["train"]["best_peer"] == "topk"


def test_time_to_target_on_both_clocks():
    run = a_run("final", "slow", "topk", "dgc-0.01", 1, reached_at=30)
    assert time_to_target(run, 0.9, True) == {"train": 30, "wall": 5 + 30 + 3 + 2}  # start-up 5, set-up 3, 2 evaluations before
    assert time_to_target(run, 0.95, True) == {"train": NEVER, "wall": NEVER}


def test_compare_counts_seeds_and_reports_when_neither_reaches(small):
    assert compare(small, {1: NEVER}, {1: NEVER}) == {"outcome": "tie", "ratio": None, "sooner_seeds": 0,
                                                       "later_seeds": 0, "seeds": [1]}
    assert compare(small, {1: 10.0, 2: 10.0, 3: 30.0}, {1: NEVER, 2: 20.0, 3: 20.0}) == {
        "outcome": "win", "ratio": 2.0, "sooner_seeds": 2, "later_seeds": 1, "seeds": [1, 2, 3]}


def test_the_report_is_rebuilt_from_the_record_alone(small, tmp_path):
    record = record_for(small, {"pactrain": {1: 30, 2: 30, 3: 80}, "topk": {1: 50, 2: 50, 3: 50},
                                "fp16": {1: 100, 2: 100, 3: 100}})
    markdown = report.write(small, record, tmp_path)
    assert "| `slow` | link-bound | pactrain | topk | 1.67x | 2 of 3 | **win** |" in markdown
    saved = json.loads((tmp_path / "verdicts.json").read_text())
    assert saved == json.loads(json.dumps(verdicts(small, record), sort_keys=True))
    assert (tmp_path / "slow.png").is_file()


def test_curves_are_compared_across_link_cells_for_runs_to_their_last_step():
    runs = [dict(a_run("final", cell, "topk", "dgc-0.01", seed, reached_at=reached), workload="image", steps=100,
                 planned_steps=100)
            for cell, seed, reached in (("slow", 1, 30), ("wan", 1, 30), ("slow", 2, 30), ("wan", 2, 40), ("slow", 3, 30))]
    runs.append(dict(runs[4], cell="loopback/image"))  # the targets' runs: not on a link
    runs.append(dict(runs[4], cell="wan", steps=40))  # stopped early (fp16 on a link)
    assert curves_across_cells({"runs": runs}) == {"pairs": 2, "same": 1}


def test_dgc_warms_up_in_four_exponential_stages_and_sends_narrow_indices():
    assert [warmup_density(0.001, step, 8) for step in range(0, 10, 2)] == [*WARMUP_DENSITIES, 0.001]
    assert warmup_density(0.01, 7, 8) == 0.01  # never under the target density
    assert index_dtype(2**15).itemsize == 2 and index_dtype(2**15 + 1).itemsize == 4


def test_the_committed_verdicts_are_what_the_committed_record_gives():
    """A reader's recomputation: the report's verdicts.json from the record alone, with the same code."""
    protocol = load_protocol(EVIDENCE)
    record_path = REPO / protocol.record
    record = json.loads(record_path.read_text())
    assert record["protocol"]["digest"] == protocol.digest
    saved = json.loads((record_path.parent / "verdicts.json").read_text())
    assert saved == json.loads(json.dumps(verdicts(protocol, record), sort_keys=True))


def test_the_readme_table_is_the_one_the_committed_verdicts_give():
    protocol = load_protocol(EVIDENCE)
    record = json.loads((REPO / protocol.record).read_text())
    table = report.readme_table(protocol, verdicts(protocol, record))
    assert table in (REPO / "README.md").read_text()


def test_random_k_draws_the_same_coordinates_on_every_rank_and_new_ones_each_step():
    import torch

    from benchmarks.baselines.randomk import RandomKDistributedOptimizer

    def optimizer():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(300, 400), torch.nn.Linear(400, 10))
        return RandomKDistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                                           density=0.1, min_compress_numel=1000)

    first, second = optimizer(), optimizer()  # two ranks, seeded alike
    assert first.compressed == {"0.weight", "1.weight"}
    steps = [first.draw("0.weight") for _ in range(2)]
    assert all(torch.equal(a, second.draw("0.weight")) for a in steps)
    assert not torch.equal(steps[0], steps[1])
    assert abs(steps[0].numel() / 120_000 - 0.1) < 0.01


def test_making_a_preregistered_family_available_keeps_the_digest_and_any_other_edit_changes_it(tmp_path):
    text = EVIDENCE.read_text()
    digests = {}
    for name, version in (("evidence", text), ("preregistered", text.replace("available = true", "available = false")),
                          ("edited", text.replace('"diloco-h10-fp16"', '"diloco-h15-fp16"'))):
        path = tmp_path / f"{name}.toml"
        path.write_text(version)
        digests[name] = load_protocol(path).digest
    assert digests["evidence"] == digests["preregistered"] != digests["edited"]


def test_a_final_run_that_shared_the_cores_is_set_aside_with_its_reason_and_planned_again(small, tmp_path):
    record = record_for(small, {"pactrain": {1: 30, 2: 30, 3: 30}, "topk": {1: 50, 2: 50, 3: 50},
                                "fp16": {1: 100, 2: 100, 3: 100}})
    for run in record["runs"]:
        run["load"] = [2.5, 2.4, 2.2]
    crowded = next(r for r in record["runs"] if (r["stage"], r["cell"], r["family"], r["seed"]) == ("final", "slow", "topk", 2))
    crowded["load"] = [2.5, 4.5, 3.0]  # the 5-minute average: other work earlier in the run
    selection_crowded = record["runs"][1]
    selection_crowded["load"] = [6.0, 6.0, 6.0]  # selection and loopback runs are never set aside
    record["runs"][-1]["load"] = [4.0, 4.0, 4.0]  # at the limit (2 workers + 2): quiet enough
    moved = quiet.set_aside(small, record)
    assert [m["run"] for m in moved] == [crowded] and crowded not in record["runs"]
    assert "4.50 (5 min)" in moved[0]["reason"] and "above 4" in moved[0]["reason"]
    assert selection_crowded in record["runs"] and quiet.set_aside(small, record) == []
    again = [run for run in plan(small, record, "final") if not done(record, run)]
    assert again == [Planned("final", "slow", "topk", "dgc-0.01", 2)]
    markdown = report.write(small, record, tmp_path)
    assert "| `slow` | `dgc-0.01` | 2 | load average 2.50 (1 min), 4.50 (5 min)" in markdown


def test_a_cell_whose_runs_were_made_on_machines_of_different_speed_says_so_beside_its_verdict(small, tmp_path):
    record = record_for(small, {"pactrain": {1: 30, 2: 30, 3: 30}, "topk": {1: 50, 2: 50, 3: 50},
                                "fp16": {1: 100, 2: 100, 3: 100}})
    quiet_cell = verdicts(small, record)["cells"]["slow"]["machine"]
    assert quiet_cell == {"fastest_s": 0.25, "slowest_s": 0.25, "spread": 1.0, "varied": False}
    assert "machine speed varied" not in report.write(small, record, tmp_path)
    next(r for r in record["runs"] if r["stage"] == "final" and r["cell"] == "slow")["bound"] = {"step_s": 0.4}
    markdown = report.write(small, record, tmp_path)
    assert "**win** (machine speed varied 1.60x)" in markdown
    assert "0.250 to 0.400 s a step (1.60x). The runs were made on machines of different speed" in markdown
    assert "machine speed varied 1.60x" in report.readme_table(small, verdicts(small, record))


def test_a_verdict_decided_by_accuracy_carries_no_speed_caveat_and_says_who_never_reached(small, tmp_path):
    record = record_for(small, {"pactrain": {1: None, 2: None, 3: None}, "topk": {1: 50, 2: 50, 3: 50},
                                "fp16": {1: 100, 2: 100, 3: 100}})
    next(r for r in record["runs"] if r["stage"] == "final" and r["cell"] == "slow")["bound"] = {"step_s": 0.4}
    markdown = report.write(small, record, tmp_path)
    assert "| 0 (PacTrain never) | 0 of 3 | **loss** |" in markdown  # machines of different speed cannot flip it
    assert "0.250 to 0.400 s a step (1.60x)" in markdown


def two_cells(tmp_path, times: dict[str, dict[int, int | None]]):
    """SMALL with a second cell ("wan") that has no final run yet; ``times`` as ``record_for``'s, in "slow"."""
    path = tmp_path / "two.toml"
    path.write_text(SMALL + '\n[cells.wan]\nworkload = "image"\nlink = "10mbit"\nrtt_ms = 40\ncycle_ms = 25\n')
    protocol = load_protocol(path)
    record = record_for(protocol, times)
    for run in record["runs"]:
        run.update(workload="image", steps=100, planned_steps=100)
    return protocol, record


@pytest.mark.parametrize("pactrain, decided", [
    ({1: None, 2: None, 3: None}, {"pactrain": "loss"}),  # never on any seed: no clock of "wan" can change it
    ({1: None, 2: None, 3: 40}, {}),  # one seed reaches it: how soon decides, and "wan" has no clocks yet
])
def test_a_loss_that_accuracy_alone_decides_is_reported_before_the_cells_clocks(tmp_path, pactrain, decided):
    protocol, record = two_cells(tmp_path, {"pactrain": pactrain, "topk": {1: 50, 2: 50, 3: 50},
                                            "fp16": {1: 100, 2: 100, 3: 100}})
    wan = verdicts(protocol, record)["cells"]["wan"]
    assert wan["pending"].startswith("final runs missing") and wan["by_accuracy"] == decided
    table = report.readme_table(protocol, verdicts(protocol, record))
    assert ("| image, 10mbit, 40 ms round trip | **loss** (pactrain; by accuracy, clocks pending) |" in table) == bool(decided)


def test_nothing_is_decided_by_accuracy_when_a_curve_differed_between_cells(tmp_path):
    protocol, record = two_cells(tmp_path, {"pactrain": {1: None, 2: None, 3: None}, "topk": {1: 50, 2: 50, 3: 50},
                                            "fp16": {1: 100, 2: 100, 3: 100}})
    assert verdicts(protocol, record)["cells"]["wan"]["by_accuracy"] == {"pactrain": "loss"}
    other = dict(a_run("final", "wan", "topk", "dgc-0.01", 1, reached_at=70), workload="image", steps=100, planned_steps=100)
    record["runs"].append(other)  # the same method and seed reached the target later on another link
    assert verdicts(protocol, record)["cells"]["wan"]["by_accuracy"] == {}
