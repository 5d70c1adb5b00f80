"""Ternary lanes: exact integer sums over simulated ranks, one digit layout for numpy, torch and TF, unbiased
rounding, error feedback, and the ternary path of PacTrainCompressor."""

import math
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# Before horovod.tensorflow (pactrain_hvd.tensorflow below): Horovod's process sets follow the framework whose
# module was imported last, and the TF unit tests need TF's (hvd.global_process_set.included()).
import horovod.torch  # noqa: E402, F401
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
import torch  # noqa: E402

from pactrain_hvd.core import StepStats, TensorStats  # noqa: E402
from pactrain_hvd.core import lanes as core  # noqa: E402
from pactrain_hvd.tensorflow import lanes as tf_lanes  # noqa: E402
from pactrain_hvd.tensorflow import quantized as tf_quantized  # noqa: E402
from pactrain_hvd.torch import PacTrainCompressor  # noqa: E402
from pactrain_hvd.torch import lanes as torch_lanes  # noqa: E402
from pactrain_hvd.torch.memory import ErrorFeedback  # noqa: E402


@pytest.mark.parametrize("world_size, lanes", [(1, 19), (2, 13), (3, 11), (4, 9), (8, 7), (16, 6), (64, 4),
                                               (256, 3), (644, 3), (645, 2)])
def test_layout_from_world_size(world_size, lanes):
    layout = core.lane_layout(world_size)
    assert (layout.radix, layout.lanes) == (2 * world_size + 1, lanes)
    assert layout.radix**layout.lanes <= 2**31 < layout.radix ** (layout.lanes + 1)
    assert layout.lanes >= 31 // math.ceil(math.log2(2 * world_size + 1))  # never fewer than bit fields
    assert (core.quantized_layout(world_size) is None) == (lanes < 3)  # fp16 fallback beyond 644 ranks


@pytest.mark.parametrize("world_size, lanes", [(1, 11), (2, 8), (4, 6), (8, 5), (32, 4), (214, 3), (215, 2)])
def test_int3_layout_from_world_size(world_size, lanes):
    layout = core.lane_layout(world_size, levels=3)
    assert (layout.radix, layout.lanes, layout.offset) == (6 * world_size + 1, lanes, 3)
    assert layout.radix**layout.lanes <= 2**31 < layout.radix ** (layout.lanes + 1)
    assert (core.quantized_layout(world_size, 3) is None) == (lanes < 3)  # fp16 fallback beyond 214 ranks


@pytest.mark.parametrize("levels", [0, -1, 1.0, True])
def test_layout_refuses_bad_levels(levels):
    with pytest.raises(ValueError, match="levels"):
        core.lane_layout(2, levels)


@pytest.mark.parametrize("world_size", [0, -1, 2.0, True])
def test_layout_refuses_bad_world_size(world_size):
    with pytest.raises(ValueError, match="world_size"):
        core.lane_radix(world_size)


@pytest.mark.parametrize("levels", [1, 3])
@pytest.mark.parametrize("world_size", range(2, 65))
def test_summed_words_unpack_to_exact_code_sums(world_size, levels):
    """N simulated ranks pack their codes; numpy sums the int32 words as the all-reduce would."""
    layout = core.lane_layout(world_size, levels)
    rng = np.random.default_rng(world_size)
    count = 3 * layout.lanes + 1  # a padded last word
    ternary = rng.integers(-levels, levels + 1, size=(world_size, count))
    ternary[:, 0] = levels  # the extreme lane sums 2 levels N and 0 must fit too
    ternary[:, 1] = -levels
    words = np.stack([core.pack_codes(t + layout.offset, layout) for t in ternary])
    assert words.dtype == np.int32 and words.shape == (world_size, layout.words(count))
    summed = words.sum(axis=0, dtype=np.int32)
    assert np.all(summed >= 0)  # the sign bit is never reached
    assert summed.max() < layout.radix**layout.lanes
    decoded = core.decode_sums(core.unpack_lanes(summed, layout, count), layout)
    np.testing.assert_array_equal(decoded, ternary.sum(axis=0))
    assert decoded[0] == levels * world_size and decoded[1] == -levels * world_size
    words_torch = torch.stack([torch_lanes.encode(torch.from_numpy(t).float(), layout) for t in ternary])
    np.testing.assert_array_equal(words_torch.numpy(), words)
    sums = torch_lanes.dequantize(words_torch.sum(dim=0, dtype=torch.int32), layout, count, torch.tensor(0.5), 2.0)
    np.testing.assert_allclose(sums.numpy(), ternary.sum(axis=0) * 0.25 / levels, rtol=1e-6)
    # TF, with the layout known at trace time and read when the graph runs (Horovod elastic)
    for layout_tf in (layout, tf_lanes.layout_for(tf.constant(world_size), levels)):
        words_tf = tf.stack([tf_lanes.encode(tf.constant(t, tf.int8), layout_tf) for t in ternary])
        np.testing.assert_array_equal(words_tf.numpy(), words)
        summed_tf = tf.reduce_sum(words_tf, axis=0)
        np.testing.assert_array_equal(tf_lanes.decode(summed_tf, layout_tf, count).numpy(), ternary.sum(axis=0))


