"""From rank records to cell figures, target verdicts and the markdown table."""

import pytest

from benchmarks.common.methods import parse_method, pruning_schedule
from benchmarks.common.timing import PhaseClock, StepTimes, instrument
from benchmarks.runner.summary import summarize_cell
from benchmarks.throughput.report import evaluate_targets, markdown, minimum_payload_bytes


def rank_record(rank, totals, tx_bytes, payload, batch=8, control=1000.0):
    steps = [dict(total=t, compute=0.6 * t, compress=0.1 * t, comm_wait=0.2 * t, update=0.1 * t) for t in totals]
    return {"rank": rank, "size": 2, "batch_size": batch, "steps": steps, "losses": [2.0, 1.0],
            "nic": {"tx_bytes": tx_bytes, "rx_bytes": tx_bytes}, "control_tx_bytes_per_s": control, "payload": payload}


def test_summarize_cell_takes_the_slowest_rank_per_step_and_counts_bytes():
    payload = {"allreduce_bytes": 1_000_000, "allgather_bytes": 0}
    ranks = [rank_record(0, [1.0, 2.0, 1.0], 3_300_000, payload), rank_record(1, [1.5, 1.0, 1.0], 3_300_000, payload)]
    cell = summarize_cell(ranks, {"mbit_per_s": 80.0}, {"samples_per_s": 20.0})
    assert cell["step_s_all"] == [1.5, 2.0, 1.0]
    assert cell["step_s"] == 1.5
    assert cell["samples_per_s"] == pytest.approx(2 * 8 / 1.5)
    assert cell["ratio_to_bound"] == pytest.approx(16 / 1.5 / 20)
    assert cell["ideal_ring_bytes_per_worker"] == 1_000_000  # 2 (n-1)/n B with n = 2
    assert cell["wire_tx_bytes_per_step"] == 1_100_000
    assert cell["wire_over_ideal"] == pytest.approx(1.1)
    assert cell["ideal_wire_s"] == pytest.approx(1_000_000 / 10e6)  # 80 Mbit/s = 10 MB/s
    assert cell["control_tx_bytes_per_step"] == pytest.approx(1000 * 1.5)


def test_summarize_cell_counts_allgather_as_n_minus_1_blocks():
    payload = {"allreduce_bytes": 0, "allgather_bytes": 500}
    ranks = [rank_record(r, [1.0], 600, payload) for r in range(2)]
    ranks[0]["size"] = ranks[1]["size"] = 2
    assert summarize_cell(ranks, {"mbit_per_s": 1.0}, {"samples_per_s": 1.0})["ideal_ring_bytes_per_worker"] == 500


def _cell(model, link, method, samples, bound=10.0, **extra):
    return {"model": model, "link": link, "method": method, "samples_per_s": samples, "ratio_to_bound": samples / bound,
            "step_s": 1.0, "phases_s": dict(compute=0.5, compress=0.1, comm_wait=0.3, update=0.1),
            "ideal_ring_bytes_per_worker": 1000.0, "wire_tx_bytes_per_step": 1100.0, "wire_over_ideal": 1.1,
            "data_over_ideal": 1.02, "control_tx_bytes_per_step": 80.0, "ideal_wire_s": 0.01,
            "payload": {"allreduce_bytes": 1000, "allgather_bytes": 0}, **extra}


def results_doc():
    stats = {"tensors": {"w": {"numel": 1000, "kept": 100, "packed": True},
                         "small": {"numel": 100, "kept": 10, "packed": False},
                         "bias": {"numel": 100, "kept": 100, "packed": False}}}
    cells = [
        _cell("vgg16", "100mbit", "dense", 1.0), _cell("vgg16", "100mbit", "topk", 6.0),
        _cell("vgg16", "100mbit", "powersgd", 9.5),
        _cell("vgg16", "100mbit", "pactrain-0.9-fp16", 9.2, pactrain_stats=stats,
              payload={"allreduce_bytes": 600, "allgather_bytes": 0}, wire_tx_bytes_per_step=700.0),
        {"model": "vgg16", "link": "100mbit", "method": "fp16", "error": "rank 1 exited with 1"},
    ]
    config = {"world_size": 2, "threads": 1, "warmup": 1, "steps": 3, "models": ["vgg16"], "batch_sizes": {"vgg16": 16},
              "methods": ["dense", "fp16", "topk", "powersgd", "pactrain-0.9-fp16"]}
    return {"meta": {"started": "now", "config": config, "horovod": "0.28.1", "torch": "2", "cpu_count": 2,
                     "loadavg_start": [1.0, 1.0, 1.0], "loadavg_end": [1.0, 1.0, 1.0]},
            "links": {"100mbit": {"mbit_per_s": 95.0, "probes": [{"mbit_per_s": 95.0}, {"mbit_per_s": 96.0}],
                                  "qdisc": "tbf"}},
            "bounds": [{"model": "vgg16", "link": "100mbit", "samples_per_s": 10.0, "step_s": 1.6}], "cells": cells}


