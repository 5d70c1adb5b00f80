"""Sparse from the first step: step 0's reduction already carries only survivors, from masks every rank
proved equal at step 0 (Mask Tracker) and ranked on the weights the root broadcast."""

import horovod.tensorflow as hvd
import numpy as np
import pytest
from conftest import (
    assert_same_on_all_ranks,
    batch,
    compiled,
    counting_verifications,
    fit,
    keras,
    make_model,
    named,
    tape_step,
)
from rescale_expectations import assert_rescaled_once

import pactrain_hvd.tensorflow as pt
import pactrain_hvd.tensorflow.keras as ptk
from pactrain_hvd.core import magnitude_masks, num_to_keep


def assert_packed(state, masks, kept=None, value_bytes=4):
    stats = state.stats()["tensors"]
    for name, mask in masks.items():
        assert stats[name]["packed"], f"{name} travelled dense at step {state.stats()['step']}"
        assert stats[name]["kept"] == (kept[name] if kept else int(mask.sum())), name
        assert stats[name]["sent_bytes"] == value_bytes * stats[name]["kept"], name


@pytest.mark.parametrize("schedule", [{"schedule": pt.ConstantSparsity(0.9)},
                                      {"sparsity": 0.9, "begin_step": 0, "end_step": 0}], ids=["object", "steps"])
def test_step_0_reduces_the_packed_bytes_of_masks_ranked_on_the_broadcast_weights(schedule):
    model = make_model(seed=hvd.rank())  # each rank initialises its own weights ...
    hvd.broadcast_variables(list(named(model.variables).values()), root_rank=0)  # ... and takes the root's first
    variables = named(model.trainable_variables)
    prunable = {name for name, v in variables.items() if v.shape.rank >= 2}
    broadcast = {name: variables[name].numpy().copy() for name in prunable}
    opt = keras.optimizers.SGD(0.05, momentum=0.9)
    state = pt.PacTrainState(ranking="layer", pack_min_numel=0, optimizer=opt, **schedule)
    verified = counting_verifications(state)
    step = tape_step(model, opt, state)
    step(*batch(0))
    assert state.stats()["step"] == 0
    assert verified == [0]
    masks = state.masks()
    assert set(masks) == prunable
    expected = magnitude_masks(broadcast, 0.9, {}, "layer")
    for name in prunable:
        assert np.array_equal(masks[name], expected[name]), name
    kept = {name: num_to_keep(mask.size, 0.9) for name, mask in masks.items()}
    assert_packed(state, masks, kept)
    stats = state.stats()
    assert stats["sent_bytes"] == sum(4 * k for k in kept.values()) + sum(
        4 * v.shape.num_elements() for name, v in variables.items() if name not in prunable)
    for number in range(1, 4):
        step(*batch(number))
        assert state.stats()["step"] == number
        assert_packed(state, masks, kept)
    for name, mask in masks.items():
        assert np.all(variables[name].numpy()[~mask] == 0), name
    assert verified == [0]
    assert_same_on_all_ranks(variables)
    assert_same_on_all_ranks({n: m.astype(np.uint8) for n, m in state.masks().items()}, "mask")


@pytest.mark.parametrize("traced", [True, False], ids=["tf.function", "eager"])
@pytest.mark.parametrize("rescale", [False, True])
def test_rescale_survivors_gives_step_0s_survivors_their_tensors_norm_once(rescale, traced):
    model = make_model(seed=hvd.rank())
    hvd.broadcast_variables(list(named(model.variables).values()), root_rank=0)
    variables = named(model.trainable_variables)
    broadcast = {name: v.numpy().copy() for name, v in variables.items()}
    opt = keras.optimizers.SGD(0.0)
    state = pt.PacTrainState(schedule=pt.ConstantSparsity(0.9), ranking="layer", pack_min_numel=0, optimizer=opt,
                             rescale_survivors=rescale)
    step = tape_step(model, opt, state) if traced else tape_step(model, opt, state).python_function
    step(*batch(0))
    after_step_0 = {name: v.numpy().copy() for name, v in variables.items()}
    assert_rescaled_once(broadcast, after_step_0, state.masks(), rescale)
    for number in range(1, 3):  # once: later steps (learning rate 0) leave the weights as they are
        step(*batch(number))
    for name, weight in variables.items():
        assert np.array_equal(weight.numpy(), after_step_0[name]), name
    assert_same_on_all_ranks(variables)


def test_keras_fit_is_packed_from_the_first_step_with_ternary_values():
    model = make_model()
    opt = ptk.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9), schedule=pt.ConstantSparsity(0.95),
                                   ranking="layer", pack_min_numel=0, packed_values="ternary")
    compiled(model, opt)
    fit(model, 1)
    state = opt.pactrain_state
    stats = state.stats()
    assert stats["step"] == 0 and stats["values"] == "ternary"
    for name, mask in state.masks().items():
        tensor = stats["tensors"][name]
        assert tensor["packed"] and tensor["kept"] == num_to_keep(mask.size, 0.95), name
        assert tensor["sent_bytes"] < tensor["kept"], name  # below one byte per survivor: lane-packed codes
    fit(model, 2, start=1)
    assert all(state.stats()["tensors"][name]["packed"] for name in state.masks())
    assert_same_on_all_ranks(named(model.trainable_variables))


def test_short_ramp_is_packed_at_every_step():
    model = make_model()
    opt = keras.optimizers.SGD(0.05)
    state = pt.PacTrainState(schedule=pt.short_ramp(0.9, steps=4, initial_sparsity=0.5), ranking="layer",
                             pack_min_numel=0, optimizer=opt)
    step = tape_step(model, opt, state)
    sent = []
    for number in range(6):
        step(*batch(number))
        target = state.config.schedule.target(number)  # TF ranks a step's masks before its reduction
        masks = state.masks()
        assert_packed(state, masks, {name: num_to_keep(mask.size, target) for name, mask in masks.items()})
        sent.append(state.stats()["sent_bytes"])
    assert sent == sorted(sent, reverse=True) and sent[-1] < sent[0]
