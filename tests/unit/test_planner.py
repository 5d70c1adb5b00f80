"""pactrain_hvd.planner: bytes per step and step time per method, against hand-computed cases."""

import json

import pytest

from benchmarks.common.methods import parse_method as benchmark_method
from pactrain_hvd.core.masks import erk_sparsities, num_to_keep
from pactrain_hvd.planner import Costs, HorovodConfig, Link, Tensor, load_curves, parse_method, predict, traffic
from pactrain_hvd.planner.coordination import MEASURED, Coordination, with_coordination
from pactrain_hvd.planner.payload import pactrain_kept, with_ready_fractions
from pactrain_hvd.planner.step_model import StepPlan, Transfer, ring_allgather_s, ring_allreduce_s

# 8192 + 64 + 5000 + 10 + 64 = 13,330 parameters; three tensors of >= 2 dimensions, two of them >= 4096 elements
SHAPES = [("a.weight", (64, 128)), ("a.bias", (64,)), ("b.weight", (100, 50)), ("b.bias", (10,)), ("c.weight", (8, 8))]
TENSORS = [Tensor(name, shape) for name, shape in SHAPES]
FREE = HorovodConfig(cycle_time_s=0.0)


def sent(method: str, world_size: int = 2, ranking: str = "layer") -> tuple[int, int]:
    moved = traffic(parse_method(method), TENSORS, world_size, ranking=ranking)
    return moved.allreduce_bytes, moved.allgather_bytes


def test_dense_and_fp16_bytes():
    assert sent("dense") == (4 * 13_330, 0)
    assert sent("fp16") == (2 * 13_330, 0)


def test_topk_allgathers_values_and_indices_of_the_large_tensors():
    # k = ceil(0.01 * 8192) = 82 and ceil(0.01 * 5000) = 50, 8 bytes each; 64 + 10 + 64 small elements whole (fp32)
    assert sent("topk") == (4 * 138, 8 * 82 + 8 * 50)
    assert sent("topk-0.001") == (4 * 138, 8 * 9 + 8 * 5)


def test_powersgd_sends_p_and_q_of_the_matrices():
    # a: P 4*64, Q 4*128; b: P 4*100, Q 4*50 (fp32); c (64 elements) and the biases whole
    p = 4 * 4 * 64 + 4 * 4 * 100
    q = 4 * 4 * 128 + 4 * 4 * 50
    assert sent("powersgd") == (p + 4 * (64 + 10 + 64) + q, 0)
    moved = traffic(parse_method("powersgd"), TENSORS, 2)
    assert [r[0][0] for r in moved.rounds] == [p + 4 * 138, q]


def test_pactrain_packs_large_sparse_tensors_and_sends_the_rest_whole():
    # layer ranking at 0.9: a keeps 819, b 500 (packed); c (64 < 4096) and the biases whole
    assert sent("pactrain-0.9-fp16") == (2 * 819 + 2 * 500 + 2 * 64 + 2 * 74, 0)
    assert sent("pactrain-0.9") == (4 * 819 + 4 * 500 + 4 * 64 + 4 * 74, 0)
    assert sent("pactrain-0.9-bf16") == sent("pactrain-0.9-fp16")


def test_pactrain_ternary_uses_the_library_lanes():
    # 2 workers: base-5 digits, 13 to a word: 63 and 39 words + one fp32 scale each; whole tensors fp16
    assert sent("pactrain-0.9-ternary", 2) == (4 * 63 + 4 + 4 * 39 + 4 + 2 * 64 + 2 * 74, 0)
    # 16 workers: base-33 digits, 6 to a word
    assert sent("pactrain-0.9-ternary", 16) == (4 * 137 + 4 + 4 * 84 + 4 + 2 * 138, 0)
    # 645 workers: 2 digits to a word, no better than fp16, so packed values travel fp16
    assert sent("pactrain-0.9-ternary", 645) == sent("pactrain-0.9-fp16", 645)


