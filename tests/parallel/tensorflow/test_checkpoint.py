"""Masks and schedule position survive tf.train.Checkpoint; broadcast_masks realigns drifted ranks."""

import tempfile

import horovod.tensorflow as hvd
import numpy as np
import pytest
import tensorflow as tf
from conftest import LEGACY_KERAS, assert_same_on_all_ranks, batch, keras, loss_fn, make_model, named

import pactrain_hvd.tensorflow as pt
import pactrain_hvd.tensorflow.keras as ptk


def optimizer(**overrides):
    kwargs = dict(sparsity=0.9, ranking="layer", begin_step=0, end_step=6, frequency=2) | overrides
    return ptk.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9), **kwargs)


def trainer(model, opt):
    """``train(steps, start)``: a custom loop whose step is traced once."""

    @tf.function(autograph=False)
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))

    def train(steps, start=0):
        for number in range(start, start + steps):
            step(*batch(number))

    return train


def test_checkpoint_round_trip_resumes_bitwise():
    model, opt = make_model(), optimizer()
    train = trainer(model, opt)
    train(3)
    prefix = tf.train.Checkpoint(model=model, optimizer=opt).save(f"{tempfile.mkdtemp()}/ckpt")
    saved_masks = opt.masks()
    train(5, start=3)  # crosses the mask updates at steps 4 and 6

    resumed_model, resumed = make_model(seed=7), optimizer()
    resumed.build(resumed_model.trainable_variables)
    tf.train.Checkpoint(model=resumed_model, optimizer=resumed).restore(prefix).assert_existing_objects_matched()
    assert resumed.step_count == 3
    assert all(np.array_equal(resumed.masks()[name], mask) for name, mask in saved_masks.items())  # saved names
    trainer(resumed_model, resumed)(5, start=3)
    renamed = dict(zip(named(model.trainable_variables), named(resumed_model.trainable_variables)))
    for a, b in zip(model.trainable_variables, resumed_model.trainable_variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert len(resumed.masks()) == len(opt.masks())
    for name, mask in opt.masks().items():
        np.testing.assert_array_equal(resumed.masks()[renamed[name]], mask)


@pytest.mark.skipif(LEGACY_KERAS, reason="Keras 3 files; tf-keras 2 checkpoints through tf.train.Checkpoint")
def test_keras_file_round_trip_restores_masks_and_step():
    model, opt = make_model(), optimizer()
    model.compile(optimizer=opt, loss="mse")
    trainer(model, opt)(3)
    path = f"{tempfile.mkdtemp()}/model.keras"
    model.save(path)

    plain = keras.models.load_model(path)  # without PacTrain: a plain optimizer, the extra entry unread
    assert type(plain.optimizer).__name__ == "SGD" and not hasattr(plain.optimizer, "pactrain_state")

    resumed_model, resumed = make_model(seed=5), optimizer()
    resumed_model.compile(optimizer=resumed, loss="mse")
    resumed.build(resumed_model.trainable_variables)
    resumed_model.load_weights(path)
    assert resumed.step_count == 3
    renamed = dict(zip(named(model.trainable_variables), named(resumed_model.trainable_variables)))
    resumed.pactrain_state.bind(resumed_model.trainable_variables)
    assert len(resumed.masks()) == len(opt.masks())
    for name, mask in opt.masks().items():
        np.testing.assert_array_equal(resumed.masks()[renamed[name]], mask)
    for a, b in zip(model.variables + opt.variables, resumed_model.variables + resumed.variables):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_tape_state_checkpoint_restores_before_and_after_binding():
    model = make_model()
    state = pt.PacTrainState(sparsity=0.8, ranking="layer", begin_step=0, end_step=0)
    with tf.GradientTape() as tape:
        loss = loss_fn(batch(0)[1], model(batch(0)[0], training=True))
    pt.DistributedGradientTape(tape, state=state).gradient(loss, model.trainable_variables)
    prefix = tf.train.Checkpoint(pactrain=state).save(f"{tempfile.mkdtemp()}/ckpt")

    fresh = pt.PacTrainState(sparsity=0.8, ranking="layer", begin_step=0, end_step=0)
    tf.train.Checkpoint(pactrain=fresh).restore(prefix)  # not bound yet: applied when it binds
    assert fresh.step_count == 1
    assert all(np.array_equal(fresh.masks()[name], mask) for name, mask in state.masks().items())
    rebuilt = make_model(seed=3)  # Keras names its layers anew: masks follow variable order, not names
    fresh.bind(rebuilt.trainable_variables)
    restored = named(rebuilt.trainable_variables)
    assert len(fresh.masks()) == len(state.masks())
    for old_name, new_name in zip(named(model.trainable_variables), restored):
        if old_name in state.masks():
            mask = state.masks()[old_name]
            np.testing.assert_array_equal(fresh.masks()[new_name], mask)
            assert np.all(restored[new_name].numpy()[~mask] == 0), f"restored pruned weights of {new_name} are not 0"


def test_restore_into_other_shapes_raises_checkpoint_error():
    model = make_model()
    state = pt.PacTrainState(sparsity=0.5, ranking="layer", begin_step=0, end_step=0)
    state.bind(model.trainable_variables)
    state.set_masks({name: np.ones(v.shape, bool) for name, v in named(model.trainable_variables).items()
                     if v.shape.rank >= 2})
    blob = state.serialize()
    wider = pt.PacTrainState(sparsity=0.5, ranking="layer")
    wider_model = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Conv2D(4, 3)])
    wider.bind(wider_model.trainable_variables)
    with pytest.raises(pt.CheckpointError):
        wider.deserialize(blob)
    with pytest.raises(pt.CheckpointError, match="not a PacTrain state"):
        wider.deserialize(b"garbage")


def test_broadcast_masks_gives_every_rank_the_root_masks_and_step():
    model, opt = make_model(), optimizer(sparsity=0.5, ranking="layer", end_step=0)
    train = trainer(model, opt)
    train(1)
    masks = opt.masks()
    if hvd.rank() == 1:  # rank 1 drifts: same counts, other positions, and another step
        masks = {name: mask[::-1].copy() for name, mask in masks.items()}
        opt.set_masks(masks)
        opt.pactrain_state.maintenance.step.assign(5)
    pt.broadcast_masks(opt, root_rank=0)
    for variables in (model.variables, opt.variables):  # weights and momentum drifted with the masks
        hvd.broadcast_variables(list(named(variables).values()), root_rank=0)
    assert opt.step_count == 1
    assert_same_on_all_ranks({name: mask.astype(np.uint8) for name, mask in opt.masks().items()}, "mask")
    train(1, start=1)
    assert_same_on_all_ranks(named(model.trainable_variables))
