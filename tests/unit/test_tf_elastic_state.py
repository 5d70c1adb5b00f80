"""ptk.elastic.KerasState in one process: a rollback restores weights, optimizer slots, masks and step."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import horovod.tensorflow.keras as hvd  # noqa: E402
import keras  # noqa: E402 - Keras 3, whatever TF_USE_LEGACY_KERAS says
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402

import pactrain_hvd.tensorflow.keras as ptk  # noqa: E402
from pactrain_hvd.tensorflow.pruning import optimizer_variables  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def horovod():
    hvd.init()


def trainer(api):
    api.utils.set_random_seed(0)
    model = api.Sequential([api.Input((6,)), api.layers.Dense(80), api.layers.Dense(3)])
    opt = ptk.DistributedOptimizer(api.optimizers.SGD(0.1, momentum=0.9), sparsity=0.8, ranking="layer", begin_step=1, end_step=5,
                                   frequency=2, pack_min_numel=0)
    rng = np.random.default_rng(0)

    @tf.function
    def step():
        x, y = tf.constant(rng.normal(size=(8, 6)), tf.float32), tf.constant(rng.normal(size=(8, 3)), tf.float32)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x, training=True) - y) ** 2)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))

    return model, opt, step


def snapshot(model, opt):
    return ([np.array(v) for v in model.variables], [np.array(v) for v in optimizer_variables(opt)],
            opt.step_count, opt.masks())


@pytest.mark.parametrize("api", [keras, tf_keras], ids=["keras3", "tf-keras2"])
def test_restore_rolls_back_weights_slots_masks_and_step(api):
    model, opt, step = trainer(api)
    state = ptk.elastic.KerasState(model, opt, epoch=0)  # builds the optimizer: slots exist before any step
    assert len(optimizer_variables(opt)) > 2
    for _ in range(2):
        step()
    state.save()
    saved = snapshot(model, opt)
    assert saved[2] == 2 and saved[3]  # pruned once, at step 1
    for _ in range(3):
        step()  # the mask change at step 3
    assert opt.step_count == 5 and any(not np.array_equal(m, saved[3][n]) for n, m in opt.masks().items())
    state.restore()
    weights, slots, step_count, masks = snapshot(model, opt)
    assert step_count == saved[2]
    assert masks.keys() == saved[3].keys() and all(np.array_equal(m, saved[3][n]) for n, m in masks.items())
    for now, then in zip(weights + slots, saved[0] + saved[1]):
        np.testing.assert_array_equal(now, then)
    step()  # training goes on from the restored state: the next mask change is the schedule's
    assert opt.step_count == 3


def test_horovods_keras_state_fails_under_keras3():
    """Why ptk.elastic.KerasState exists beyond masks: Horovod 0.28.1 calls ``optimizer.variables()``."""
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)])
    with pytest.raises(TypeError, match="not callable"):
        hvd.elastic.KerasState(model, keras.optimizers.SGD(0.1))


@pytest.mark.parametrize("api", [keras, tf_keras], ids=["keras3", "tf-keras2"])
def test_an_unbuilt_model_needs_our_optimizer_and_a_rollback_before_the_first_batch_keeps_the_weights(api):
    """A ``Sequential`` without ``Input``: Horovod's state refuses it; ours takes it with ``ptk.DistributedOptimizer``
    (the first reduction broadcasts); a commit made before the weights existed restores nothing of them."""
    model = api.Sequential([api.layers.Dense(80), api.layers.Dense(3)])
    with pytest.raises(ValueError, match="built first"):
        ptk.elastic.KerasState(model, api.optimizers.SGD(0.1))
    opt = ptk.DistributedOptimizer(api.optimizers.SGD(0.1), sparsity=0.8, begin_step=0, end_step=0, pack_min_numel=0)
    state = ptk.elastic.KerasState(model, opt, epoch=0)
    state.sync()  # before the first batch: nothing to broadcast yet
    assert not model.built
    x, y = tf.ones((4, 6)), tf.zeros((4, 3))

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x, training=True) - y) ** 2)
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))

    step()
    weights = [np.array(v) for v in model.variables]
    assert opt.step_count == 1 and opt.masks()
    state.restore()  # the last commit predates the weights
    for now, then in zip(model.variables, weights):
        np.testing.assert_array_equal(np.array(now), then)
    state.commit()
    step()
    state.restore()
    for now, then in zip(model.variables, weights):
        np.testing.assert_array_equal(np.array(now), then)
    assert opt.step_count == 1