def test_minimum_payload_is_survivors_of_packed_tensors_plus_what_the_plan_keeps_dense():
    cell = results_doc()["cells"][3]
    assert minimum_payload_bytes(cell) == 2 * (100 + 100 + 100)


def test_target_verdicts():
    verdicts = {v["target"]: v for v in evaluate_targets(results_doc())}
    bound = verdicts[">= 0.9x concurrent compute bound"]
    assert bound["met"] and bound["value"] == pytest.approx(0.92)
    assert not verdicts["never slower than any peer"]["met"]
    assert verdicts["never slower than any peer"]["note"] == "fastest peer: powersgd"
    assert verdicts[">= 1.25x Top-k"]["value"] == pytest.approx(9.2 / 6.0)
    assert verdicts[">= 8x dense"]["met"]
    assert verdicts["payload within 2% of minimum (min / handed)"]["value"] == 1.0
    assert verdicts["NIC tx bytes within 2% of ring(minimum) (ring(min) / tx)"]["value"] == pytest.approx(600 / 700)


def test_markdown_lists_cells_targets_and_failures():
    text = markdown(results_doc())
    assert "| vgg16 | 100mbit | pactrain-0.9-fp16 | 9.20 | 0.92 | 9.20 |" in text
    assert "vgg16 100mbit fp16: rank 1 exited with 1" in text
    assert "| **no** |" in text


@pytest.mark.parametrize("name, kind, sparsity, fp16", [
    ("dense", "dense", 0.0, False), ("fp16", "fp16", 0.0, True), ("pactrain-0.9-fp16", "pactrain", 0.9, True),
    ("pactrain-0.95", "pactrain", 0.95, False),
])
def test_parse_method(name, kind, sparsity, fp16):
    spec = parse_method(name)
    assert (spec.kind, spec.sparsity, spec.fp16_values) == (kind, sparsity, fp16)


def test_parse_method_options_and_errors():
    assert parse_method("topk").density == 0.01 and parse_method("topk-0.001").density == 0.001
    assert parse_method("powersgd").rank == 4 and parse_method("powersgd-r8").rank == 8
    assert parse_method("pactrain-0.9-fp16").window is None
    spec = parse_method("pactrain-0.9-ternary-w0-0.3")
    assert (spec.sparsity, spec.packed_values, spec.window) == (0.9, "ternary", (0.0, 0.3))
    int3 = parse_method("pactrain-0.9-int3-w0-0")
    assert (int3.packed_values, int3.levels, int3.quantized_values, int3.fp16_values) == ("int3", 3, True, False)
    fp16 = parse_method("pactrain-0.9-fp16")
    assert (fp16.packed_values, fp16.quantized_values, fp16.fp16_values) == ("inherit", False, True)
    with pytest.raises(ValueError, match="pruning window"):
        parse_method("pactrain-0.9-fp16-w0.5-0.2")
    first = parse_method("pactrain-0.95-ternary-w0-0")
    assert pruning_schedule(first, 600) == {"total_steps": 600, "begin_step": 0, "end_step": 0}  # packed from step 0
    rescaled = parse_method("pactrain-0.95-ternary-w0-0-rescale")
    assert pruning_schedule(rescaled, 600) == {"total_steps": 600, "begin_step": 0, "end_step": 0,
                                               "rescale_survivors": True}
    assert not first.rescale_survivors and parse_method("pactrain-0.9-local40-rescale").local_steps == 40
    ramp = parse_method("pactrain-0.98-ternary-ramp50")
    assert (ramp.sparsity, ramp.packed_values, ramp.window, ramp.ramp) == (0.98, "ternary", None, 50)
    schedule = pruning_schedule(ramp, 600)["schedule"].polynomial()
    assert (schedule.initial_sparsity, schedule.final_sparsity, schedule.end_step, schedule.frequency) == (0.5, 0.98, 50, 1)
    with pytest.raises(ValueError, match="unknown method"):
        parse_method("pactrain")


def test_parse_local_step_methods():
    local = parse_method("pactrain-0.9-int3-w0-0-sync10")
    assert (local.kind, local.packed_values, local.window, local.sync_every) == ("pactrain", "int3", (0.0, 0.0), 10)
    assert parse_method("pactrain-0.9-int3-w0-0").sync_every == 1
    diloco = parse_method("diloco-h25-fp32")
    assert (diloco.kind, diloco.sync_every, diloco.fp16_values, diloco.sparsity) == ("diloco", 25, False, 0.0)
    assert parse_method("diloco-h10-fp16").fp16_values
    average = parse_method("ddp-average-h50")
    assert (average.kind, average.frontend, average.sync_every) == ("average", "ddp", 50)
    for name, message in (("ddp-diloco-h10-fp16", "DDP runs"), ("ddp-pactrain-0.9-sync10", "DDP runs"),
                          ("tf-pactrain-0.9-sync10", "TensorFlow runs"), ("diloco-h1-fp16", "interval"),
                          ("average-h10", "unknown method")):
        with pytest.raises(ValueError, match=message):
            parse_method(name)


