"""packed_values='ternary' and 'fp16' in the TF frontend: ternary codes at a held scale (the previous step's MAX over ranks of a multiple of the mean |value|)
summed in int32 lanes by Horovod, with error feedback, inside tf.function across mask changes; fp16 packed values;
Keras model.fit; bad arguments; checkpoints of the memory and the held scales."""

import io

import horovod.tensorflow as hvd
import numpy as np
import pytest
import tensorflow as tf
from conftest import assert_same_on_all_ranks, batch, gathered_equal, keras, loss_fn, make_model, named, tape_step

import pactrain_hvd.tensorflow as pt
import pactrain_hvd.tensorflow.keras as ptk
from pactrain_hvd.core.lanes import SCALE_BYTES, STEP_OVER_MEAN, quantized_layout
from pactrain_hvd.core.quantized import noise_key
from pactrain_hvd.tensorflow.compression import PACKED


def all_true(flag: bool, name: str) -> bool:
    """``flag`` on every rank (so every rank asserts the same thing and none hangs)."""
    return bool(hvd.allreduce(tf.constant([int(flag)]), op=hvd.Min, name=f"check.{name}").numpy()[0])


def local_gradients(model, x, y) -> dict:
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
    return dict(zip(named(model.trainable_variables), tape.gradient(loss, model.trainable_variables)))


def remapped(residual, old_indices, new_indices, numel):
    """The residual a mask change keeps: surviving coordinates carry theirs, newly packed ones start at 0."""
    dense = np.zeros(numel, np.float32)
    dense[old_indices] = residual
    return dense[new_indices]


