"""Bring your own mask (TensorFlow): tfmot's prune_low_magnitude (tf-keras 2 only) and masks= dicts, 2 ranks."""

import horovod.tensorflow as hvd
import numpy as np
import pytest
import tensorflow as tf
from conftest import LEGACY_KERAS, assert_same_on_all_ranks, batches, compiled, fit, keras, make_model, named

import pactrain_hvd.tensorflow as pt
import pactrain_hvd.tensorflow.keras as ptk

STEPS = 4
# Not imported under Keras 3: importing tfmot sets TF_USE_LEGACY_KERAS=1 for the whole process.
needs_tf_keras = pytest.mark.skipif(not LEGACY_KERAS, reason="tfmot's prune_low_magnitude needs tf-keras 2 "
                                    "(TF_USE_LEGACY_KERAS=1); this run uses Keras 3")


def check_masks_kept_and_packed(model, opt, expected):
    masks = opt.masks()
    assert set(masks) == set(expected)
    variables = named(model.trainable_variables)
    stats = opt.stats()["tensors"]
    packed = [name for name in expected if stats[name]["packed"]]
    assert packed, "no tensor was packed"
    for name, mask in expected.items():
        np.testing.assert_array_equal(masks[name], mask, err_msg=f"opt.masks()[{name!r}] is not the given mask")
        assert not variables[name].numpy()[~mask].any(), f"{name} is not 0 at pruned coordinates"
    for name in packed:
        assert stats[name]["sent_bytes"] == 4 * int(expected[name].sum()), name
    assert_same_on_all_ranks(variables)


@needs_tf_keras
def test_tfmot_masks_are_kept_packed_and_strip_pruning_gives_a_sparse_model():
    import tensorflow_model_optimization as tfmot

    sparsity = tfmot.sparsity.keras
    model = sparsity.prune_low_magnitude(make_model(), pruning_schedule=sparsity.ConstantSparsity(
        0.6, begin_step=0, end_step=1, frequency=1))
    # tfmot computes its masks in its first step (pruning_step 1; none after end_step): the same data on every
    # rank gives the same masks.
    compiled(model, keras.optimizers.SGD(0.0))
    x, y = batches(1)
    rng = np.random.default_rng(5)
    model.fit(rng.normal(size=x.shape).astype(np.float32), y * 0, batch_size=8, verbose=0,
              callbacks=[sparsity.UpdatePruningStep()])
    wrappers = [layer for layer in model.layers if getattr(layer, "pruning_vars", None)]
    assert len(wrappers) == 3
    by_weight = {weight.ref(): mask.numpy() != 0 for layer in wrappers for weight, mask, _ in layer.pruning_vars}
    names = named(model.trainable_variables)
    expected = {name: by_weight[v.ref()] for name, v in names.items() if v.ref() in by_weight}
    assert len(expected) == 3 and all(0.35 < m.mean() < 0.45 for m in expected.values())

    opt = ptk.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9), masks=model, pack_min_numel=0)
    assert opt.pactrain_state.config.sparsity == 0.0, "given masks are fixed: the schedule is off"
    compiled(model, opt)
    before = {name: v.numpy() for name, v in names.items()}
    fit(model, STEPS, callbacks=[sparsity.UpdatePruningStep(), ptk.callbacks.BroadcastGlobalVariablesCallback(0)])
    assert opt.step_count == STEPS
    check_masks_kept_and_packed(model, opt, expected)
    for name, mask in expected.items():
        assert not np.array_equal(names[name].numpy()[mask], before[name][mask]), f"{name} did not train"

    plain = sparsity.strip_pruning(model)
    assert not any(hasattr(layer, "pruning_vars") for layer in plain.layers), "strip_pruning left wrappers"
    kernels = [layer.kernel.numpy() for layer in plain.layers if hasattr(layer, "kernel")]
    assert [float((k == 0).mean()) for k in kernels] == pytest.approx([1 - m.mean() for m in expected.values()])
    probe = batches(1, start=99)[0]
    np.testing.assert_allclose(plain(probe).numpy(), model(probe, training=False).numpy(), rtol=1e-5, atol=1e-6)


def kernel_masks(model, density=0.3, seed=7):
    """Random masks for the two largest kernels, the same on every rank."""
    rng = np.random.default_rng(seed)
    variables = named(model.trainable_variables)
    largest = sorted((n for n, v in variables.items() if v.shape.rank >= 2), key=lambda n: -variables[n].shape.num_elements())
    return {name: rng.random(variables[name].shape) < density for name in largest[:2]}


def test_masks_dict_on_the_keras_optimizer_is_kept_and_packed():
    model = make_model()
    expected = kernel_masks(model)
    opt = ptk.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9), masks=expected, pack_min_numel=0)
    compiled(model, opt)
    fit(model, STEPS, callbacks=[ptk.callbacks.BroadcastGlobalVariablesCallback(0)])
    assert opt.pactrain_state.bound.pruner.prunable_names == sorted(expected), "only tensors with given masks are prunable"
    check_masks_kept_and_packed(model, opt, expected)


def test_masks_dict_on_the_tape():
    model = make_model()
    expected = kernel_masks(model, seed=8)
    opt = keras.optimizers.SGD(0.05)
    state = pt.PacTrainState(masks=expected, pack_min_numel=0, optimizer=opt)
    x, y = batches(STEPS)
    for step in range(STEPS):
        with tf.GradientTape() as tape:
            logits = model(x[8 * step: 8 * step + 8], training=True)
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y[8 * step: 8 * step + 8], logits,
                                                                               from_logits=True))
        tape = pt.DistributedGradientTape(tape, state=state)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
    check_masks_kept_and_packed(model, state, expected)


def test_masks_that_differ_across_ranks_raise_on_every_rank():
    model = make_model()
    masks = kernel_masks(model)
    name = next(iter(masks))
    if hvd.rank() == 1:
        masks[name] = masks[name][::-1].copy()  # same count, other positions
    opt = ptk.DistributedOptimizer(keras.optimizers.SGD(0.05), masks=masks)
    compiled(model, opt)
    # Raised inside the traced step: TF reports it as UnknownError carrying the MaskMismatchError.
    with pytest.raises(tf.errors.UnknownError, match=rf"MaskMismatchError: .*'{name}': ranks \[1\] differ"):
        fit(model, 1)


@pytest.mark.parametrize("masks, error, message", [
    ({}, ValueError, "masks= is empty"),
    ({"k": np.ones((2, 2))}, TypeError, "must have dtype bool"),
    ({"k": np.zeros((2, 2), bool)}, ValueError, "all zeros"),
    ([1], TypeError, "masks must be a dict"),
])
def test_bad_masks_are_refused_at_construction(masks, error, message):
    with pytest.raises(error, match=message):
        pt.PacTrainState(masks=masks)


def test_masks_naming_unknown_variables_are_refused_before_communicating():
    model = make_model()
    opt = ptk.DistributedOptimizer(keras.optimizers.SGD(0.05), masks={"no/such/kernel": np.ones((2, 2), bool)})
    compiled(model, opt)
    weights = {name: v.numpy() for name, v in named(model.trainable_variables).items()}
    with pytest.raises(ValueError, match="does not update: no/such/kernel"):
        fit(model, 1)
    for name, variable in named(model.trainable_variables).items():
        np.testing.assert_array_equal(variable.numpy(), weights[name], err_msg=name)
