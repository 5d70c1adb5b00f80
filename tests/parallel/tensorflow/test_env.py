"""The environment itself: Horovod's TensorFlow all-reduce over 2 ranks gives the right sums."""

import horovod.tensorflow as hvd
import numpy as np
import pytest
import tensorflow as tf


@pytest.fixture(scope="module", autouse=True)
def horovod():
    hvd.init()
    assert hvd.size() >= 2, "run these tests under horovodrun -np 2"


def test_tensorflow_allreduce_sums_over_ranks():
    tensor = tf.range(6, dtype=tf.float32) * float(hvd.rank() + 1)
    total = hvd.allreduce(tensor, op=hvd.Sum, name="env.sum")
    expected = np.arange(6, dtype=np.float32) * sum(r + 1 for r in range(hvd.size()))
    np.testing.assert_array_equal(total.numpy(), expected)
