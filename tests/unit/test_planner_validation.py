"""benchmarks.model.planner_validation: every record found, each cell at its own cycle time, budget-stopped and
-localN runs predicted over what they ran, the cycle-time cells kept for the fit, the evidence protocol's runs."""

import json
from pathlib import Path

import pytest

from benchmarks.model import planner_validation as pv

TTA = pv.TTA


def test_records_are_found_by_globbing():
    assert set(pv.RECORDS) == set(TTA.glob("**/record.json"))
    assert TTA / "link-bound" / "2mbit-8w" / "record.json" in pv.RECORDS
    assert pv.FIT_RECORDS and all(path.parent.parent.name == "cycle-time" for path in pv.FIT_RECORDS)


@pytest.mark.parametrize("path, cell, expected", [
    (TTA / "link-bound" / "2mbit-8w" / "record.json", {"cycle_time_ms": 20.0}, 20.0),
    (TTA / "cycle-time" / "25ms" / "record.json", {}, 25.0),
    (TTA / "link-bound" / "5mbit" / "record.json", {}, 1.0),  # recorded before the header named it: Horovod's 1 ms
    (Path("elsewhere/25ms/record.json"), {}, 1.0),
])
def test_cycle_time_of_a_cell(path, cell, expected):
    assert pv.cycle_time_ms(path, cell) == expected


@pytest.fixture(scope="module")
def rows():
    prof = json.loads(pv.PROFILE.read_text())
    records = [TTA / "link-bound" / "2mbit-8w" / "record.json", TTA / "link-bound" / "10mbit" / "record.json",
               *pv.FIT_RECORDS]
    return {(row["cell"], row["method"]): row for row in pv.validate(records, prof, json.loads(pv.LOOPBACK.read_text()))}


def test_validation_rows(rows):
    assert not any("cycle-time" in row["record"] for row in rows.values())  # the fit's cells are not validated
    assert {row["cycle_ms"] for key, row in rows.items() if key[0] == "image/2mbit/8w"} == {20.0}
    assert rows[("image/10mbit/2w", "fp16")]["steps"] == 80  # stopped by its budget at step 80 of 600
    assert rows[("image/10mbit/2w", "fp16")]["cycle_ms"] == 1.0
    # 40 local steps of 8 workers' batch before the 600: the 600 alone are no longer than the plain run's
    local = rows[("image/2mbit/8w", "pactrain-0.98-ternary-w0-0-local40")]
    plain = rows[("image/2mbit/8w", "pactrain-0.98-ternary-w0-0")]
    assert local["A_s"] > plain["A_s"]
    for row in rows.values():
        assert abs(row["A_s"] / row["measured_s"] - 1) < 0.5, row


def test_protocol_rows_predict_local_steps_with_one_sync_an_interval():
    prof, loopback = json.loads(pv.PROFILE.read_text()), json.loads(pv.LOOPBACK.read_text())
    rows = pv.protocol_rows(json.loads(pv.EVIDENCE.read_text()), prof, loopback)
    assert not any(row["method"].startswith(("dgc-", "randomk-", "ddp-")) for row in rows)  # no traffic model
    local = [row for row in rows if row["method"].startswith("diloco-") or "-sync" in row["method"]]
    assert local
    # a sync every step would predict DiLoCo's fp16 at 10 Mbit/s about 18x its measured time
    for row in local:
        assert abs(row["A_s"] / row["measured_s"] - 1) < 0.5, row
