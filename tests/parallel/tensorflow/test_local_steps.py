"""Local steps (``sync_every``) in the Keras optimizer: ranks step alone and every H steps take one outer Nesterov
step on the average of their progress, carried packed like gradients."""

import tempfile

import horovod.tensorflow as hvd
import numpy as np
import pytest
import tensorflow as tf
from conftest import assert_same_on_all_ranks, batch, batches, gathered_equal, keras, loss_fn, make_model, named

import pactrain_hvd.tensorflow as pt
import pactrain_hvd.tensorflow.keras as ptk

H, LR, BETA, INNER_LR = 3, 0.7, 0.9, 0.05


def optimizer(**keywords):
    settings = dict(sparsity=0.9, ranking="layer", begin_step=0, end_step=0, pack_min_numel=100, sync_every=H,
                    outer_lr=LR, outer_momentum=BETA)
    return ptk.DistributedOptimizer(keras.optimizers.SGD(INNER_LR), **{**settings, **keywords})


def trainer(model, opt):
    """``gradients(x, y)`` and ``apply(grads)``, each traced once: a custom loop whose update the test can predict."""

    @tf.function(autograph=False)
    def gradients(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        return tape.gradient(loss, model.trainable_variables)

    @tf.function(autograph=False)
    def apply(grads):
        opt.apply_gradients(zip(grads, model.trainable_variables))

    return gradients, apply


def gathered_mean(array, name):
    return hvd.allgather(tf.reshape(tf.constant(array), [1, -1]), name=name).numpy().mean(0).reshape(array.shape)


@pytest.mark.parametrize("packed_values", ["inherit", "int3"])
def test_after_each_sync_ranks_hold_the_outer_step_on_their_mean_progress(packed_values):
    model = make_model()
    opt = optimizer(packed_values=packed_values)
    state = opt.pactrain_state
    gradients, apply = trainer(model, opt)
    variables = named(model.trainable_variables)
    momentum = {name: np.zeros(v.shape, np.float32) for name, v in variables.items()}
    for step in range(2 * H):
        if step % H == 0:
            anchor = {name: v.numpy() for name, v in variables.items()}
        weights = {name: v.numpy() for name, v in variables.items()}
        grads = gradients(*batch(step))
        residuals = state.bound.quantized.memory.state_dict() if state.bound.quantized else {}
        apply(grads)
        masks = opt.masks()
        local = {}  # this rank's weights after its inner update, before the sync: SGD on the masked gradient
        for (name, weight), grad in zip(weights.items(), grads):
            mask = masks.get(name, np.ones(weight.shape, bool))
            local[name] = np.where(mask, weight - INNER_LR * grad.numpy(), 0)
            if step % H == 0:  # masks ranked at the interval's first step zero the anchor too
                anchor[name] = np.where(mask, anchor[name], 0)
            assert not variables[name].numpy()[~mask].any(), f"{name}: a pruned weight moved at step {step}"
        if (step + 1) % H:
            assert opt.stats()["sent_bytes"] == 0, "a local step communicates nothing"
            assert not all(gathered_equal(variables).values()), "ranks step on their own gradients"
            continue
        assert_same_on_all_ranks(variables, f"synced.{packed_values}.{step}")
        for name, variable in variables.items():
            sent = anchor[name] - local[name]
            compressor = state.bound.compressors.get(name)
            if name in residuals and state.bound.packed[name]:  # what rounding sent: progress plus memory, less it now
                survivors = compressor.surviving_indices.numpy()
                flat = np.zeros(sent.size, np.float32)
                flat[survivors] = (sent.reshape(-1)[survivors] + residuals[name]
                                   - state.bound.quantized.memory.state_dict()[name])
                sent = flat.reshape(sent.shape)
            mean = gathered_mean(sent.astype(np.float32), f"ref.{packed_values}.{step}.{name}")
            momentum[name] = BETA * momentum[name] + mean
            expected = anchor[name] - LR * (mean + BETA * momentum[name])
            np.testing.assert_allclose(variable.numpy(), expected, rtol=1e-5, atol=1e-6, err_msg=f"{name} at {step}")
            np.testing.assert_array_equal(state.bound.outer.anchor[name].numpy(), variable.numpy())


def test_the_bytes_of_a_sync_are_one_packed_step_of_the_per_step_optimizer():
    sent = {}
    for sync_every in (1, H):
        model = make_model()
        opt = optimizer(sync_every=sync_every)
        gradients, apply = trainer(model, opt)
        sent[sync_every] = []
        for step in range(H):
            apply(gradients(*batch(step)))
            sent[sync_every].append(opt.stats()["sent_bytes"])
    assert sent[H] == [0] * (H - 1) + [sent[1][-1]] and sent[1][-1] > 0
    dense = sum(v.shape.num_elements() * 4 for v in make_model().trainable_variables)
    assert sent[1][-1] < dense / 4, "packed: the pruned tensors carry their survivors only"


def test_model_fit_from_rank_0s_weights_syncs_every_h_steps():
    model = make_model(seed=hvd.rank())  # each rank its own weights: the callback gives every rank rank 0's
    model.compile(optimizer=optimizer(), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    equal = []
    record = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda *_, **__: equal.append(all(gathered_equal(named(model.trainable_variables)).values())))
    x, y = batches(2 * H)
    model.fit(x, y, batch_size=8, shuffle=False, verbose=0,
              callbacks=[ptk.callbacks.BroadcastGlobalVariablesCallback(0), record])
    assert equal == [(step + 1) % H == 0 for step in range(2 * H)]


def fresh_model(seed: int = 0):
    """A model named as the first one a process builds: a resumed process's names (the rounding noise of int3
    codes is drawn per tensor name)."""
    keras.backend.clear_session()
    return make_model(seed)


@pytest.mark.parametrize("packed_values", ["inherit", "int3"])
def test_resume_mid_interval_equals_an_uninterrupted_run(packed_values):
    model, opt = fresh_model(), optimizer(packed_values=packed_values)
    gradients, apply = trainer(model, opt)
    for step in range(H + 1):
        apply(gradients(*batch(step)))
    prefix = tf.train.Checkpoint(model=model, optimizer=opt).save(f"{tempfile.mkdtemp()}/ckpt")
    for step in range(H + 1, 2 * H + 2):
        apply(gradients(*batch(step)))

    resumed_model, resumed = fresh_model(seed=7), optimizer(packed_values=packed_values)
    assert list(named(resumed_model.trainable_variables)) == list(named(model.trainable_variables))
    resumed.build(resumed_model.trainable_variables)
    tf.train.Checkpoint(model=resumed_model, optimizer=resumed).restore(prefix).assert_existing_objects_matched()
    assert resumed.step_count == H + 1
    gradients, apply = trainer(resumed_model, resumed)
    for step in range(H + 1, 2 * H + 2):
        apply(gradients(*batch(step)))
    for a, b in zip(model.trainable_variables, resumed_model.trainable_variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_a_tape_refuses_local_steps_before_anything_is_communicated():
    with tf.GradientTape() as tape:
        pass
    with pytest.raises(ValueError, match="sync_every: local steps need the optimizer's update"):
        pt.DistributedGradientTape(tape, sync_every=H)
    with pytest.raises(ValueError, match="a state with sync_every > 1: local steps"):
        pt.DistributedGradientTape(tape, state=pt.PacTrainState(sync_every=H))


def test_horovods_resume_idiom_mid_interval_gives_every_rank_rank_0s_anchor_and_momentum():
    model, opt = make_model(), optimizer()
    gradients, apply = trainer(model, opt)
    for step in range(2 * H + 1):  # mid-interval, after a sync: a momentum that is not zero
        apply(gradients(*batch(step)))
    outer = opt.pactrain_state.bound.outer
    assert not all(gathered_equal(named(model.trainable_variables)).values())
    root = {part: {name: tensor.numpy() for name, tensor in getattr(outer, part).items()} for part in ("anchor", "momentum")}
    if hvd.rank() != 0:  # a rank that did not load the checkpoint holds something else
        for tensor in [*outer.anchor.values(), *outer.momentum.values()]:
            tensor.assign(tf.ones_like(tensor))
    hvd.broadcast_variables(list(named(model.variables).values()), root_rank=0)
    pt.broadcast_masks(opt, root_rank=0)
    assert_same_on_all_ranks(named(model.trainable_variables), "weight")
    assert_same_on_all_ranks({f"anchor {n}": t for n, t in outer.anchor.items()}, "anchor")
    assert_same_on_all_ranks({f"momentum {n}": t for n, t in outer.momentum.items()}, "momentum")
    if hvd.rank() == 0:
        for part in ("anchor", "momentum"):
            for name, tensor in getattr(outer, part).items():
                np.testing.assert_array_equal(tensor.numpy(), root[part][name])
