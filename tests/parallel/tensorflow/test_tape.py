"""pt.DistributedGradientTape against a dense all-reduce reference and Horovod's own tape."""

import horovod.tensorflow as hvd
import numpy as np
import pytest
import tensorflow as tf
from conftest import LEGACY_KERAS, assert_same_on_all_ranks, batch, keras, loss_fn, make_model, named, tape_step

import pactrain_hvd.tensorflow as pt
from pactrain_hvd.core import num_to_keep
from pactrain_hvd.tensorflow.pruning import optimizer_slots


def dense_reference(model, masks, x, y, name):
    """What a dense all-reduce of the masked local gradients gives."""
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    return {key: hvd.allreduce(grad * masks[key] if key in masks else grad, name=f"{name}.{key}")
            for key, grad in zip(named(model.trainable_variables), grads)}


@pytest.mark.parametrize("compression, value_bytes", [(hvd.Compression.none, 4), (hvd.Compression.fp16, 2)],
                         ids=["fp32", "fp16"])
def test_tape_gradients_are_the_dense_reference_on_surviving_coordinates(compression, value_bytes):
    model = make_model()
    opt = keras.optimizers.SGD(0.05, momentum=0.9)
    state = pt.PacTrainState(compression=compression, sparsity=0.9, ranking="layer", begin_step=0, end_step=0, pack_min_numel=1000,
                             optimizer=opt)
    step = tape_step(model, opt, state)
    step(*batch(0))  # prunes once, from identical weights
    traces = step.experimental_get_tracing_count()
    masks, variables = state.masks(), named(model.trainable_variables)
    assert set(masks) == {name for name, v in variables.items() if v.shape.rank >= 2}
    for number in range(1, 4):
        x, y = batch(number)
        reference = dense_reference(model, masks, x, y, f"tape.{value_bytes}.{number}")
        grads = dict(zip(variables, step(x, y)))
        for name, grad in grads.items():
            if value_bytes == 4:
                np.testing.assert_array_equal(grad.numpy(), reference[name].numpy(), err_msg=name)
            else:
                np.testing.assert_allclose(grad.numpy(), reference[name].numpy(), rtol=2e-3, atol=1e-4, err_msg=name)
            if name in masks:
                assert np.all(grad.numpy()[~masks[name]] == 0), f"pruned gradient of {name} is not 0"
        stats = state.stats()["tensors"]
        for name, mask in masks.items():
            packed = mask.size >= 1000
            assert stats[name]["packed"] == packed
            assert stats[name]["sent_bytes"] == value_bytes * (int(mask.sum()) if packed else mask.size), name
    for name, mask in masks.items():  # momentum cleared at the mask change, zero gradients since: still 0
        assert np.all(variables[name].numpy()[~mask] == 0), f"pruned weights of {name} are not 0"
    assert step.experimental_get_tracing_count() == traces
    assert_same_on_all_ranks(variables)


OPTIMIZERS = {
    "sgd": lambda: keras.optimizers.SGD(0.05),
    "momentum": lambda: keras.optimizers.SGD(0.05, momentum=0.9, weight_decay=1e-3),
    "adam": lambda: keras.optimizers.Adam(0.01),
    "adamw": lambda: keras.optimizers.AdamW(0.01, weight_decay=0.01),
}


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_gradual_schedule_follows_cubic_targets_without_retracing(optimizer):
    """Each mask change clears momentum / Adam moments before the optimizer's update of the
    same step, so pruned weights stay exactly 0 with no enforce() call and nothing goes NaN."""
    model = make_model()
    opt = OPTIMIZERS[optimizer]()
    state = pt.PacTrainState(sparsity=0.9, ranking="layer", begin_step=0, end_step=6, frequency=2, optimizer=opt)
    step = tape_step(model, opt, state)
    schedule, history = state.config.schedule, []
    for number in range(9):
        step(*batch(number))
        if number == 0:
            traces = step.experimental_get_tracing_count()
        history.append(state.masks())
        for name, variable in named(model.trainable_variables).items():
            assert np.all(np.isfinite(variable.numpy())), (name, number)
            if name in history[-1]:
                assert np.all(variable.numpy()[~history[-1][name]] == 0), f"pruned weights of {name}, step {number}"
        if schedule.is_update_step(number):
            for name, mask in history[-1].items():
                assert int(mask.sum()) == num_to_keep(mask.size, schedule.target(number)), (name, number)
    for before, after in zip(history, history[1:]):
        for name, mask in after.items():
            if name in before:
                assert not (mask & ~before[name]).any(), f"{name} regrew a pruned coordinate"
    assert all(np.array_equal(history[6][name], history[8][name]) for name in history[6])
    assert state.stats()["sparsity"] == pytest.approx(0.9, abs=0.01)
    assert state.step_count == 9
    assert step.experimental_get_tracing_count() == traces  # three more mask changes, no new trace
    variables = named(model.trainable_variables)
    for name, mask in history[-1].items():
        slots = optimizer_slots(opt, variables[name])
        if optimizer != "sgd":  # plain SGD: no slot under Keras 3, an unused one under tf-keras 2
            assert len(slots) == {"momentum": 1}.get(optimizer, 2), (name, slots)
        for slot in slots:
            assert np.all(slot.numpy()[~mask] == 0), f"{slot.name} of {name} is not 0 at pruned coordinates"
        assert_same_on_all_ranks({f"{name}/{i}": slot for i, slot in enumerate(slots)}, "slot")
    assert_same_on_all_ranks(named(model.trainable_variables))