def test_step_phases_add_up():
    times = StepTimes.from_marks(0.0, 1.0, 1.5, 1.6, compress_in_backward=0.2, compress_in_synchronize=0.1)
    assert (times.compute, times.compress, times.comm_wait, times.update) == pytest.approx((0.8, 0.3, 0.4, 0.1))
    assert times.compute + times.compress + times.comm_wait + times.update == pytest.approx(times.total)


def test_instrument_times_static_and_plain_methods_and_restores_them():
    class Codec:
        @staticmethod
        def compress(x):
            return x + 1

        def decompress(self, x):
            return x - 1

    clock = PhaseClock()
    restore = instrument(Codec, ("compress", "decompress"), clock)
    assert Codec.compress(1) == 2 and Codec().decompress(2) == 1
    assert clock.take() > 0 and clock.seconds == 0
    restore()
    assert isinstance(Codec.__dict__["compress"], staticmethod) and Codec.compress(1) == 2


def test_tensorflow_method_names_and_their_worker():
    from benchmarks.common.methods import TF_METHODS, worker_module

    spec = parse_method("tf-pactrain-0.9-ternary")
    assert (spec.kind, spec.frontend, spec.framework, spec.sparsity, spec.packed_values) == (
        "pactrain", "tf", "tensorflow", 0.9, "ternary")
    assert parse_method("keras-fp16").fp16_values and parse_method("keras-fp16").frontend == "keras"
    assert worker_module(spec) == "benchmarks.throughput.tf_worker"
    assert worker_module(parse_method("ddp-fp16")) == "benchmarks.throughput.worker"
    assert parse_method("pactrain-0.9").framework == "torch"
    assert all(parse_method(name).framework == "tensorflow" for name in TF_METHODS)
    for bad in ("tf-topk", "keras-powersgd", "tf-ddp-fp16", "tf-"):
        with pytest.raises(ValueError):
            parse_method(bad)


def test_tensorflow_cells_sit_beside_torch_with_their_own_dense_and_bound():
    from benchmarks.throughput.report import framework_rows

    doc = results_doc()
    doc["cells"] += [
        _cell("vgg16", "100mbit", "tf-dense", 2.0, bound=20.0, phases_in_graph=True, traces_first_call=2, traces=2),
        _cell("vgg16", "100mbit", "tf-pactrain-0.9-fp16", 14.0, bound=20.0, phases_in_graph=True, pack_unpack_s=0.004,
              traces_first_call=2, traces=2),
    ]
    rows = {row["method"]: row for row in framework_rows(doc)}
    assert set(rows) == {"tf-dense", "tf-pactrain-0.9-fp16"}
    packed = rows["tf-pactrain-0.9-fp16"]
    assert packed["over_dense"] == pytest.approx(7.0)  # over tf-dense, not torch's dense
    assert packed["torch_over_dense"] == pytest.approx(9.2)
    assert packed["speedup_vs_torch"] == pytest.approx(7.0 / 9.2)
    assert packed["ratio_to_bound"] == pytest.approx(0.7) and packed["torch_ratio_to_bound"] == pytest.approx(0.92)
    assert packed["traces"] == (2, 2) and packed["pack_unpack_s"] == 0.004
    text = markdown(doc)
    assert "## TensorFlow beside torch" in text
    assert "| vgg16 | 100mbit | tf-pactrain-0.9-fp16 | 14.00 | 0.70 | 7.00 | 9.20 | 0.92 | 9.20 | 0.76 |" in text
    assert "| 500 / – / 300 in graph / – |" in text  # one graph per step: no compress or update phase of its own


def test_summarize_cell_carries_the_tensorflow_figures():
    payload = {"allreduce_bytes": 1000, "allgather_bytes": 0}
    ranks = [dict(rank_record(r, [1.0], 1100, payload), framework="tensorflow", phases_in_graph=True, traces=2,
                  traces_first_call=2, pack_unpack_s=0.003) for r in range(2)]
    cell = summarize_cell(ranks, {"mbit_per_s": 1.0}, {"samples_per_s": 1.0})
    assert (cell["framework"], cell["phases_in_graph"], cell["traces"], cell["pack_unpack_s"]) == (
        "tensorflow", True, 2, 0.003)
    assert "traces" not in summarize_cell([rank_record(r, [1.0], 1100, payload) for r in range(2)],
                                          {"mbit_per_s": 1.0}, {"samples_per_s": 1.0})