@pytest.mark.parametrize("world_size", [1, 2, 7, 64, 256])
def test_torch_and_numpy_packers_write_identical_words(world_size):
    layout = core.lane_layout(world_size)
    rng = np.random.default_rng(world_size)
    lane_values = rng.integers(0, 2 * world_size + 1, size=1001)  # any digit up to 2N
    expected = core.pack_codes(lane_values, layout)
    words = torch_lanes.pack_codes(torch.from_numpy(lane_values).to(torch.int32), layout)
    assert words.dtype == torch.int32
    np.testing.assert_array_equal(words.numpy(), expected)
    np.testing.assert_array_equal(torch_lanes.unpack_lanes(words, layout, 1001).numpy(), lane_values)
    np.testing.assert_array_equal(core.unpack_lanes(expected, layout, 1001), lane_values)
    ternary = rng.integers(-1, 2, size=77)
    np.testing.assert_array_equal(torch_lanes.encode(torch.from_numpy(ternary), layout).numpy(),
                                  core.pack_codes(ternary + 1, layout))


@pytest.mark.parametrize("world_size", [1, 2, 7, 64, 256])
def test_tf_and_numpy_packers_write_identical_words(world_size):
    layout = core.lane_layout(world_size)
    rng = np.random.default_rng(world_size)
    lane_values = rng.integers(0, 2 * world_size + 1, size=1001)  # any digit up to 2N
    expected = core.pack_codes(lane_values, layout)
    for layout_tf in (layout, tf_lanes.layout_for(tf.constant(world_size))):
        words = tf_lanes.pack_codes(tf.constant(lane_values, tf.int32), layout_tf)
        assert words.dtype == tf.int32
        np.testing.assert_array_equal(words.numpy(), expected)
        np.testing.assert_array_equal(tf_lanes.unpack_lanes(words, layout_tf, 1001).numpy(), lane_values)
        ternary = rng.integers(-1, 2, size=77)
        np.testing.assert_array_equal(tf_lanes.encode(tf.constant(ternary), layout_tf).numpy(),
                                      core.pack_codes(ternary + 1, layout))
    assert tf_lanes.pack_codes(tf.zeros([0], tf.int32), layout).shape == (0,)


@pytest.mark.parametrize("levels", [1, 3])
def test_tf_layout_read_when_the_graph_runs_is_the_core_layout(levels):
    layout_of = tf.function(lambda n: tf_lanes.layout_for(n, levels)[1:3])  # (radix, lanes), traced once
    for world_size in [*range(1, 300), 511, 512, 644, 645, 4096, 2**20]:
        radix, lanes = layout_of(tf.constant(world_size))
        expected = core.lane_layout(world_size, levels)
        assert (int(radix), int(lanes)) == (expected.radix, expected.lanes), world_size
    assert layout_of.experimental_get_tracing_count() == 1
    assert tf_lanes.layout_for(8, levels) == core.lane_layout(8, levels)  # a Python int: the core layout itself


def test_layout_is_digit_zero_least_significant():
    layout = core.lane_layout(2)  # base 5
    assert core.pack_codes(np.array([1, 2, 0, 2]), layout)[0] == 1 + 2 * 5 + 2 * 5**3