def test_pactrain_erk_shares_follow_the_library():
    shares = erk_sparsities({name: shape for name, shape in SHAPES if len(shape) >= 2}, 0.9)
    kept = pactrain_kept(parse_method("pactrain-0.9"), TENSORS)
    assert kept == {name: num_to_keep(8192 if name == "a.weight" else 5000 if name == "b.weight" else 64, share)
                    for name, share in shares.items()}


def test_bytes_a_worker_sends_over_the_ring():
    moved = traffic(parse_method("topk"), TENSORS, 8)
    assert moved.sent_bytes(8) == pytest.approx(2 * 7 / 8 * 4 * 138 + 7 * 8 * 132)
    assert traffic(parse_method("dense"), TENSORS, 1).sent_bytes(1) == 0


def test_collective_times():
    link = Link(bytes_per_s=1.25e9, latency_s=10e-6)
    assert ring_allreduce_s(4_000_000, 8, link) == pytest.approx(14 * 10e-6 + 2 * 7 / 8 * 4e6 / 1.25e9)
    assert ring_allgather_s(1e6, 4, Link(1e8, 1e-3)) == pytest.approx(3e-3 + 3 * 1e6 / 1e8)


def test_step_time_of_one_tensor_after_backward():
    # 4 MB fp32 on 2 workers at 100 MB/s: 2 * 1/2 * 4e6 / 1e8 = 0.04 s after backward; + update
    tensors = [Tensor("w", (1000, 1000))]
    p = predict(parse_method("dense"), tensors, 2, Link(1e8), Costs(compute_s=0.1, update_s=0.01), FREE)
    assert p.step_s == pytest.approx(0.15)
    assert p.efficiency == pytest.approx(0.11 / 0.15)
    assert p.handed_bytes == 4_000_000 and p.sent_bytes == 4_000_000


def test_step_time_overlaps_the_earlier_gradient_with_backward():
    # b's gradient is ready halfway through backward (0.1 + 0.1 s) and done by 0.24; a's at 0.3, done 0.34
    tensors = [Tensor("a", (1000, 1000)), Tensor("b", (1000, 1000))]
    assert [t.ready_fraction for t in with_ready_fractions(tensors)] == [1.0, 0.5]
    p = predict(parse_method("dense"), tensors, 2, Link(1e8), Costs(compute_s=0.3), FREE)
    assert p.step_s == pytest.approx(0.34)


def test_powersgd_rounds_block_after_backward_and_extra_bytes_cost_link_time():
    tensors = [Tensor("w", (1000, 1000))]
    # P: 4 * 4 * 1000 = 16 kB, then Q 16 kB: 2 * 1/2 * 16e3 / 1e6 = 0.016 s each
    p = predict(parse_method("powersgd"), tensors, 2, Link(1e6), Costs(compute_s=0.1), FREE)
    assert p.step_s == pytest.approx(0.1 + 0.016 + 0.016)
    q = predict(parse_method("powersgd"), tensors, 2, Link(1e6), Costs(compute_s=0.1), FREE,
                coordination=Coordination(bytes_per_step=5e4))
    assert q.step_s == pytest.approx(p.step_s + 0.05)


def test_compression_costs_split_around_the_transfer():
    tensors = [Tensor("w", (1000, 1000))]
    costs = Costs(compute_s=0.1, compress_s={"fp16": 0.02})
    p = predict(parse_method("fp16"), tensors, 2, Link(1e8), costs, FREE)
    assert p.step_s == pytest.approx(0.1 + 0.02 + 2e6 / 1e8)
    assert p.compress_s == pytest.approx(0.02)


