"""Horovod's rule for who communicates: members of the process set, and only with another member to talk to.
With 2 ranks and the process set {0}, rank 1 is outside it and rank 0 alone in it: neither makes a collective
call (an all-reduce, the Mask Tracker's allgather, a mask broadcast), as Horovod's own wrapper; both prune,
locally. Every Horovod collective is replaced by an error while PacTrain trains."""

import horovod.tensorflow as hvd
import horovod.tensorflow.keras as hvd_keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import (
    EVEN_RANKS,
    LEGACY_KERAS,
    batch,
    compiled,
    fit,
    horovod_idiom_step,
    keras,
    loss_fn,
    make_model,
    named,
)

import pactrain_hvd.tensorflow as pt
import pactrain_hvd.tensorflow.keras as ptk
from pactrain_hvd.core import num_to_keep

COLLECTIVES = ("allreduce", "grouped_allreduce", "allgather", "broadcast_object")


def forbid_collectives(patch: pytest.MonkeyPatch) -> None:
    for name in COLLECTIVES:
        def refuse(*args, _name=name, **kwargs):
            raise AssertionError(f"hvd.{_name} called on rank {hvd.rank()}, which must not communicate")
        patch.setattr(hvd, name, refuse)


@pytest.mark.parametrize("sparsity, values", [(0.0, "inherit"), (0.5, "inherit"), (0.5, "ternary")])
def test_tape_outside_or_alone_in_its_process_set_returns_local_gradients_pruned(sparsity, values, monkeypatch):
    model = make_model()
    opt = keras.optimizers.SGD(0.05, momentum=0.9)
    state = pt.PacTrainState(process_set=EVEN_RANKS, sparsity=sparsity, ranking="layer", begin_step=0, end_step=2, frequency=1,
                             packed_values=values, pack_min_numel=0, verify_every=1, optimizer=opt)
    sources = model.trainable_variables
    names = list(named(sources))
    with monkeypatch.context() as patch:
        forbid_collectives(patch)
        for number in range(4):
            x, y = batch(number)
            with tf.GradientTape(persistent=True) as tape:
                loss = loss_fn(y, model(x, training=True))
            local = tape.gradient(loss, sources)
            grads = pt.DistributedGradientTape(tape, state=state).gradient(loss, sources)
            masks = state.masks()
            for name, ours, plain in zip(names, grads, local):  # not averaged, not quantised: masked only
                expected = np.where(masks[name], plain.numpy(), 0) if name in masks else plain.numpy()
                np.testing.assert_array_equal(ours.numpy(), expected, err_msg=f"{name}, step {number}")
            opt.apply_gradients(zip(grads, sources))
    assert state.step_count == 4 and state.stats()["sent_bytes"] == 0
    variables = named(sources)
    for name, mask in state.masks().items():
        assert int(mask.sum()) == num_to_keep(mask.size, sparsity), name
        assert not variables[name].numpy()[~mask].any(), f"pruned weights of {name} are not 0"
    assert bool(state.masks()) == (sparsity > 0)


def test_sparsity_zero_with_a_process_set_is_horovods_tape():
    ours_model, theirs_model = make_model(seed=hvd.rank()), make_model(seed=hvd.rank())
    ours_opt, theirs_opt = keras.optimizers.SGD(0.05, momentum=0.9), keras.optimizers.SGD(0.05, momentum=0.9)
    ours, _ = horovod_idiom_step(ours_model, ours_opt, lambda tape: pt.DistributedGradientTape(
        tape, sparsity=0.0, process_set=EVEN_RANKS))
    theirs, _ = horovod_idiom_step(theirs_model, theirs_opt, lambda tape: hvd.DistributedGradientTape(
        tape, process_set=EVEN_RANKS))
    for number in range(3):
        ours(*batch(number))
        theirs(*batch(number))
    for a, b in zip(ours_model.trainable_variables, theirs_model.trainable_variables):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_keras_fit_with_a_process_set_prunes_without_communicating(monkeypatch):
    model = make_model()
    opt = ptk.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9), process_set=EVEN_RANKS, sparsity=0.5, ranking="layer",
                                   begin_step=0, end_step=0, verify_every=1)
    compiled(model, opt)
    with monkeypatch.context() as patch:
        forbid_collectives(patch)  # the callback's hvd.broadcast_variables is global, as Horovod's
        fit(model, 3, callbacks=[ptk.callbacks.BroadcastGlobalVariablesCallback(0)])
    assert opt.step_count == 3 and opt.stats()["sent_bytes"] == 0
    variables = named(model.trainable_variables)
    for name, mask in opt.masks().items():
        assert int(mask.sum()) == num_to_keep(mask.size, 0.5), name
        assert not variables[name].numpy()[~mask].any(), f"pruned weights of {name} are not 0"


def test_each_rank_applies_its_own_gradient_as_horovods_process_set_optimizer():
    """Horovod's test_process_set_optimizer: the gradient is the rank; a set of one averages over itself."""
    def trained(make_optimizer):
        variable = tf.Variable([0.0])
        optimizer = make_optimizer(keras.optimizers.SGD(1.0))
        optimizer.apply_gradients([(tf.constant([float(hvd.rank())]), variable)])
        return variable.numpy()

    ours = trained(lambda opt: ptk.DistributedOptimizer(opt, process_set=EVEN_RANKS, sparsity=0.5, ranking="layer"))
    np.testing.assert_array_equal(ours, [-float(hvd.rank())])
    if LEGACY_KERAS:  # Horovod's Keras optimizer reduces in get_gradients, which this path does not call
        np.testing.assert_array_equal(ours, trained(lambda opt: hvd_keras.DistributedOptimizer(
            opt, process_set=EVEN_RANKS)))