def test_eager_tape_drift_raises_mask_mismatch_error_on_every_rank():
    model = make_model()
    # set_masks is local and schedules no verification: verify at every step, which every rank knows of
    state = pt.PacTrainState(sparsity=0.5, ranking="layer", begin_step=0, end_step=0, verify_every=1)

    def gradient(number):
        x, y = batch(number)
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        return pt.DistributedGradientTape(tape, state=state).gradient(loss, model.trainable_variables)

    gradient(0)
    masks = state.masks()
    dense_name = next(name for name, mask in masks.items() if mask.ndim == 2)
    if hvd.rank() == 1:
        masks[dense_name] = masks[dense_name][::-1].copy()
    state.set_masks(masks)
    with pytest.raises(pt.MaskMismatchError, match=rf"'{dense_name}': ranks \[1\] differ"):
        gradient(1)


def test_sparsity_zero_is_horovods_tape():
    model = make_model()
    x, y = batch(0)
    with tf.GradientTape(persistent=True) as tape:
        loss = loss_fn(y, model(x, training=True))
    ours = pt.DistributedGradientTape(tape, sparsity=0.0).gradient(loss, model.trainable_variables)
    if LEGACY_KERAS:
        theirs = hvd.DistributedGradientTape(tape).gradient(loss, model.trainable_variables)
    else:
        with pytest.raises(AttributeError, match="ref"):  # Horovod 0.28.1 under Keras 3
            hvd.DistributedGradientTape(tape).gradient(loss, model.trainable_variables)
        local = tape.gradient(loss, model.trainable_variables)
        theirs = [hvd.allreduce(g, name=f"theirs.{i}") for i, g in enumerate(local)]
    for a, b in zip(ours, theirs):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_local_sources_are_scaled_not_reduced_and_sources_may_be_nested():
    model = make_model()
    x, y = batch(0)
    with tf.GradientTape(persistent=True) as tape:
        loss = loss_fn(y, model(x, training=True))
    head = model.layers[-1]
    sources = {"body": model.trainable_variables[:-2], "head": list(head.trainable_variables)}
    distributed = pt.DistributedGradientTape(tape, sparsity=0.0)
    for variable in head.trainable_variables:
        distributed.register_local_source(variable)
    grads = distributed.gradient(loss, sources)
    local = tape.gradient(loss, sources)
    assert set(grads) == {"body", "head"}
    for ours, plain in zip(grads["head"], local["head"]):
        np.testing.assert_allclose(ours.numpy(), plain.numpy() / hvd.size(), rtol=1e-6)
    for i, (ours, plain) in enumerate(zip(grads["body"], local["body"])):
        np.testing.assert_array_equal(ours.numpy(), hvd.allreduce(plain, name=f"nested.{i}").numpy())


def test_groups_sum_and_predivide_match_their_references():
    model = make_model()
    x, y = batch(0)
    with tf.GradientTape(persistent=True) as tape:
        loss = loss_fn(y, model(x, training=True))
    variables = model.trainable_variables

    def reduced(**kwargs):
        state = pt.PacTrainState(sparsity=0.5, ranking="layer", begin_step=0, end_step=0, pack_min_numel=0, verify_every=0, **kwargs)
        return [g.numpy() for g in pt.DistributedGradientTape(tape, state=state).gradient(loss, variables)]

    plain = reduced()
    for a, b in zip(plain, reduced(groups=2)):
        np.testing.assert_array_equal(a, b)  # the same sums, grouped differently
    for a, b in zip(plain, reduced(groups=[[variables[0], variables[2]]])):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(plain, reduced(gradient_predivide_factor=2.0)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-8)
    for a, b in zip(plain, reduced(op=hvd.Sum)):
        np.testing.assert_allclose(a * hvd.size(), b, rtol=1e-6, atol=1e-8)