def test_curves_steps_to_target(tmp_path):
    path = tmp_path / "curves.json"
    path.write_text(json.dumps({"metric": "accuracy", "workers": 2,
                                "curves": {"fp16": [[80, 0.8], [40, 0.6]], "pactrain-0.9-fp16-w0-0.3": [[40, 0.5], [80, 0.7]]}}))
    curves = load_curves(path)
    assert set(curves.by_method) == {"fp16", "pactrain-0.9-fp16"}
    assert curves.by_method["fp16"].steps_to(0.7) == 80
    assert curves.by_method["pactrain-0.9-fp16"].steps_to(0.75) is None
    assert curves.default_target() == 0.7  # the worst final: every curve reaches it
    perplexity = tmp_path / "ppl.json"
    perplexity.write_text(json.dumps({"metric": "val_perplexity", "curves": {"dense": [[10, 9.0], [20, 5.0]]}}))
    assert load_curves(perplexity).by_method["dense"].steps_to(6.0) == 20


def test_curves_from_a_benchmark_record(tmp_path):
    path = tmp_path / "record.json"
    run = {"metric": "test_accuracy", "steps": 80, "curve": [[10.0, 40, 0.6, 1], [20.0, 80, 0.8, 2]]}
    stopped = {"metric": "test_accuracy", "steps": 40, "curve": [[10.0, 40, 0.5, 1]]}
    path.write_text(json.dumps({"cells": {"image/5mbit/2w": {"workers": 2, "steps": 80, "runs": {
        "topk": run, "ddp-powersgd": run, "fp16": stopped}}}}))
    curves = load_curves(path)
    assert list(curves.by_method) == ["topk", "fp16"] and curves.by_method["topk"].workers == 2
    assert curves.default_target() == 0.8  # the budget-stopped fp16 run does not set it
    with pytest.raises(ValueError, match="--cell 'nope'"):
        load_curves(path, "nope")


@pytest.mark.parametrize("text, message", [("{}", "--curve"), ("[", "not JSON"),
                                            ('{"curves": {"fp16": [[1]]}}', "step, metric")])
def test_bad_curve_files_name_the_argument(tmp_path, text, message):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_curves(path)


@pytest.mark.parametrize("name, message", [("topk-2", "density"), ("pactrain-1.5", "sparsity"), ("sgd", "unknown method"),
                                            ("powersgd-r0", "rank"), ("diloco-h1-fp16", "interval"),
                                            ("pactrain-0.9-sync1", "interval"), ("diloco-h10", "unknown method")])
def test_bad_method_names(name, message):
    with pytest.raises(ValueError, match=message):
        parse_method(name)


def test_curve_portability():
    assert parse_method("pactrain-0.9-fp16").curve_portable and parse_method("powersgd").curve_portable
    assert not parse_method("topk").curve_portable and not parse_method("pactrain-0.95-ternary").curve_portable
    assert parse_method("pactrain-0.9").packed_values == "inherit"
    assert not parse_method("pactrain-0.9-fp16-sync25").curve_portable and not parse_method("diloco-h25-fp32").curve_portable


def test_local_steps_spread_one_unhidden_sync_over_the_interval():
    # b's gradient is ready halfway through backward, but a sync starts after the update: both wait.
    tensors = [Tensor("a", (1000, 1000)), Tensor("b", (1000, 1000))]
    costs = Costs(compute_s=0.3, update_s=0.01)
    per_step = predict(parse_method("dense"), tensors, 2, Link(1e8), costs, FREE)
    assert per_step.step_s == pytest.approx(0.35)  # b's transfer hidden behind backward (0.2 to 0.24), a's not
    diloco = predict(parse_method("diloco-h10-fp32"), tensors, 2, Link(1e8), costs, FREE)
    assert diloco.method.kind == "dense" and diloco.method.sync_every == 10
    assert diloco.step_s == pytest.approx(0.31 + (0.04 + 0.04) / 10)
    assert diloco.handed_bytes == per_step.handed_bytes / 10 and diloco.sent_bytes == per_step.sent_bytes / 10
    local = predict(parse_method("pactrain-0.9-int3-sync25"), TENSORS, 2, Link(1e6), Costs(compute_s=0.1), FREE)
    every_step = predict(parse_method("pactrain-0.9-int3"), TENSORS, 2, Link(1e6), Costs(compute_s=0.1), FREE)
    assert local.handed_bytes == round(every_step.handed_bytes / 25)
    assert 0.1 < local.step_s < 0.1 + (every_step.step_s - 0.1) / 2
    assert local.method.name == "pactrain-0.9-int3-sync25" and "a sync every 25 steps" in local.method.describe()


