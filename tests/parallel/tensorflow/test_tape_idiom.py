"""Horovod's tape idiom: the tape is wrapped inside the traced step, without state=, and traced again for a
new batch shape. One PacTrainState per tuple of variables carries the schedule across traces; Horovod's
PartialDistributedGradientTape and get_local_and_global_gradients."""

import horovod.tensorflow as hvd
import numpy as np
import pytest
import tensorflow as tf
from conftest import (
    LEGACY_KERAS,
    assert_same_on_all_ranks,
    batch,
    horovod_idiom_step,
    keras,
    loss_fn,
    make_model,
    named,
)

import pactrain_hvd.tensorflow as pt
from pactrain_hvd.core import num_to_keep
from pactrain_hvd.tensorflow.pruning import backing_variable

BATCH_SIZES = [8, 4, 8, 4, 8, 8]  # a new batch shape traces the step again


def test_tape_wrapped_in_the_traced_step_keeps_its_schedule_across_retraces():
    model = make_model()
    opt = keras.optimizers.SGD(0.05, momentum=0.9)
    step, tapes = horovod_idiom_step(model, opt, lambda tape: pt.DistributedGradientTape(
        tape, sparsity=0.5, ranking="layer", begin_step=0, end_step=4, frequency=2, optimizer=opt))
    variables = named([backing_variable(v) for v in model.trainable_variables])  # what the tape differentiates
    for number, size in enumerate(BATCH_SIZES):
        step(*batch(number, size))
        if number == 0:
            first_traces = step.experimental_get_tracing_count()
        if number == 2:  # pruned at step 2, after the retrace (step 1)
            state = tapes[-1].pactrain_state
            masks, target = state.masks(), state.config.schedule.target(2)
            assert masks and all(int(m.sum()) == num_to_keep(m.size, target) < m.size for m in masks.values())
    assert step.experimental_get_tracing_count() == first_traces + 1  # the batch of 4
    assert all(tape.pactrain_state is state for tape in tapes)
    assert state.step_count == len(BATCH_SIZES)  # not restarted by the retrace
    schedule = state.config.schedule
    for name, mask in state.masks().items():
        assert int(mask.sum()) == num_to_keep(mask.size, schedule.target(4)), name
        assert not mask[~masks[name]].any(), f"{name}: the retrace revived pruned coordinates"
        assert not variables[name].numpy()[~mask].any(), f"pruned weights of {name} are not 0"
    assert_same_on_all_ranks(variables)


def test_sparsity_zero_tape_in_the_traced_step_is_horovods():
    ours_model, theirs_model = make_model(), make_model()
    ours_opt, theirs_opt = keras.optimizers.SGD(0.05, momentum=0.9), keras.optimizers.SGD(0.05, momentum=0.9)
    ours, _ = horovod_idiom_step(ours_model, ours_opt, lambda tape: pt.DistributedGradientTape(tape, sparsity=0.0))
    theirs, _ = horovod_idiom_step(theirs_model, theirs_opt, hvd.DistributedGradientTape)
    for number, size in enumerate(BATCH_SIZES):
        ours(*batch(number, size))
        theirs(*batch(number, size))
        if number == 0:
            first_traces = ours.experimental_get_tracing_count()
    assert ours.experimental_get_tracing_count() == first_traces + 1
    for a, b in zip(ours_model.trainable_variables, theirs_model.trainable_variables):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_eager_tapes_wrapped_every_step_share_one_schedule():
    model = make_model()
    tapes = []
    for number in range(3):
        x, y = batch(number)
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        tapes.append(pt.DistributedGradientTape(tape, sparsity=0.5, ranking="layer", begin_step=0, end_step=2, frequency=1))
        tapes[-1].gradient(loss, model.trainable_variables)
    state = tapes[0].pactrain_state
    assert all(tape.pactrain_state is state for tape in tapes) and state.step_count == 3
    assert all(int(m.sum()) == num_to_keep(m.size, 0.5) for m in state.masks().values())


def test_other_arguments_for_the_same_variables_are_refused_naming_state():
    model = make_model()
    x, y = batch(0)
    with tf.GradientTape(persistent=True) as tape:
        loss = loss_fn(y, model(x, training=True))
    pt.DistributedGradientTape(tape, sparsity=0.5, ranking="layer").gradient(loss, model.trainable_variables)
    with pytest.raises(ValueError, match="already have a PacTrainState made with other sparsity.*state="):
        pt.DistributedGradientTape(tape, sparsity=0.8, ranking="layer").gradient(loss, model.trainable_variables)
    with pytest.raises(RuntimeError, match="first gradient"):
        _ = pt.DistributedGradientTape(tape).pactrain_state


@pytest.mark.parametrize("sparsity", [0.0, 0.5])
def test_partial_tape_splits_local_and_global_gradients_as_horovod(sparsity):
    """Ranks start apart (as Horovod's test): local gradients stay this rank's (over size), global ones are averaged."""
    model = make_model(seed=hvd.rank())
    head = model.layers[-1]
    sources = [backing_variable(v) for v in model.trainable_variables]
    x, y = batch(0)
    with tf.GradientTape(persistent=True) as tape:
        loss = loss_fn(y, model(x, training=True))
    plain = tape.gradient(loss, sources)
    distributed = pt.PartialDistributedGradientTape(tape, local_layers=head, sparsity=sparsity, ranking="layer", begin_step=1)
    local, shared = distributed.get_local_and_global_gradients(loss, sources)
    head_refs = {backing_variable(v).ref() for v in head.trainable_variables}
    assert [s.ref() for s, _ in local] == [s.ref() for s in sources if s.ref() in head_refs]
    assert [s.ref() for s, _ in shared] == [s.ref() for s in sources if s.ref() not in head_refs]
    by_source = {s.ref(): g for s, g in zip(sources, plain)}
    for source, grad in local:
        np.testing.assert_allclose(grad.numpy(), by_source[source.ref()].numpy() / hvd.size(), rtol=1e-6)
    for i, (source, grad) in enumerate(shared):
        expected = hvd.allreduce(by_source[source.ref()], name=f"partial.{sparsity}.{i}")
        np.testing.assert_array_equal(grad.numpy(), expected.numpy())
    if LEGACY_KERAS:  # Horovod's own tape (under Keras 3 it fails on Keras variables' missing .ref)
        theirs = hvd.PartialDistributedGradientTape(tape, local_layers=[head])
        theirs_local, theirs_shared = theirs.get_local_and_global_gradients(loss, sources)
        for (_, ours_grad), (_, their_grad) in zip(local + shared, theirs_local + theirs_shared):
            np.testing.assert_allclose(ours_grad.numpy(), their_grad.numpy(), rtol=1e-6)
    with pytest.raises(ValueError, match="local_layers must be a Keras layer"):
        pt.PartialDistributedGradientTape(tape, local_layers=[object()])
