"""ptk.DistributedOptimizer under model.fit and in custom loops, with Keras 3 or tf-keras 2 (see conftest)."""

import horovod.tensorflow as hvd
import horovod.tensorflow.keras as hvd_keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import (
    LEGACY_KERAS,
    assert_same_on_all_ranks,
    batch,
    batches,
    compiled,
    fit,
    gathered_equal,
    keras,
    loss_fn,
    make_model,
    named,
)

import pactrain_hvd.tensorflow.keras as ptk
from pactrain_hvd.core import num_to_keep
from pactrain_hvd.tensorflow.pruning import optimizer_slots


def kernel_names(model):
    return {name for name, v in named(model.trainable_variables).items() if v.shape.rank >= 2}


def train_loop(model, opt):
    """The custom loop of a Keras user: a plain tape, then ``opt.apply_gradients`` (which reduces)."""

    @tf.function(autograph=False)
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))

    return step


def test_fit_averages_prunes_and_packs_with_ranks_starting_apart():
    model = make_model(seed=hvd.rank())  # different weights per rank: the callback must align them first
    opt = ptk.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9), sparsity=0.9, ranking="layer",
                                   begin_step=0, end_step=6, frequency=2)
    compiled(model, opt)
    fit(model, 1, callbacks=[ptk.callbacks.BroadcastGlobalVariablesCallback(0)])
    traces = opt.pactrain_state.traces
    fit(model, 7, start=1)

    variables = named(model.trainable_variables)
    masks = opt.masks()
    assert opt.step_count == 8
    assert set(masks) == kernel_names(model)
    stats = opt.stats()["tensors"]
    for name, mask in masks.items():
        assert int(mask.sum()) == num_to_keep(mask.size, 0.9), name
        assert np.all(variables[name].numpy()[~mask] == 0), f"pruned weights of {name} are not 0"
        for slot in optimizer_slots(opt, variables[name]):
            assert np.all(slot.numpy()[~mask] == 0), f"momentum of {name} is not cleared"
        packed = mask.size >= 4096
        assert stats[name]["packed"] == packed, name
        assert stats[name]["sent_bytes"] == 4 * (int(mask.sum()) if packed else mask.size), name
    for name, variable in variables.items():
        if name not in masks:
            assert stats[name]["sent_bytes"] == stats[name]["dense_bytes"] == 4 * variable.shape.num_elements()
    assert opt.pactrain_state.traces == traces  # three more mask changes, no new trace
    assert_same_on_all_ranks(variables)
    assert_same_on_all_ranks({s.name: s for v in variables.values() for s in optimizer_slots(opt, v)}, "slot")


@pytest.mark.parametrize("compression, tolerance", [(hvd.Compression.none, 1e-6), (hvd.Compression.fp16, 2e-3)],
                         ids=["fp32", "fp16"])
def test_custom_loop_applies_the_dense_reference_average(compression, tolerance):
    model = make_model()
    opt = ptk.DistributedOptimizer(keras.optimizers.SGD(1.0), compression=compression, sparsity=0.8, ranking="layer",
                                   begin_step=0, end_step=0, pack_min_numel=1000)
    step = train_loop(model, opt)
    step(*batch(0))  # prunes once, from identical weights
    masks, variables = opt.masks(), named(model.trainable_variables)
    for number in range(1, 3):
        x, y = batch(number)
        before = {name: v.numpy() for name, v in variables.items()}
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        local = dict(zip(variables, tape.gradient(loss, model.trainable_variables)))
        reference = {name: hvd.allreduce(grad * masks[name] if name in masks else grad, name=f"ref.{number}.{name}")
                     for name, grad in local.items()}
        step(x, y)
        for name, variable in variables.items():
            applied = before[name] - variable.numpy()  # SGD with learning rate 1
            np.testing.assert_allclose(applied, reference[name].numpy(), rtol=tolerance, atol=tolerance * 1e-1,
                                       err_msg=name)
    value_bytes = 2 if compression is hvd.Compression.fp16 else 4
    stats = opt.stats()["tensors"]
    for name, mask in masks.items():
        assert stats[name]["sent_bytes"] == value_bytes * (int(mask.sum()) if mask.size >= 1000 else mask.size)
    assert_same_on_all_ranks(variables)