def test_coordination_shares_the_link_in_proportion_to_the_idle_cycles():
    # 60 kB after a 0.3 s backward on 600 kB/s: 0.1 s of wire, nothing hidden
    plan = StepPlan(forward_s=0.1, backward_s=0.2, hooked=[Transfer(1.0, 60_000)])
    link, config = Link(600e3), HorovodConfig(cycle_time_s=0.001)
    quiet = with_coordination(plan, 2, link, config, Coordination())
    assert quiet.step_s == pytest.approx(0.4, abs=0.001) and quiet.coordination_bytes == 0  # + half a cycle
    per_cycle = with_coordination(plan, 2, link, config, Coordination(bytes_per_cycle=240))
    # the fixed point: the gradients move at 600 kB/s less 240 B x idle cycles / step
    step, busy = per_cycle.prediction.step_s, per_cycle.prediction.busy_s
    rate = 240 * (step - busy) / (0.001 * step)
    assert busy == pytest.approx(60_000 / (600e3 - rate), rel=1e-4)
    assert per_cycle.cycles == pytest.approx((step - busy) / 0.001)
    assert per_cycle.coordination_bytes == pytest.approx(240 * per_cycle.cycles)
    # a longer cycle sends fewer coordination bytes and costs less time; the remainder is charged at the full rate
    slow = with_coordination(plan, 2, link, HorovodConfig(cycle_time_s=0.025), Coordination(240, 6_000))
    assert quiet.step_s + 0.01 < slow.step_s < per_cycle.step_s
    assert slow.step_s == pytest.approx(slow.prediction.step_s + 6_000 / 600e3)
    # one worker sends nothing
    assert with_coordination(plan, 1, link, config, MEASURED).coordination_bytes == 0


def test_coordination_is_noise_on_a_fast_link():
    tensors = [Tensor("w", (1000, 1000))]
    costs, config = Costs(compute_s=0.1), HorovodConfig(cycle_time_s=0.001)
    free = predict(parse_method("fp16"), tensors, 8, Link.gbit(10), costs, config)
    busy = predict(parse_method("fp16"), tensors, 8, Link.gbit(10), costs, config, MEASURED)
    assert busy.step_s == pytest.approx(free.step_s, rel=0.01) and busy.coordination_bytes > 0


SHARED_NAMES = ("dense", "fp16", "topk", "topk-0.001", "powersgd-r8", "pactrain-0.9", "pactrain-0.9-fp16",
                "pactrain-0.95-ternary-w0-0", "pactrain-0.9-int3-w0-0-rescale-sync25", "diloco-h25-fp16", "diloco-h10-fp32")


@pytest.mark.parametrize("name", SHARED_NAMES)
def test_the_benchmark_and_the_planner_read_a_name_alike(name):
    spec, method = benchmark_method(name), parse_method(name)
    assert (spec.sparsity, spec.density, spec.rank, spec.sync_every) == (method.sparsity, method.density, method.rank,
                                                                         method.sync_every)
    assert spec.levels == method.levels and spec.fp16_values == (method.values == "fp16" or method.kind == "fp16")
    assert spec.kind == method.kind or (spec.kind, method.kind) in (("diloco", "dense"), ("diloco", "fp16"))


@pytest.mark.parametrize("name, message", [("dgc-0.01", "no traffic model for dgc"), ("randomk-0.1", "randomk"),
                                            ("dgc", "needs its density"), ("randomk-1", r"in \(0, 1\)")])
def test_the_planner_names_what_it_has_no_model_for(name, message):
    with pytest.raises(ValueError, match=message):
        parse_method(name)
