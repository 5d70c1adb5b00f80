"""pactrain_hvd.planner.step_model: alpha-beta collectives, Horovod's cycle and fusion, overlap."""

import pytest

from benchmarks.model import step_time_model as script
from pactrain_hvd.planner.step_model import (
    ALLGATHER,
    ALLREDUCE,
    BackgroundLoop,
    HorovodConfig,
    Link,
    Stage,
    StepPlan,
    Submitted,
    Transfer,
    expected_step,
    fuse,
    predict_step,
    ring_allgather_s,
    ring_allreduce_s,
)

TEN_GBIT = Link.gbit(10, latency_s=10e-6)
NO_CYCLE = HorovodConfig(cycle_time_s=0.0)


def test_ring_allreduce_alpha_beta():
    # 2 (n-1) alpha + 2 (n-1)/n B / beta = 14 * 10 us + 1.75 * 4 MB / 1.25 GB/s
    assert ring_allreduce_s(4_000_000, 8, TEN_GBIT) == pytest.approx(140e-6 + 5.6e-3)
    assert ring_allreduce_s(4_000_000, 2, Link(1e6)) == pytest.approx(4.0)  # 2 workers: each sends B once
    assert ring_allreduce_s(4_000_000, 1, TEN_GBIT) == 0.0
    # bytes per worker stay under 2 B: 1024 workers cost < 2x of 2 workers' bandwidth term
    assert ring_allreduce_s(1e6, 1024, Link(1e6)) == pytest.approx(2 * 1023 / 1024)


def test_ring_allgather_grows_with_workers_and_host_copies_count():
    assert ring_allgather_s(1000, 2, Link(1000.0)) == pytest.approx(1.0)
    assert ring_allgather_s(1000, 1024, Link(1000.0, latency_s=1e-3)) == pytest.approx(1023 * (1 + 1e-3))
    # copy in + copy out of the fusion buffer: 2 B at copy_bytes_per_s
    assert ring_allreduce_s(1000, 2, Link(1000.0, copy_bytes_per_s=2000.0)) == pytest.approx(2.0)


def test_fusion_groups_by_collective_and_dtype_and_respects_the_threshold():
    items = [Submitted(0, 40, ALLREDUCE, "float32"), Submitted(0, 40, ALLREDUCE, "float32"),
             Submitted(0, 40, ALLREDUCE, "float32"), Submitted(0, 10, ALLREDUCE, "float16"),
             Submitted(0, 10, ALLGATHER, "float32"), Submitted(0, 500, ALLREDUCE, "float32")]
    buffers = fuse(items, threshold_bytes=100)
    assert [[b.nbytes for b in buffer] for buffer in buffers] == [[40, 40], [40], [500], [10], [10]]


def test_a_gradient_waits_for_the_next_cycle_and_the_loop_is_serial():
    link = Link(1000.0)  # 1 byte = 1 ms
    loop = BackgroundLoop(2, link, HorovodConfig(cycle_time_s=0.005))
    assert loop.run([Submitted(0.012, 2, ALLREDUCE, "float32")]) == [pytest.approx(0.017)]  # cycle at 15 ms
    # a 20 ms transfer at 20 ms: the next cycle starts when it is done (40 ms), not at 25 ms
    done = loop.run([Submitted(0.020, 20, ALLREDUCE, "float32"), Submitted(0.021, 1, ALLREDUCE, "float32")])
    assert done == [pytest.approx(0.040), pytest.approx(0.041)]


def test_transfers_hidden_behind_backward_cost_nothing_the_last_one_is_exposed():
    link = Link(1000.0)  # 1 byte = 1 ms
    hidden = StepPlan(forward_s=0.05, backward_s=0.1, hooked=[Transfer(0.5, 10)], update_s=0.01)
    assert predict_step(hidden, 2, link, NO_CYCLE).step_s == pytest.approx(0.16)
    exposed = StepPlan(forward_s=0.05, backward_s=0.1, hooked=[Transfer(1.0, 10)], update_s=0.01)
    prediction = predict_step(exposed, 2, link, NO_CYCLE)
    assert prediction.step_s == pytest.approx(0.17) and prediction.comm_wait_s == pytest.approx(0.01)
    # too many bytes for the rest of backward: the link, not compute, sets the step
    heavy = StepPlan(forward_s=0.0, backward_s=0.1, hooked=[Transfer(0.0, 300)])
    assert predict_step(heavy, 2, link, NO_CYCLE).step_s == pytest.approx(0.3)


def test_hook_compression_delays_backward_and_a_straggler_delays_every_collective():
    link = Link(1000.0)
    plan = StepPlan(forward_s=0.0, backward_s=0.1, hooked=[Transfer(1.0, 5)], hook_cpu_s=0.02, finish_s=0.01)
    assert predict_step(plan, 2, link, NO_CYCLE).step_s == pytest.approx(0.1 + 0.02 + 0.005 + 0.01)
    slow = StepPlan(forward_s=0.0, backward_s=0.1, hooked=[Transfer(1.0, 5)], straggler_s=0.03)
    prediction = predict_step(slow, 2, link, NO_CYCLE)
    assert prediction.step_s == pytest.approx(0.135) and prediction.comm_wait_s == pytest.approx(0.035)