@pytest.mark.parametrize("packed_values, levels", [("ternary", 1), ("int3", 3)])
@pytest.mark.parametrize("op", [hvd.Average, hvd.Sum], ids=["average", "sum"])
def test_quantized_gradients_are_the_mean_of_each_ranks_dequantized_codes(op, packed_values, levels):
    size, layout = hvd.size(), quantized_layout(hvd.size(), levels)
    model = make_model()
    opt = keras.optimizers.SGD(0.05, momentum=0.9)
    # step 0 unmasked, 1 masked but dense (sparsity 0), 2 packed (new mask), 3 packed (mask changes again), 4 steady
    state = pt.PacTrainState(op=op, packed_values=packed_values, sparsity=0.9, ranking="layer", begin_step=1, end_step=3, frequency=1,
                             pack_min_numel=1000, optimizer=opt)
    step = tape_step(model, opt, state)
    variables = named(model.trainable_variables)
    memory = state.bound.quantized.memory
    first = next(iter(variables))
    assert not gathered_equal({"key": np.int64(noise_key(hvd.rank(), first))})["key"]  # ranks draw independently
    traces = None
    for number in range(5):
        x, y = batch(number)
        local = local_gradients(model, x, y)
        before = {name: residual.numpy() for name, residual in memory.residuals.items()}
        held = {name: scale.numpy() for name, scale in state.bound.quantized.scales.items()}
        old_indices = {name: c.surviving_indices.numpy() for name, c in state.bound.compressors.items()}
        grads = dict(zip(variables, (g.numpy() for g in step(x, y))))
        traces = traces or step.experimental_get_tracing_count()
        masks, stats = state.masks(), state.stats()
        packed = sorted(name for name, c in state.bound.compressors.items() if int(c.plan) == PACKED)
        large = sorted(n for n, v in variables.items() if v.shape.num_elements() >= 1000)
        assert packed == ([] if number < 2 else large)
        assert stats["values"] == packed_values
        for name in sorted(set(variables) - set(packed)):  # unpruned and dense-plan tensors: fp32, exact average
            reference = local[name] * masks[name] if name in masks else local[name]
            reference = hvd.allreduce(reference, op=op, name=f"ref.dense.{op}.{number}.{name}").numpy()
            ok = np.allclose(grads[name], reference, rtol=1e-6, atol=1e-7)
            assert all_true(ok, f"dense.{op}.{number}.{name}"), f"dense tensor {name} at step {number}"
            assert stats["tensors"][name]["sent_bytes"] == 4 * variables[name].shape.num_elements()
        for name in packed:
            indices, numel = state.bound.compressors[name].surviving_indices.numpy(), variables[name].shape.num_elements()
            residual = remapped(before[name], old_indices[name], indices, numel)
            values = local[name].numpy().reshape(-1)[indices] + residual  # error feedback: last step's error added
            step_max = hvd.allreduce(levels * STEP_OVER_MEAN * tf.reduce_mean(tf.abs(values)), op=hvd.Max,
                                     name=f"ref.scale.{op}.{number}.{name}")
            step_max = np.float32(step_max.numpy())
            # the first packed step agrees this step's MAX; later steps round at the one held from the step before
            assert np.isnan(held[name]) == (number == 2), (name, number, held[name])
            scale = step_max if np.isnan(held[name]) else held[name]
            assert state.bound.quantized.scales[name].numpy() == pytest.approx(step_max, rel=1e-6)  # the next step's
            dequantized = values - memory.residuals[name].numpy()  # what this rank sent: q * step
            step_size = scale / np.float32(levels)
            quantized = np.round(dequantized / step_size)
            codes_ok = (np.all(np.abs(quantized) <= levels)
                        and np.allclose(quantized * step_size, dequantized, rtol=1e-5, atol=1e-6))
            assert all_true(codes_ok, f"codes.{op}.{number}.{name}"), f"{name}: a rank sent values other than q * step"
            summed = hvd.allreduce(tf.constant(quantized, tf.int32), op=hvd.Sum, name=f"ref.sum.{op}.{number}.{name}")
            codes = hvd.allreduce(tf.constant(np.count_nonzero(quantized)), op=hvd.Sum, name=f"ref.n{op}.{number}.{name}")
            assert int(codes) > 0  # hundreds of values, each sent with probability min(1, |v| / step) at least
            expected = summed.numpy().astype(np.float32) * scale / levels / (size if op == hvd.Average else 1)
            got = grads[name].reshape(-1)
            close = np.allclose(got[indices], expected, rtol=1e-6, atol=0)
            pruned_zero = bool(np.all(grads[name][~masks[name]] == 0))
            assert all_true(close and pruned_zero, f"grad.{op}.{number}.{name}"), f"{name} at step {number}"
            assert all_true(np.any(memory.residuals[name].numpy() != 0), f"residual.{op}.{number}.{name}")
            entry = stats["tensors"][name]
            assert entry["kept"] == indices.size and entry["packed"]
            assert entry["sent_bytes"] == 4 * -(-indices.size // layout.lanes) + SCALE_BYTES
            assert entry["bits_per_value"] == pytest.approx(8 * entry["sent_bytes"] / indices.size)
        if packed:
            assert stats["bits_per_value"] < 32 / layout.lanes + 0.5  # ternary: 32 / 13 digits for 2 ranks, plus a scale
    assert step.experimental_get_tracing_count() == traces  # mask and plan changes did not retrace
    assert_same_on_all_ranks(variables)
    for name, mask in state.masks().items():
        assert np.all(variables[name].numpy()[~mask] == 0), f"pruned weights of {name} are not 0"


def test_fp16_values_pack_as_fp16_and_dense_tensors_as_compression_says():
    """Eagerly this time: the state runs its cached tf.function."""
    model = make_model()
    opt = keras.optimizers.SGD(0.05)
    state = pt.PacTrainState(packed_values="fp16", sparsity=0.9, ranking="layer", begin_step=0, end_step=0, pack_min_numel=1000, optimizer=opt)
    variables = named(model.trainable_variables)
    for number in range(3):
        x, y = batch(number)
        local = local_gradients(model, x, y)
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        sources = model.trainable_variables
        grads = pt.DistributedGradientTape(tape, state=state).gradient(loss, sources)
        opt.apply_gradients(zip(grads, sources))
        masks, stats = state.masks(), state.stats()
        assert stats["values"] == "fp16"
        for name, grad in zip(variables, grads):
            reference = local[name] * masks[name] if name in masks else local[name]
            reference = hvd.allreduce(reference, name=f"ref.fp16.{number}.{name}").numpy()
            entry = stats["tensors"][name]
            if entry["packed"]:
                np.testing.assert_allclose(grad.numpy(), reference, rtol=2e-3, atol=1e-4, err_msg=name)
                assert entry["sent_bytes"] == 2 * entry["kept"]
                assert np.all(grad.numpy()[~masks[name]] == 0)
            else:  # as compression (none) says: fp32
                np.testing.assert_array_equal(grad.numpy(), reference, err_msg=name)
                assert entry["sent_bytes"] == 4 * entry["numel"]
    assert sum(entry["packed"] for entry in stats["tensors"].values()) == 2


def test_keras_fit_with_ternary_values_learns_and_keeps_ranks_identical():
    """A linear teacher that the fixed mask can represent (bring your own mask): the loss can go to ~0."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(4, use_bias=False)])
    (name, kernel), = named(model.trainable_variables).items()
    rng = np.random.default_rng(0)
    mask = rng.permutation(np.arange(256) < 128).reshape(64, 4)
    teacher = (rng.normal(size=(64, 4)) * mask).astype(np.float32)
    inputs = np.random.default_rng(100 + hvd.rank()).normal(size=(256, 64)).astype(np.float32)
    opt = ptk.DistributedOptimizer(keras.optimizers.SGD(0.02, momentum=0.9), packed_values="ternary", masks={name: mask},
                                   pack_min_numel=0)
    model.compile(optimizer=opt, loss="mse")
    history = model.fit(inputs, inputs @ teacher, batch_size=32, epochs=15, shuffle=False, verbose=0,
                        callbacks=[ptk.callbacks.BroadcastGlobalVariablesCallback(0)])
    losses = history.history["loss"]
    stats = opt.stats()
    assert stats["values"] == "ternary" and stats["tensors"][name]["packed"] and stats["tensors"][name]["kept"] == 128
    assert stats["tensors"][name]["sent_bytes"] == 4 * 10 + SCALE_BYTES  # 128 codes, 13 digits per word
    assert all_true(losses[-1] < 0.01 * losses[0], "fit.loss"), f"loss went {losses[0]:.3f} -> {losses[-1]:.3f}"
    assert_same_on_all_ranks({name: kernel})
    assert np.all(kernel.numpy()[~opt.masks()[name]] == 0)


@pytest.mark.parametrize("kwargs, message", [
    (dict(packed_values="int8"), "packed_values must be one of 'inherit', 'fp16', 'bf16', 'ternary', 'int3', got 'int8'"),
    (dict(packed_values="ternary", op=hvd.Max), "packed_values='ternary' sums integer codes: op must be hvd.Average or hvd.Sum, "
                                         "got Max"),
    (dict(packed_values="ternary", groups=2), "packed_values='ternary' cannot be combined with groups"),
    (dict(packed_values="fp16", groups=2), "packed_values='fp16' cannot be combined with groups in the TensorFlow frontend"),
], ids=["unknown", "ternary-max", "ternary-groups", "fp16-groups"])
def test_bad_values_arguments_are_refused_before_anything(kwargs, message):
    with pytest.raises(ValueError, match=message):
        pt.PacTrainState(**kwargs)
    with pytest.raises(ValueError, match=message):
        pt.DistributedGradientTape(tf.GradientTape(), **kwargs)
    if "op" not in kwargs:  # the Keras optimizer has Horovod's own op check
        with pytest.raises(ValueError, match=message):
            ptk.DistributedOptimizer(keras.optimizers.SGD(), **kwargs)


def test_checkpoint_carries_this_ranks_error_memory():
    """As torch's state_dict: a rank restores its own residuals, every rank the held scales (the same
    everywhere); a misfit residual is refused. The noise is the step's: nothing of it is saved."""
    model = make_model()
    opt = keras.optimizers.SGD(0.05, momentum=0.9)
    state = pt.PacTrainState(packed_values="ternary", sparsity=0.9, ranking="layer", begin_step=0, end_step=0, pack_min_numel=1000,
                             optimizer=opt)
    step = tape_step(model, opt, state)
    for number in range(3):
        step(*batch(number))
    blob = state.serialize()
    saved = {name: residual.numpy() for name, residual in state.bound.quantized.memory.residuals.items()}
    scales = {name: scale.numpy() for name, scale in state.bound.quantized.scales.items()}
    assert any(residual.size for residual in saved.values())
    packed_names = [name for name, residual in saved.items() if residual.size]
    assert all(scales[name] > 0 for name in packed_names)
    assert all(gathered_equal({name: scales[name] for name in packed_names}).values())  # every rank holds the same
    step(*batch(3))  # memory moves on
    assert any(not np.array_equal(state.bound.quantized.memory.residuals[n].numpy(), r) for n, r in saved.items() if r.size)
    state.deserialize(blob)
    for name, residual in saved.items():
        np.testing.assert_array_equal(state.bound.quantized.memory.residuals[name].numpy(), residual, err_msg=name)
    assert {name: scale.numpy() for name, scale in state.bound.quantized.scales.items()} == pytest.approx(scales, nan_ok=True)

    with np.load(io.BytesIO(blob)) as arrays:
        entries = dict(arrays)
    del entries["pactrain_digest"]  # edited below, as a state written before digests (its own would not match)
    earlier = {key.replace("quantized_", "ternary_", 1): value for key, value in entries.items()}
    buffer = io.BytesIO()
    np.savez(buffer, **earlier)
    state.deserialize(buffer.getvalue())  # the entries' earlier names
    for name, residual in saved.items():
        np.testing.assert_array_equal(state.bound.quantized.memory.residuals[name].numpy(), residual, err_msg=name)
    packed = next(key for key in entries if key.startswith("residual_") and entries[key].size)
    entries[packed] = entries[packed][:-1]
    buffer = io.BytesIO()
    np.savez(buffer, **entries)
    with pytest.raises(pt.CheckpointError, match="quantization residual of .* its packed values number"):
        state.deserialize(buffer.getvalue())
    entries = dict(entries, quantized_rank=np.int64(1 - hvd.rank()))  # another rank's memory: ignored
    fresh = pt.PacTrainState(packed_values="ternary", sparsity=0.9, ranking="layer", begin_step=0, end_step=0, pack_min_numel=1000)
    fresh.bind(model.trainable_variables)
    buffer = io.BytesIO()
    np.savez(buffer, **entries)
    fresh.deserialize(buffer.getvalue())
    assert all(residual.numpy().size == 0 or not residual.numpy().any()
               for residual in fresh.bound.quantized.memory.residuals.values())
    assert {name: scale.numpy() for name, scale in fresh.bound.quantized.scales.items()} == pytest.approx(scales, nan_ok=True)
    buffer = io.BytesIO()
    np.savez(buffer, **dict(entries, quantized_scales=-entries["quantized_scales"]))
    with pytest.raises(pt.CheckpointError, match="quantization scales must be >= 0 and finite"):
        fresh.deserialize(buffer.getvalue())
    del entries["quantized_scales"], entries["scale_positions"]  # a checkpoint from before held scales: none held
    buffer = io.BytesIO()
    np.savez(buffer, **entries)
    fresh.deserialize(buffer.getvalue())
    assert all(np.isnan(scale.numpy()) for scale in fresh.bound.quantized.scales.values())
    assert fresh.step_count == 3
