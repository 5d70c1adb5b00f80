"""backward_passes_per_step > 1 in ptk.DistributedOptimizer: Horovod's local gradient aggregation. Gradients are
summed on each rank, reduced and applied every backward_passes_per_step calls (divided by it with
average_aggregated_gradients); the other calls count an optimizer iteration. One reduction is one PacTrain step."""

import horovod.tensorflow as hvd
import horovod.tensorflow.keras as hvd_keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import LEGACY_KERAS, assert_same_on_all_ranks, batch, keras, loss_fn, make_model, named

import pactrain_hvd.tensorflow.keras as ptk
from pactrain_hvd.tensorflow.pruning import backing_variable

PASSES = 4


def rank_scaled_loss(x, y):
    """``(rank + 1) * (x - y[0])``: d/dx = rank + 1, d/dy = [-(rank + 1), 0] (as tf.IndexedSlices)."""
    return float(hvd.rank() + 1) * (x - tf.gather(y, [0]))


@pytest.mark.parametrize("average", [True, False], ids=["averaged", "summed"])
def test_gradients_are_summed_locally_and_reduced_every_backward_passes_per_step(average):
    x, y = tf.Variable([0.0]), tf.Variable([1.0, 2.0])
    opt = ptk.DistributedOptimizer(keras.optimizers.SGD(1.0), backward_passes_per_step=PASSES,
                                   average_aggregated_gradients=average, sparse_as_dense=True)

    @tf.function(autograph=False)
    def step():
        with tf.GradientTape() as tape:
            loss = rank_scaled_loss(x, y)
        opt.apply_gradients(zip(tape.gradient(loss, [x, y]), [x, y]))

    mean_rank_factor = (hvd.size() + 1) / 2  # d/dx averaged over ranks
    for number in range(10):
        step()
        applied = (number + 1) // PASSES * mean_rank_factor * (1 if average else PASSES)
        np.testing.assert_allclose(x.numpy(), [-applied], rtol=1e-6)
        np.testing.assert_allclose(y.numpy(), [1.0 + applied, 2.0], rtol=1e-6)
        assert int(opt.iterations.numpy()) == number + 1
        assert int(opt._agg_helper.counter.numpy()) == (number + 1) % PASSES
        assert opt.step_count == (number + 1) // PASSES


@pytest.mark.skipif(not LEGACY_KERAS, reason="Horovod's aggregation runs in its tf-keras 2 optimizer only")
@pytest.mark.parametrize("average", [True, False], ids=["averaged", "summed"])
def test_aggregation_applies_what_horovods_applies(average):
    """Horovod's own pattern (its legacy optimizer's ``_compute_gradients``, then ``apply_gradients``)."""
    def trained(wrap, compute):
        x, y = tf.Variable([0.0]), tf.Variable([1.0, 2.0])
        opt = wrap(keras.optimizers.legacy.SGD(0.5), backward_passes_per_step=PASSES,
                   average_aggregated_gradients=average, sparse_as_dense=True)

        @tf.function(autograph=False)
        def step():
            opt.apply_gradients(compute(opt, lambda: rank_scaled_loss(x, y), [x, y]))

        for _ in range(2 * PASSES + 1):
            step()
        return x.numpy(), y.numpy()

    ours = trained(ptk.DistributedOptimizer, lambda opt, loss, var_list: opt._compute_gradients(loss, var_list))
    theirs = trained(hvd_keras.DistributedOptimizer,
                     lambda opt, loss, var_list: opt._compute_gradients(loss, var_list=var_list))
    for a, b in zip(ours, theirs):
        np.testing.assert_array_equal(a, b)