@pytest.mark.parametrize("levels", [1, 3])
def test_torch_tf_and_numpy_rounding_agree(levels):
    rng = np.random.default_rng(0)
    values = rng.normal(size=500).astype(np.float32)
    scale = np.float32(np.abs(values).max() * 0.8)  # some values beyond it: clipped
    noise = rng.random(500).astype(np.float32)
    expected = core.stochastic_codes(values, scale, noise, levels)
    torch_noise = torch.from_numpy(noise.copy())
    got = torch_lanes.stochastic_codes(torch.from_numpy(values), torch.tensor(scale), torch_noise, levels)
    assert got.data_ptr() == torch_noise.data_ptr()  # written over the noise
    np.testing.assert_array_equal(got.numpy(), expected)
    got_tf = tf_lanes.stochastic_codes(tf.constant(values), tf.constant(scale), tf.constant(noise), levels)
    assert got_tf.dtype == tf.int8
    np.testing.assert_array_equal(got_tf.numpy(), expected)
    assert set(np.unique(expected)) == set(range(-levels, levels + 1))
    assert np.all(expected[np.abs(values) >= scale] == levels * np.sign(values[np.abs(values) >= scale]))
    assert np.all(core.stochastic_codes(np.zeros(5), 0.0, rng.random(5), levels) == 0)  # a zero scale
    zero = torch_lanes.stochastic_codes(torch.zeros(5), torch.tensor(0.0), torch.rand(5), levels)
    assert torch.all(zero == 0)


def test_ternary_rounding_is_tern_grads():
    """``levels=1``: ``sign(v)`` where ``noise * scale < |v|``, the rule every ternary record was taken with."""
    rng = np.random.default_rng(4)
    values, noise = rng.normal(size=1000).astype(np.float32), rng.random(1000).astype(np.float32)
    scale = np.float32(1.3)
    expected = (np.sign(values) * (noise * scale < np.abs(values))).astype(np.int8)
    np.testing.assert_array_equal(core.stochastic_codes(values, scale, noise), expected)


def test_local_scale_is_a_multiple_of_the_mean_magnitude_in_every_frontend():
    values = np.random.default_rng(2).standard_t(2, size=1000).astype(np.float32)
    expected = core.local_scale(values)
    assert expected == pytest.approx(core.STEP_OVER_MEAN * np.abs(values).mean(), rel=1e-6)
    assert torch_lanes.local_scale(torch.from_numpy(values)).item() == pytest.approx(expected, rel=1e-6)
    assert tf_lanes.local_scale(tf.constant(values)).numpy() == pytest.approx(expected, rel=1e-6)
    empty = np.zeros(0, np.float32)  # a tensor with no survivors proposes 0, not NaN
    assert core.local_scale(empty) == 0 and torch_lanes.local_scale(torch.from_numpy(empty)).item() == 0
    assert tf_lanes.local_scale(tf.constant(empty)).numpy() == 0
    for bad in (np.inf, -np.inf, np.nan):  # a value that is not finite leaves no finite proposal: the overflow test
        overflowed = np.array([1.0, bad, 2.0], np.float32)
        assert not np.isfinite(torch_lanes.local_scale(torch.from_numpy(overflowed)).item())
        assert not np.isfinite(tf_lanes.local_scale(tf.constant(overflowed)).numpy())


def test_at_the_local_scale_the_sent_values_do_not_inflate_a_second_moment_as_at_the_max():
    """Why the scale is a multiple of the mean |value|: a value under the scale arrives as ``scale`` or 0, so the
    mean square of what is sent (what Adam divides by) grows with the scale (core ``local_scale``)."""
    rng = np.random.default_rng(3)
    values = rng.laplace(size=20000).astype(np.float32)  # a gradient's tails: the max is ~10 mean |value|
    noise = rng.random(values.size).astype(np.float32)

    def second_moment(scale):
        return float(np.mean((core.stochastic_codes(values, scale, noise) * scale) ** 2))

    dense = float(np.mean(values ** 2))
    at_max, at_local = second_moment(np.abs(values).max()), second_moment(core.local_scale(values))
    assert at_max > 4 * dense  # 9.9 against 2.0
    assert at_local < dense  # 1.7: values beyond the scale wait in the error memory


