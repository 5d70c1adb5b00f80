"""TF PacTrainCompressor alone: pack then unpack is the identity on survivors and zero elsewhere."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import horovod.tensorflow as hvd  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from pactrain_hvd.tensorflow import PacTrainCompressor  # noqa: E402
from pactrain_hvd.tensorflow.compression import DENSE, PACKED, UNMASKED  # noqa: E402

shapes = st.lists(st.integers(0, 6), min_size=0, max_size=3).map(tuple)


@settings(max_examples=40, deadline=None)
@given(shape=shapes, density=st.floats(0, 1), dtype=st.sampled_from([np.float16, np.float32, np.float64]),
       packed=st.booleans(), seed=st.integers(0, 2**16))
def test_pack_unpack_identity_on_survivors(shape, density, dtype, packed, seed):
    rng = np.random.default_rng(seed)
    values = rng.normal(size=shape).astype(dtype)
    mask = rng.random(shape) < density
    compressor = PacTrainCompressor(mask, packed=packed)
    wire, ctx = compressor.compress(tf.constant(values))
    assert wire.shape.rank == 1 and wire.dtype == tf.as_dtype(dtype)
    if packed:
        assert int(tf.size(wire)) == int(mask.sum())
        np.testing.assert_array_equal(wire.numpy(), values.reshape(-1)[mask.reshape(-1)])
    else:
        np.testing.assert_array_equal(wire.numpy(), np.where(mask, values, 0).reshape(-1))
    restored = compressor.decompress(wire * 2, ctx).numpy()  # as if a Sum over two equal ranks
    assert restored.shape == values.shape and restored.dtype == dtype
    np.testing.assert_array_equal(restored, np.where(mask, values * 2, 0))
    assert not np.any(np.signbit(restored[~mask]))  # +0.0, not -0.0


def test_unmasked_travels_whole_and_a_mask_can_come_later():
    compressor = PacTrainCompressor(shape=(3, 4))
    tensor = tf.reshape(tf.range(12, dtype=tf.float32), (3, 4))
    wire, ctx = compressor.compress(tensor)
    assert int(compressor.plan) == UNMASKED and int(tf.size(wire)) == 12
    np.testing.assert_array_equal(compressor.decompress(wire, ctx).numpy(), tensor.numpy())
    mask = np.arange(12).reshape(3, 4) % 3 == 0
    compressor.set_mask(mask, packed=False)
    assert int(compressor.plan) == DENSE and compressor.kept == 4
    compressor.set_mask(mask, packed=True)
    assert int(compressor.plan) == PACKED
    compressor.set_mask(None, packed=True)
    assert int(compressor.plan) == UNMASKED and compressor.kept == 12


def test_traced_function_follows_mask_changes_without_retracing():
    compressor = PacTrainCompressor(shape=(100,))

    @tf.function
    def roundtrip(tensor):
        wire, ctx = compressor.compress(tensor)
        return tf.size(wire), compressor.decompress(wire, ctx)

    tensor = tf.range(1, 101, dtype=tf.float32)
    rng = np.random.default_rng(0)
    for density, packed in [(1.0, False), (0.5, True), (0.1, True), (0.1, False), (0.02, True)]:
        mask = rng.random(100) < density
        compressor.set_mask(mask, packed)
        size, restored = roundtrip(tensor)
        assert int(size) == (int(mask.sum()) if packed else 100)
        np.testing.assert_array_equal(restored.numpy(), np.where(mask, tensor.numpy(), 0))
    assert roundtrip.experimental_get_tracing_count() == 1


def test_survivors_and_unpack_are_the_packing_alone():
    mask = np.arange(24).reshape(4, 6) % 5 == 0
    compressor = PacTrainCompressor(mask)
    tensor = tf.reshape(tf.range(1, 25, dtype=tf.float32), (4, 6))
    survivors = compressor.survivors(tensor)
    np.testing.assert_array_equal(survivors.numpy(), tensor.numpy()[mask])
    np.testing.assert_array_equal(compressor.unpack(survivors * 2).numpy(), np.where(mask, tensor.numpy() * 2, 0))
    compressor.set_mask(mask, packed=False)
    assert int(tf.size(compressor.survivors(tensor))) == 0  # only a packing plan has survivors to send


def test_fp16_values_stacked_on_packing_through_horovod_allreduce():
    hvd.init()
    mask = np.zeros((64, 64), bool)
    mask[::4, ::2] = True
    compressor = PacTrainCompressor(mask, value_compression=hvd.Compression.fp16)
    grad = tf.random.stateless_normal((64, 64), seed=(1, 2))
    wire, _ = compressor.compress(grad)
    assert wire.dtype == tf.float16 and int(tf.size(wire)) == int(mask.sum())
    reduced = hvd.allreduce(grad, compression=compressor, op=hvd.Sum, name="unit.fp16")  # one rank here
    assert reduced.dtype == tf.float32
    np.testing.assert_allclose(reduced.numpy(), np.where(mask, grad.numpy(), 0), rtol=1e-3, atol=1e-3)
    assert np.all(reduced.numpy()[~mask] == 0)


def test_arguments_are_checked():
    with pytest.raises(TypeError, match="bool"):
        PacTrainCompressor(np.ones((2, 2), np.float32))
    with pytest.raises(ValueError, match="needs a mask or the shape"):
        PacTrainCompressor()
    with pytest.raises(ValueError, match="does not fit shape"):
        PacTrainCompressor(np.ones((2, 2), bool), shape=(4,))
    compressor = PacTrainCompressor(np.ones((2, 2), bool))
    with pytest.raises(ValueError, match="does not fit mask"):
        compressor.compress(tf.zeros((3, 2)))
    with pytest.raises(TypeError, match="IndexedSlices"):
        compressor.compress(tf.IndexedSlices(tf.zeros((1, 2)), tf.constant([0]), tf.constant([2, 2])))