def test_blocking_stages_add_up_like_powersgd():
    link = Link(1000.0)
    plan = StepPlan(forward_s=0.01, backward_s=0.1, stages=[Stage(0.02, ((5, ALLREDUCE, "float32"),)),
                                                           Stage(0.01, ((3, ALLREDUCE, "float32"),))],
                    finish_s=0.02, update_s=0.01)
    prediction = predict_step(plan, 2, link, NO_CYCLE)
    assert prediction.step_s == pytest.approx(0.11 + 0.02 + 0.005 + 0.01 + 0.003 + 0.02 + 0.01)
    assert prediction.compress_s == pytest.approx(0.05) and prediction.comm_wait_s == pytest.approx(0.008)


def test_expected_step_averages_the_cycle_phase():
    link = Link(1e12)
    plan = StepPlan(forward_s=0.0, backward_s=0.1, hooked=[Transfer(1.0, 1)])  # ready on the grid at 100 ms
    config = HorovodConfig(cycle_time_s=0.008)
    # phases k T/8: waits T (8-k)/8 mod T -> mean 28/64 T
    assert expected_step(plan, 2, link, config).comm_wait_s == pytest.approx(28 / 64 * 0.008, abs=1e-9)


def test_link_rejects_nonsense():
    with pytest.raises(ValueError, match="bytes_per_s"):
        Link(0)
    with pytest.raises(ValueError, match="world_size"):
        ring_allreduce_s(10, 0, TEN_GBIT)


TENSORS = [{"name": "fc", "shape": [512, 512], "ready_fraction": 0.1}, {"name": "bias", "shape": [512], "ready_fraction": 0.2}]
SPLITS = {"topk": {"select_s": 0.8, "zero_s": 0.1, "scatter_per_worker_s": 0.05},
          "powersgd": {"project_p_s": 1.0, "project_q_s": 1.0, "reconstruct_s": 2.0}}


def test_plans_hand_horovod_what_the_methods_send():
    def plan(method, n=2):
        return script.build_plan(method, TENSORS, n, 0.01, 0.02, compress_s=1.0, update_s=0.0, splits=SPLITS)

    assert script.payload_bytes(plan("dense")) == 4 * (512 * 512 + 512)
    assert script.payload_bytes(plan("pactrain-0.9-fp16")) == 2 * (26214 + 512)
    topk = plan("topk")
    assert script.payload_bytes(topk) == 8 * 2622 + 4 * 512
    assert topk.hook_cpu_s == pytest.approx(0.8) and topk.finish_s == pytest.approx(0.2)
    assert plan("topk", 64).finish_s == pytest.approx(0.1 + 64 * 0.05)  # one index_add per worker's pairs
    powersgd = plan("powersgd")
    assert [s.cpu_s for s in powersgd.stages] == [0.25, 0.25] and powersgd.finish_s == 0.5
    ternary = plan("pactrain-0.9-ternary")  # from the hooks: the codes, the next scale's MAX; the bias
    assert not ternary.stages
    assert [(t.nbytes, t.dtype) for t in ternary.hooked] == [
        (4 * -(-26214 // 13), "int32"), (4, "float32-max"), (4 * 512, "float32")]  # 2 ranks: 13 base-5 digits per int32


def test_tta_rows_take_a_runs_own_phases_or_a_loopback_runs_and_skip_ddp():
    """A: the run's own last-third phases; B: the cell's bound split as the loopback's, its CPU costs; DDP skipped."""
    def run(step_s, compute, compress, update):
        return {"step_s": [9.0] * 4 + [step_s] * 8,  # the last third is what counts
                "phases_s": {"compute": [compute] * 12, "compress": [compress] * 12, "update": [update] * 12}}

    profile = {"copy_bytes_per_s": 1e12, "workloads": {"image": {"forward_s": 1.0, "backward_s": 3.0, "tensors": TENSORS}}}
    cell = {"workload": "image", "workers": 2, "probed_mbit_per_s": 100.0, "bound": {"step_s": 0.2},
            "runs": {"dense": run(0.3, 0.2, 0.0, 0.01), "ddp-fp16": run(0.3, 0.2, 0.0, 0.01)}}
    loop = {"workload": "image", "workers": 2, "bound": {"step_s": 0.1, "compute_s": 0.09, "update_s": 0.01},
            "runs": {"dense": run(0.2, 0.09, 0.0, 0.01)}}
    rows = script.tta_rows({"cells": {"image/100mbit/2w": cell}}, {"cells": {"x": loop}}, profile)
    assert [r["method"] for r in rows] == ["dense"] and rows[0]["measured_s"] == 0.3
    # 84 ms of wire leave 10-20 % into a 150 ms backward: hidden, the step is compute + update + a cycle at most
    assert 0.21 <= rows[0]["pred_A_s"] <= 0.21 + 1.5e-3
    # B's compute is 0.18 s (the bound's 0.2 s split 0.09 : 0.01), A's 0.2 s: the same wire, 20 ms apart
    assert rows[0]["pred_A_s"] - rows[0]["pred_B_s"] == pytest.approx(0.02, abs=2e-3)