@pytest.mark.parametrize("levels", [1, 3])
def test_stochastic_rounding_is_unbiased(levels):
    values = np.array([-1.0, -0.7, -0.25, 0.0, 0.1, 0.5, 0.9, 1.0], dtype=np.float32)
    scale, draws = 1.0, 20000
    rng = np.random.default_rng(1)
    codes = core.stochastic_codes(np.tile(values, (draws, 1)), scale, rng.random((draws, values.size)), levels)
    # a value between two codes, each draw one of them: standard error <= 0.5 step / sqrt(draws); 5 sigma
    np.testing.assert_allclose(codes.mean(axis=0) * scale / levels, values, atol=0.018 / levels)
    assert np.all(np.abs(codes * scale / levels - values) < scale / levels)  # always a neighbouring code


def test_error_feedback_carries_the_quantization_error():
    memory = ErrorFeedback()
    values = torch.tensor([0.3, -0.6, 0.05])
    dequantized = torch.tensor([1.0, -1.0, 0.0])
    own = values.clone()  # the caller's own buffer: add_ and store work in it
    assert memory.add_("w", own) is own  # nothing remembered yet
    memory.store("w", own, dequantized)
    assert "w" not in memory.residuals, "pending until the step is taken"
    memory.commit()
    torch.testing.assert_close(memory.residuals["w"], values - dequantized)
    torch.testing.assert_close(memory.add_("w", torch.ones(3)), 1 + values - dequantized)
    # over many steps of a constant gradient, the sum of what was sent tracks the sum of gradients
    memory, scale, sent = ErrorFeedback(), torch.tensor(1.0), torch.zeros(3)
    generator = torch.Generator().manual_seed(0)
    for _ in range(200):
        value = memory.add_("g", values.clone())
        dequantized = torch_lanes.stochastic_codes(value, scale, torch.rand(3, generator=generator)) * scale
        sent += dequantized
        memory.store("g", value, dequantized)
        memory.commit()
    torch.testing.assert_close(sent + memory.residuals["g"], 200 * values)
    assert memory.residuals["g"].abs().max() <= 2 * scale  # bounded: the error does not accumulate


@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_error_feedback_keeps_the_old_residual_where_an_overflow_left_no_finite_error(bad):
    """An overflowed step (skipped by a loss scaler) must not leave NaN in the memory for ever: where a value
    overflowed, or everywhere when the scale did (an overflow on another rank), the old residual stays."""
    memory = ErrorFeedback()
    previous = torch.tensor([0.1, -0.2, 0.0])
    memory.residuals["w"] = previous.clone()
    overflowed = memory.add_("w", torch.tensor([bad, 1.0, 0.5]))
    memory.store("fresh", overflowed.clone(), torch.tensor([1.0, 1.0, 0.0]))
    memory.store("w", overflowed, torch.tensor([1.0, 1.0, 0.0]))
    memory.commit()
    kept = memory.residuals["w"].clone()
    torch.testing.assert_close(kept, torch.tensor([0.1, -0.2, 0.5]))
    torch.testing.assert_close(memory.residuals["fresh"], torch.tensor([0.0, -0.2, 0.5]))
    finite = memory.add_("w", torch.tensor([0.5, -0.5, 0.0]))
    ternary = torch.tensor([1.0, -1.0, 0.0])
    memory.store("w", finite, ternary * torch.tensor(bad))  # a scale that is not finite: t * scale is not either
    memory.commit()
    assert torch.equal(memory.residuals["w"], kept)


def test_error_feedback_remap_keeps_surviving_coordinates():
    memory = ErrorFeedback()
    memory.residuals["w"] = torch.tensor([1.0, 2.0, 3.0])  # at flat coordinates 0, 4, 7
    memory.remap("w", torch.tensor([0, 4, 7]), torch.tensor([4, 7]), numel=9)  # coordinate 0 pruned
    torch.testing.assert_close(memory.residuals["w"], torch.tensor([2.0, 3.0]))
    memory.remap("w", torch.tensor([4, 7]), None, numel=9)  # no longer quantized
    assert "w" not in memory.residuals


