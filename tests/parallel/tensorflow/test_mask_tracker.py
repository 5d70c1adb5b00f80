"""The Mask Tracker verifies only at steps every rank knows of: the first step of a state, each schedule mask
update, every verify_every steps, and the step after a call every rank makes (broadcast_masks). A local call
(set_masks, a restore) schedules nothing, so a rank never allgathers while the others all-reduce; every
disagreement is the same MaskMismatchError on every rank, naming its cause."""

import tempfile

import horovod.tensorflow as hvd
import numpy as np
import pytest
import tensorflow as tf
from conftest import assert_same_on_all_ranks, batch, counting_verifications, keras, loss_fn, make_model, named

import pactrain_hvd.tensorflow as pt
import pactrain_hvd.tensorflow.keras as ptk


def eager_step(model, state, number):
    x, y = batch(number)
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
    return pt.DistributedGradientTape(tape, state=state).gradient(loss, model.trainable_variables)


def test_verification_steps_are_the_ones_every_rank_knows_of():
    model = make_model()
    state = pt.PacTrainState(sparsity=0.5, ranking="layer", begin_step=2, end_step=2, verify_every=5)
    verified = counting_verifications(state)
    for number in range(4):  # first step (0), mask update (2)
        eager_step(model, state, number)
    state.set_masks(state.masks())  # local: schedules nothing
    state.deserialize(state.serialize())  # local: schedules nothing
    for number in range(4, 7):  # periodic (5)
        eager_step(model, state, number)
    pt.broadcast_masks(state)  # every rank: verified at the next step (7)
    for number in range(7, 9):
        eager_step(model, state, number)
    assert verified == [0, 2, 5, 7]


def test_masks_set_on_one_rank_raise_at_the_next_verification_on_every_rank_without_hanging():
    model = make_model()
    state = pt.PacTrainState(sparsity=0.5, ranking="layer", begin_step=0, end_step=0, pack_min_numel=0, verify_every=4)
    eager_step(model, state, 0)
    masks = state.masks()
    drifted = next(name for name, mask in masks.items() if mask.ndim == 2)
    if hvd.rank() == 1:  # same count, other positions: the packed all-reduces still fit
        state.set_masks({**masks, drifted: masks[drifted][::-1].copy()})
    for number in range(1, 4):
        eager_step(model, state, number)
    with pytest.raises(pt.MaskMismatchError, match=rf"pruning masks differ across ranks: '{drifted}': ranks \[1\]"):
        eager_step(model, state, 4)


def test_ranks_at_different_schedule_steps_raise_at_the_first_step_on_every_rank():
    model = make_model()
    state = pt.PacTrainState(sparsity=0.5, ranking="layer", begin_step=10, end_step=10)  # nothing due at step 0 but the first check
    if hvd.rank() == 1:  # a checkpoint loaded on one rank, without broadcast_masks
        saved = pt.PacTrainState(sparsity=0.5, ranking="layer", begin_step=10, end_step=10)
        saved.maintenance.step.assign(3)
        state.deserialize(saved.serialize())
    with pytest.raises(pt.MaskMismatchError, match=r"schedule position differs \(rank 0: 0, rank 1: 3\)"):
        eager_step(model, state, 0)


def test_ranks_that_start_from_different_weights_are_told_to_broadcast_the_weights():
    model = make_model(seed=hvd.rank())  # hvd.broadcast_variables forgotten
    state = pt.PacTrainState(sparsity=0.5, ranking="layer", begin_step=0, end_step=0)
    with pytest.raises(pt.MaskMismatchError, match=r"(?i)weights differ.*ranked on them.*hvd\.broadcast_variables"):
        eager_step(model, state, 0)


def test_a_checkpoint_restored_on_one_rank_alone_trains_on_as_before():
    """Rank 0 restores what it saved (nothing changes): no verification is scheduled there alone."""
    def train(model, opt, steps, start=0):
        @tf.function(autograph=False)
        def step(x, y):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))

        for number in range(start, start + steps):
            step(*batch(number))

    def optimizer():
        return ptk.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9), sparsity=0.5, ranking="layer", begin_step=0,
                                        end_step=6, frequency=2)

    model, opt = make_model(), optimizer()
    reference, reference_opt = make_model(), optimizer()
    train(model, opt, 3)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=opt)
    prefix = checkpoint.save(f"{tempfile.mkdtemp()}/ckpt")
    if hvd.rank() == 0:
        checkpoint.restore(prefix)
    train(model, opt, 5, start=3)
    train(reference, reference_opt, 8)
    assert opt.step_count == 8
    for a, b in zip(model.trainable_variables, reference.trainable_variables):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    renamed = dict(zip(named(model.trainable_variables), named(reference.trainable_variables)))
    assert {renamed[name] for name in opt.masks()} == set(reference_opt.masks())
    assert all(np.array_equal(mask, reference_opt.masks()[renamed[name]]) for name, mask in opt.masks().items())
    assert_same_on_all_ranks(named(model.trainable_variables))