@pytest.mark.parametrize("make_optimizer", [
    lambda: keras.optimizers.SGD(0.05, momentum=0.9, weight_decay=1e-2),
    lambda: keras.optimizers.Adam(1e-2),
    lambda: keras.optimizers.AdamW(1e-2, weight_decay=0.1),
    pytest.param(lambda: keras.optimizers.legacy.Adam(1e-2), id="legacy-adam",
                 marks=pytest.mark.skipif(not LEGACY_KERAS, reason="tf-keras 2 only")),
], ids=["sgd-momentum-wd", "adam", "adamw", "legacy-adam"])
def test_pruned_weights_and_slots_stay_zero_with_any_optimizer(make_optimizer):
    model = make_model()
    opt = ptk.DistributedOptimizer(make_optimizer(), sparsity=0.8, ranking="layer", begin_step=2, end_step=4, frequency=1)
    step = train_loop(model, opt)
    for number in range(7):
        step(*batch(number))
    variables = named(model.trainable_variables)
    masks = opt.masks()
    assert set(masks) == kernel_names(model)
    slots = {}
    for name, mask in masks.items():
        assert np.all(variables[name].numpy()[~mask] == 0), f"pruned weights of {name} revived"
        for slot in optimizer_slots(opt, variables[name]):
            assert np.all(slot.numpy()[~mask] == 0), f"optimizer slot {slot.name} of {name} is not cleared"
            slots[slot.name] = slot
    assert slots, "no optimizer slots were found"
    assert_same_on_all_ranks(variables)
    assert_same_on_all_ranks(slots, "slot")


def test_sparsity_zero_is_horovod():
    """Bitwise the same weights as Horovod: under tf-keras 2 as its Keras optimizer in model.fit;
    under Keras 3, where that optimizer does not average, as a loop averaging with hvd.allreduce."""
    ours_model, theirs_model = make_model(), make_model()
    ours = ptk.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9), sparsity=0.0)
    if LEGACY_KERAS:
        fit(compiled(ours_model, ours), 3)
        fit(compiled(theirs_model, hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9))), 3)
    else:
        plain = keras.optimizers.SGD(0.05, momentum=0.9)

        @tf.function(autograph=False)
        def theirs_step(x, y):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, theirs_model(x, training=True))
            grads = tape.gradient(loss, theirs_model.trainable_variables)
            plain.apply_gradients(zip([hvd.allreduce(g) for g in grads], theirs_model.trainable_variables))

        ours_step = train_loop(ours_model, ours)
        for number in range(3):
            ours_step(*batch(number))
            theirs_step(*batch(number))
    for a, b in zip(ours_model.trainable_variables, theirs_model.trainable_variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert ours.masks() == {}
    assert ours.stats()["sent_bytes"] == ours.stats()["dense_bytes"]


def test_mask_drift_raises_on_every_rank_before_communicating():
    model = make_model()
    # set_masks is local and schedules no verification: verify at every step, which every rank knows of
    opt = ptk.DistributedOptimizer(keras.optimizers.SGD(0.05), sparsity=0.5, ranking="layer", begin_step=0, end_step=0, verify_every=1)
    compiled(model, opt)
    fit(model, 1)
    masks = opt.masks()
    dense_name = next(name for name, mask in masks.items() if mask.ndim == 2)
    if hvd.rank() == 1:
        masks[dense_name] = masks[dense_name][::-1].copy()  # same count, other positions
    opt.set_masks(masks)
    weights = {name: v.numpy() for name, v in named(model.trainable_variables).items()}
    # Raised inside the traced step: TF reports it as UnknownError carrying the MaskMismatchError.
    expected = rf"MaskMismatchError: pruning masks differ across ranks: '{dense_name}': ranks \[1\] differ"
    with pytest.raises(tf.errors.UnknownError, match=expected):
        fit(model, 1, start=1)
    for name, variable in named(model.trainable_variables).items():
        np.testing.assert_array_equal(variable.numpy(), weights[name], err_msg=name)


def test_partial_distributed_optimizer_keeps_local_layers_local():
    """Horovod's PartialDistributedOptimizer: the head stays each rank's own, the rest is averaged and pruned."""
    model = make_model(seed=0)
    head = model.layers[-1]
    opt = ptk.PartialDistributedOptimizer(keras.optimizers.SGD(0.05), local_layers=[head], sparsity=0.5,
                                          ranking="layer", begin_step=0, end_step=0)
    compiled(model, opt)
    fit(model, 1, callbacks=[ptk.callbacks.BroadcastGlobalVariablesCallback(0)])
    x, y = batches(3, start=10 + 100 * hvd.rank())  # each rank its own data: the local head drifts apart
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    variables = named(model.trainable_variables)
    local = set(named(head.trainable_weights))
    assert local and set(gathered_equal({name: variables[name] for name in sorted(local)}).values()) == {False}
    assert_same_on_all_ranks({name: v for name, v in variables.items() if name not in local})
    assert opt.masks(), "the shared layers are pruned"