def test_tf_error_feedback_carries_the_error_and_remaps_to_surviving_coordinates():
    memory = tf_quantized.ErrorFeedback()
    memory.track("w")
    assert memory.residuals["w"].shape.as_list() == [None]  # any packed length, no retrace
    memory.remap("w", np.zeros(0, np.int32), np.array([0, 4, 7]), numel=9)  # newly packed: residuals start at 0
    np.testing.assert_array_equal(memory.residuals["w"].numpy(), np.zeros(3))
    values = tf.constant([0.3, -0.6, 0.05])
    memory.store("w", values, tf.constant([1.0, -1.0, 0.0]))
    np.testing.assert_allclose(memory.add("w", tf.ones(3)).numpy(), 1 + np.array([0.3 - 1, -0.6 + 1, 0.05]), rtol=1e-6)
    memory.remap("w", np.array([0, 4, 7]), np.array([4, 7]), numel=9)  # coordinate 0 pruned
    np.testing.assert_allclose(memory.residuals["w"].numpy(), [0.4, 0.05], rtol=1e-6)
    memory.remap("w", np.array([4, 7]), np.zeros(0, np.int32), numel=9)  # no longer packed
    assert memory.residuals["w"].numpy().size == 0


def test_rounding_noise_is_a_function_of_rank_tensor_and_step_alone():
    from pactrain_hvd.core.quantized import noise_key, noise_seed, uniform_noise
    from pactrain_hvd.torch.lanes import Noise

    draws = {key: uniform_noise(*key, 1000) for key in ((0, "w", 3), (1, "w", 3), (0, "v", 3), (0, "w", 4))}
    assert all(not np.array_equal(a, b) for i, a in enumerate(draws.values()) for b in list(draws.values())[i + 1:])
    np.testing.assert_array_equal(uniform_noise(0, "w", 3, 1000), draws[(0, "w", 3)])  # drawn again: the same
    first = draws[(0, "w", 3)]
    assert 0 <= first.min() and first.max() < 1 and abs(first.mean() - 0.5) < 0.05
    seeds = {noise_seed(rank, name, step) for rank in range(4) for name in ("w", "v") for step in range(100)}
    assert len(seeds) == 800 and max(seeds) < 2**32 and noise_key(0, "w") < 2**31
    torch_noise = Noise(rank=0)
    again = [torch_noise.uniform(name, 3, 1000, torch.device("cpu")) for name in ("w", "v", "w")]
    assert torch.equal(again[0], again[2]) and not torch.equal(again[0], again[1])  # whatever the order
    seed = tf.constant([noise_key(0, "w"), 3], tf.int64)
    tf_draw = tf.random.stateless_uniform([1000], seed).numpy()
    np.testing.assert_array_equal(tf_draw, tf.random.stateless_uniform([1000], seed).numpy())


def test_compressor_ternary_round_trip_as_if_summed_over_two_ranks():
    layout = core.lane_layout(2)
    mask = torch.zeros(4, 6, dtype=torch.bool)
    mask[:, ::2] = True
    compressor = PacTrainCompressor(mask, lanes=layout)
    grad = torch.randn(4, 6)
    with pytest.raises(RuntimeError, match="compress_codes"):
        compressor.compress(grad)
    ternary = torch.tensor([1, 0, -1, 1, 1, 0, -1, -1, 0, 0, 1, -1], dtype=torch.int8)
    scale = torch.tensor(0.5)
    words, ctx = compressor.compress_codes(grad, ternary, scale, divisor=2.0)
    assert words.dtype == torch.int32 and words.numel() == 1  # 12 values, 13 digits per word
    restored = compressor.decompress(words * 2, ctx)  # both ranks sent the same codes
    torch.testing.assert_close(restored[mask], ternary.float() * 0.5)
    assert torch.all(restored[~mask] == 0)
    with pytest.raises(ValueError, match="packed=True"):
        PacTrainCompressor(mask, packed=False, lanes=layout)


def test_bits_per_value_counts_packed_tensors_only():
    stats = StepStats(tensors={
        "w": TensorStats(numel=1000, kept=100, packed=True, sent_bytes=10 * 4 + 4, dense_bytes=4000),
        "b": TensorStats(numel=10, kept=10, packed=False, sent_bytes=40, dense_bytes=40),
    })
    report = stats.as_dict()
    assert report["bits_per_value"] == pytest.approx(8 * 44 / 100)
    assert report["tensors"]["b"]["bits_per_value"] == 32
    assert StepStats().bits_per_value == 0
