"""Bad input to the TensorFlow frontend in one process: a clear error, before any communication, nothing changed.

Mirrors test_torch_bad_input.py where the case applies; more argument checks are in test_tf_state.py.
"""

import io
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import horovod.tensorflow as hvd  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

import pactrain_hvd.tensorflow as pt  # noqa: E402
import pactrain_hvd.tensorflow.keras as ptk  # noqa: E402
from pactrain_hvd.core import WorldSizeChangedWarning  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def horovod():
    hvd.init()


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(sparsity=float("nan")), ValueError, r"sparsity must be in \[0, 1\), got nan"),
    (dict(sparsity="0.9"), TypeError, "sparsity must be a number"),
    (dict(begin_step=10, end_step=5), ValueError, r"end_step \(5\) must be >= begin_step \(10\)"),
    (dict(frequency=-1), ValueError, "frequency must be > 0, got -1"),
    (dict(ranking="row"), ValueError, "ranking must be one of 'layer', 'erk', 'global', got 'row'"),
    (dict(verify_every=-1), ValueError, "verify_every must be >= 0"),
    (dict(verify_every=2.5), TypeError, "verify_every must be an int, got 2.5"),
    (dict(pack_min_numel=-1), ValueError, "pack_min_numel must be >= 0"),
    (dict(pack_max_density=1.5), ValueError, r"pack_max_density must be in \(0, 1\], got 1.5"),
    (dict(op=hvd.Product), ValueError, "op=hvd.Product is not supported with packing"),
    (dict(prunable=123), TypeError, r"prunable must be a predicate \(name, tensor\) -> bool or a list of glob patterns"),
    (dict(gradient_predivide_factor=0), ValueError, "gradient_predivide_factor must be a finite number > 0"),
    (dict(compression="fp16"), TypeError, "compression must be a Horovod Compressor such as hvd.Compression.fp16"),
    (dict(packed_values=["fp16"]), ValueError, r"packed_values must be one of .*got \['fp16'\]"),
])
def test_state_and_keras_optimizer_reject_bad_arguments(kwargs, error, message):
    with pytest.raises(error, match=message):
        pt.PacTrainState(**kwargs)
    if "op" not in kwargs:  # the Keras optimizer has Horovod's own op check
        with pytest.raises(error, match=message):
            ptk.DistributedOptimizer(keras.optimizers.SGD(), **kwargs)


def test_a_prunable_pattern_that_matches_no_variable_is_named():
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, name="hidden")])
    state = pt.PacTrainState(sparsity=0.5, prunable=["encoder/*"])
    with pytest.raises(ValueError, match=r"prunable pattern 'encoder/\*' matches no parameter name"):
        state.bind(model.trainable_variables)


def bound_state():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(80, name="hidden"), keras.layers.Dense(3, name="out")])
    state = pt.PacTrainState(sparsity=0.5)
    state.bind(model.trainable_variables)
    kernel = state.bound.names[0]
    mask = np.zeros((6, 80), bool)
    mask[:, :40] = True
    state.set_masks({kernel: mask})
    return model, state, kernel


@pytest.mark.parametrize("act, error, message", [
    (lambda s, k: s.set_masks({k: np.ones((3, 3), bool)}), ValueError, r"has shape \(3, 3\), parameter has shape \(6, 80\)"),
    (lambda s, k: s.set_masks({k: np.zeros((6, 80), bool)}), ValueError, "is all zeros"),
    (lambda s, k: s.set_masks({k: np.ones((6, 80), np.float32)}), TypeError, "must have dtype bool, got float32"),
    (lambda s, k: s.set_masks({"encoder/kernel": np.ones((6, 80), bool)}), ValueError, "not prunable here: encoder/kernel"),
    (lambda s, k: s.set_masks([np.ones((6, 80), bool)]), TypeError, "masks must be a dict of variable name"),
    (lambda s, k: s.deserialize(b"not npz"), pt.CheckpointError, "not a PacTrain state"),
], ids=["mask-shape", "mask-all-zeros", "mask-dtype", "mask-unknown-name", "masks-not-dict", "ckpt-garbage"])
def test_bad_masks_change_nothing(act, error, message):
    model, state, kernel = bound_state()
    weights, masks, step = [v.numpy() for v in model.weights], state.masks(), state.step_count
    with pytest.raises(error, match=message):
        act(state, kernel)
    assert all(np.array_equal(a, b.numpy()) for a, b in zip(weights, model.weights))
    assert masks.keys() == state.masks().keys() and all(np.array_equal(masks[k], state.masks()[k]) for k in masks)
    assert state.step_count == step


def test_checkpoint_from_another_world_size_warns_and_loads():
    _, state, kernel = bound_state()
    blob = state.serialize()
    with np.load(io.BytesIO(blob)) as saved:
        entries = dict(saved)
    assert int(entries["world_size"]) == hvd.size() == 1
    entries["world_size"] = np.int64(8)
    del entries["pactrain_digest"]  # as a state written before digests: rewritten content would not match its own
    buffer = io.BytesIO()
    np.savez(buffer, **entries)
    _, fresh, fresh_kernel = bound_state()  # another model: Keras numbers its layers, masks restore by position
    fresh.set_masks({})
    with pytest.warns(WorldSizeChangedWarning, match="saved with world size 8, loading it with 1"):
        fresh.deserialize(buffer.getvalue())
    assert list(fresh.masks()) == [fresh_kernel]
    assert np.array_equal(fresh.masks()[fresh_kernel], state.masks()[kernel])


def test_sparse_gradient_of_a_prunable_variable_is_refused_before_anything_changes():
    """TF knows the gradient type before communicating (torch only mid-backward: there it is densified)."""
    embedding = keras.layers.Embedding(50, 4)
    embedding.build((None,))
    before = embedding.embeddings.numpy()
    state = pt.PacTrainState(sparsity=0.5, begin_step=0, end_step=0)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(embedding(tf.constant([1, 2])))
    with pytest.raises(ValueError, match=r"variable '.*embeddings' has a sparse gradient \(tf.IndexedSlices\): pass "
                                         "sparse_as_dense=True"):
        pt.DistributedGradientTape(tape, state=state).gradient(loss, embedding.trainable_variables)
    assert state.masks() == {} and state.step_count == 0
    assert np.array_equal(embedding.embeddings.numpy(), before)