def test_pruned_model_aggregates_as_one_step_over_the_summed_gradients():
    """Two passes then one reduction equal one step on the two passes' gradients summed (masks and schedule too)."""
    model, reference = make_model(), make_model()
    kwargs = dict(sparsity=0.5, ranking="layer", begin_step=0, end_step=2, frequency=1)
    opt = ptk.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9), backward_passes_per_step=2, **kwargs)
    reference_opt = ptk.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9), **kwargs)

    @tf.function(autograph=False)
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))

    @tf.function(autograph=False)
    def reference_step(first, second):
        summed = None
        for x, y in (first, second):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, reference(x, training=True))
            grads = tape.gradient(loss, reference.trainable_variables)
            summed = grads if summed is None else [a + b for a, b in zip(summed, grads)]
        reference_opt.apply_gradients(zip(summed, reference.trainable_variables))

    for number in range(0, 8, 2):
        step(*batch(number))
        step(*batch(number + 1))
        reference_step(batch(number), batch(number + 1))
    assert opt.step_count == reference_opt.step_count == 4
    assert int(opt.iterations.numpy()) == 8
    variables, reference_variables = named(model.trainable_variables), named(reference.trainable_variables)
    for (name, variable), reference_variable in zip(variables.items(), reference_variables.values()):
        np.testing.assert_allclose(variable.numpy(), reference_variable.numpy(), rtol=1e-5, atol=1e-7, err_msg=name)
    for (name, mask), reference_mask in zip(opt.masks().items(), reference_opt.masks().values()):
        np.testing.assert_array_equal(mask, reference_mask)
        assert not variables[name].numpy()[~mask].any(), f"pruned weights of {name} are not 0"
    assert_same_on_all_ranks(variables)


def test_an_infinite_gradient_does_not_leak_into_the_next_aggregation():
    """Horovod's test_grad_aggregation_with_inf_grad: the sums are zeroed after each reduction, not reduced by it."""
    x = tf.Variable([0.0])
    opt = ptk.DistributedOptimizer(keras.optimizers.SGD(1.0), backward_passes_per_step=2)
    reduced, reduce = [], opt.pactrain_state.reduce
    opt.pactrain_state.reduce = lambda grads, variables: reduced.append(reduce(grads, variables)) or reduced[-1]
    for scale in (float("inf"), 1.0):
        for _ in range(2):
            with tf.GradientTape() as tape:
                loss = scale * x
            opt.apply_gradients(zip(tape.gradient(loss, [x]), [x]))
    assert len(reduced) == 2
    np.testing.assert_array_equal(reduced[0][0].numpy(), [np.inf])
    np.testing.assert_array_equal(reduced[1][0].numpy(), [2.0])


def test_sparse_as_dense_aggregation_under_model_fit():
    """Horovod's test_sparse_as_dense_with_grad_aggregation, with a pruned embedding."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((10,), dtype="int32"), keras.layers.Embedding(1000, 8)])
    opt = ptk.DistributedOptimizer(keras.optimizers.RMSprop(1e-3), sparse_as_dense=True, backward_passes_per_step=2,
                                   sparsity=0.5, ranking="layer", begin_step=0, end_step=0)
    model.compile(optimizer=opt, loss="mse")
    rng = np.random.default_rng(hvd.rank())
    x, y = rng.integers(1000, size=(32, 10)), rng.normal(size=(32, 10, 8)).astype(np.float32)
    for _ in range(3):
        model.train_on_batch(x, y)
    assert int(opt._agg_helper.counter.numpy()) == 3 % 2 and opt.step_count == 1
    (name, mask), = opt.masks().items()
    assert mask.mean() == 0.5
    embeddings = backing_variable(model.layers[0].embeddings)
    assert not embeddings.numpy()[~mask].any()
    assert_same_on_all_ranks({name: embeddings})


def test_sparse_gradients_need_sparse_as_dense_to_be_aggregated():
    y = tf.Variable([1.0, 2.0])
    opt = ptk.DistributedOptimizer(keras.optimizers.SGD(1.0), backward_passes_per_step=2)
    with tf.GradientTape() as tape:
        loss = tf.gather(y, [0])
    with pytest.raises(ValueError, match="pass sparse_as_dense=True"):
        opt.apply_gradients(zip(tape.gradient(loss, [y]), [y]))
