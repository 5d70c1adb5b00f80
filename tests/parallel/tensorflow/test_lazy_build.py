"""Models Keras builds at their first call (a ``Sequential`` without ``Input``), ranks starting apart: the
broadcast runs inside the first reduction, before step 0's masks are ranked, so every rank ranks the same
weights; with the Keras callback, the tape, an optimizer that is not ours, and a restored state."""

import tempfile

import horovod.tensorflow as hvd
import numpy as np
import pytest
import tensorflow as tf
from conftest import assert_same_on_all_ranks, batch, compiled, fit, keras, loss_fn, named

import pactrain_hvd.tensorflow as pt
import pactrain_hvd.tensorflow.keras as ptk
from pactrain_hvd.core import magnitude_masks, num_to_keep
from pactrain_hvd.tensorflow.pruning import backing_variable, optimizer_variables

SPARSITY = 0.9


def layers():
    return [keras.layers.Conv2D(16, 3, padding="same", activation="relu"), keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(32, 3, padding="same", activation="relu"), keras.layers.Flatten(),
            keras.layers.Dense(10)]


def lazy_model(seed):
    """No ``Input``: no weights until the first batch; ``seed`` differs per rank, as unseeded ranks do."""
    keras.utils.set_random_seed(seed)
    return keras.Sequential(layers())


def built_model(seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((8, 8, 3)), *layers()])


def initial_weights():
    """Rank 0's initial weights: the same layers made with its seed, built at once."""
    return [variable.numpy() for variable in built_model(seed=0).trainable_variables]


def sparse_from_step_0(learning_rate=0.05):
    return ptk.DistributedOptimizer(keras.optimizers.SGD(learning_rate, momentum=0.9),
                                    schedule=pt.ConstantSparsity(SPARSITY), ranking="layer")


def assert_pruned_and_equal(model, masks, backing=False):
    """``backing``: masks named as the ``tf.Variable``s behind Keras 3's variables (what a tape differentiates)."""
    trainable = [backing_variable(v) for v in model.trainable_variables] if backing else model.trainable_variables
    variables = named(trainable)
    assert masks, "nothing was pruned"
    for name, mask in masks.items():
        assert int(mask.sum()) == num_to_keep(mask.size, SPARSITY), name
        assert not variables[name].numpy()[~mask].any(), f"pruned weights of {name} are not 0"
    assert_same_on_all_ranks(variables)
    assert_same_on_all_ranks({name: mask.astype(np.int8) for name, mask in masks.items()}, "mask")


def test_fit_broadcasts_inside_the_first_step_before_ranking_masks():
    """Learning rate 0: after one step every rank holds rank 0's initial weights, pruned by masks ranked on them."""
    model = compiled(lazy_model(seed=hvd.rank()), sparse_from_step_0(learning_rate=0.0))
    assert not model.built
    fit(model, 1, callbacks=[ptk.callbacks.BroadcastGlobalVariablesCallback(0)])
    opt = model.optimizer
    assert opt.step_count == 1
    lazy = named(model.trainable_variables)
    initial = dict(zip(lazy, initial_weights()))
    pruned = {name: initial[name] for name in opt.masks()}
    expected = magnitude_masks(pruned, SPARSITY, {}, "layer")
    for name, mask in opt.masks().items():
        np.testing.assert_array_equal(mask, expected[name])
    for name, variable in lazy.items():
        kept = opt.masks().get(name, np.ones(variable.shape, bool))
        np.testing.assert_array_equal(variable.numpy(), np.where(kept, initial[name], 0))
    assert_pruned_and_equal(model, opt.masks())


def test_fit_trains_a_lazy_model_with_ranks_identical():
    model = compiled(lazy_model(seed=hvd.rank()), sparse_from_step_0())
    fit(model, 4, callbacks=[ptk.callbacks.BroadcastGlobalVariablesCallback(0)])
    opt = model.optimizer
    assert opt.step_count == 4 and opt.stats()["tensors"]
    assert_pruned_and_equal(model, opt.masks())
    assert_same_on_all_ranks({f"slot{i}": v for i, v in enumerate(optimizer_variables(opt))}, "optimizer variable")


def test_tape_broadcasts_at_its_first_reduction():
    model = lazy_model(seed=hvd.rank())
    opt = keras.optimizers.SGD(0.05, momentum=0.9)
    state = pt.PacTrainState(schedule=pt.ConstantSparsity(SPARSITY), ranking="layer", optimizer=opt)
    pt.broadcast_variables_at_next_reduction(state, 0, lambda: model.variables)

    @tf.function(autograph=False)
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        sources = [backing_variable(v) for v in model.trainable_variables]
        grads = pt.DistributedGradientTape(tape, state=state).gradient(loss, sources)
        opt.apply_gradients(zip(grads, model.trainable_variables))

    for number in range(3):
        step(*batch(number))
    assert state.step_count == 3
    assert_pruned_and_equal(model, state.masks(), backing=True)


def test_callback_with_another_optimizer_broadcasts_after_the_first_batch_as_horovod():
    """Learning rate 0: what the ranks hold after the first batch is the broadcast, rank 0's initial weights."""
    model = compiled(lazy_model(seed=hvd.rank()), keras.optimizers.SGD(0.0, momentum=0.9))
    fit(model, 2, callbacks=[ptk.callbacks.BroadcastGlobalVariablesCallback(0)])
    for variable, initial in zip(model.trainable_variables, initial_weights()):
        np.testing.assert_array_equal(np.asarray(variable), initial)


def test_state_restored_on_rank_0_reaches_a_lazy_model_on_every_rank():
    trained = compiled(built_model(seed=0), sparse_from_step_0())
    fit(trained, 2)
    saved_masks = trained.optimizer.masks()
    directory = tempfile.mkdtemp()
    prefix = tf.train.Checkpoint(optimizer=trained.optimizer).save(f"{directory}/ckpt") if hvd.rank() == 0 else None
    prefix = hvd.broadcast_object(prefix, 0, name="lazy.prefix")

    model = compiled(lazy_model(seed=hvd.rank() + 1), sparse_from_step_0())
    if hvd.rank() == 0:  # rank 0 alone: the callback gives every rank its state
        tf.train.Checkpoint(optimizer=model.optimizer).restore(prefix).expect_partial()
    fit(model, 1, start=2, callbacks=[ptk.callbacks.BroadcastGlobalVariablesCallback(0)])
    opt = model.optimizer
    assert opt.step_count == 3
    renamed = dict(zip(named(trained.trainable_variables), named(model.trainable_variables)))
    assert len(opt.masks()) == len(saved_masks) > 0
    for name, saved in saved_masks.items():
        np.testing.assert_array_equal(opt.masks()[renamed[name]], saved)
    assert_pruned_and_equal(model, opt.masks())


def test_broadcast_request_refuses_bad_arguments_by_name():
    state = pt.PacTrainState(sparsity=0.5)
    with pytest.raises(TypeError, match="needs a PacTrainState"):
        pt.broadcast_variables_at_next_reduction(keras.optimizers.SGD(0.1), 0)
    with pytest.raises(ValueError, match="root_rank"):
        pt.broadcast_variables_at_next_reduction(state, -1)
    with pytest.raises(TypeError, match="variables must be a callable"):
        pt.broadcast_variables_at_next_reduction(state, 0, variables=[])
