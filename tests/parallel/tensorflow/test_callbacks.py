"""Horovod's Keras callbacks, ours by prefix: learning-rate warm-up and schedule give Horovod's formulas per
batch, metrics are averaged over ranks in place, bad arguments are refused by name."""

import horovod.tensorflow as hvd
import numpy as np
import pytest
from conftest import LEGACY_KERAS, batches, compiled, keras, make_model

import pactrain_hvd.tensorflow.keras as ptk

STEPS_PER_EPOCH = 4


class Recorder(keras.callbacks.Callback):
    """The learning rate each batch runs with, and each epoch's logs as the callbacks before it left them."""

    def __init__(self):
        super().__init__()
        self.rates, self.epochs, self.momenta = [], [], []

    def on_train_batch_begin(self, batch, logs=None):
        self.rates.append(float(np.asarray(self.model.optimizer.learning_rate)))
        momentum = getattr(self.model.optimizer, "momentum", None)
        self.momenta.append(None if momentum is None else float(np.asarray(momentum)))

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append(dict(logs))


def train(callbacks, epochs, optimizer=None):
    model = compiled(make_model(), optimizer or ptk.DistributedOptimizer(keras.optimizers.SGD(0.01), sparsity=0.0))
    x, y = batches(STEPS_PER_EPOCH)
    recorder = Recorder()
    history = model.fit(x, y, batch_size=8, epochs=epochs, shuffle=False, verbose=0,
                        callbacks=[ptk.callbacks.BroadcastGlobalVariablesCallback(0), *callbacks, recorder])
    return model, recorder, history


def test_warmup_ramps_from_lr_over_size_to_lr_per_batch():
    initial, warmup = 0.04, 2
    _, recorder, history = train([ptk.callbacks.LearningRateWarmupCallback(initial, warmup_epochs=warmup)], 3)
    size = hvd.size()
    expected = []
    for epoch in range(warmup):
        for batch in range(STEPS_PER_EPOCH):
            progress = epoch + batch / STEPS_PER_EPOCH + 1 / STEPS_PER_EPOCH
            expected.append(initial / size * (progress * (size - 1) / warmup + 1))
    expected += [expected[-1]] * STEPS_PER_EPOCH  # after the warm-up: left where it ended
    np.testing.assert_allclose(recorder.rates, expected, rtol=1e-6)
    assert recorder.rates[warmup * STEPS_PER_EPOCH - 1] == pytest.approx(initial)
    np.testing.assert_allclose(history.history["lr"], [expected[3], expected[7], expected[11]], rtol=1e-6)


def test_schedule_staircase_between_start_and_end_epoch():
    callback = ptk.callbacks.LearningRateScheduleCallback(0.08, multiplier=0.5, start_epoch=1, end_epoch=3)
    _, recorder, _ = train([callback], 4)
    per_epoch = [recorder.rates[epoch * STEPS_PER_EPOCH:(epoch + 1) * STEPS_PER_EPOCH] for epoch in range(4)]
    expected = [0.01, 0.08, 0.04, 0.04]  # untouched before start_epoch, kept after end_epoch
    for epoch, rates in enumerate(per_epoch):
        np.testing.assert_allclose(rates, [expected[epoch]] * STEPS_PER_EPOCH, rtol=1e-6)


def test_schedule_with_a_function_per_batch():
    callback = ptk.callbacks.LearningRateScheduleCallback(0.1, multiplier=lambda epoch: 1 / (1 + epoch),
                                                          staircase=False, momentum_correction=False)
    _, recorder, _ = train([callback], 1)
    np.testing.assert_allclose(recorder.rates, [0.1 / (1 + b / STEPS_PER_EPOCH) for b in range(STEPS_PER_EPOCH)],
                               rtol=1e-6)


def test_metric_average_replaces_logs_with_the_mean_over_ranks():
    before = Recorder()  # sees each rank's own loss
    _, after, _ = train([before, ptk.callbacks.MetricAverageCallback()], 1)
    own = before.epochs[0]["loss"]
    everyone = hvd.allgather(np.array([own], np.float64), name="callbacks.losses").numpy()
    assert len(set(everyone.tolist())) == hvd.size(), "ranks should see different data"
    assert after.epochs[0]["loss"] == pytest.approx(float(np.mean(everyone)), rel=1e-12)


def test_momentum_correction_only_where_momentum_is_a_variable():
    if LEGACY_KERAS:  # tf-keras' legacy optimizers hold momentum in a variable: corrected for one batch
        optimizer = ptk.DistributedOptimizer(keras.optimizers.legacy.SGD(0.01, momentum=0.9), sparsity=0.0)
        callback = ptk.callbacks.LearningRateScheduleCallback(0.02, multiplier=1.0)
        model, recorder, _ = train([callback], 1, optimizer)
        assert recorder.momenta[0] == pytest.approx(0.9 * 0.02 / 0.01)  # the batch that doubled the rate
        assert recorder.momenta[1:] == pytest.approx([0.9] * (STEPS_PER_EPOCH - 1))
        return
    optimizer = ptk.DistributedOptimizer(keras.optimizers.SGD(0.01, momentum=0.9), sparsity=0.0)
    callback = ptk.callbacks.LearningRateScheduleCallback(0.02, multiplier=1.0)
    with pytest.warns(UserWarning, match="momentum_correction skipped"):
        model, recorder, _ = train([callback], 1, optimizer)
    assert recorder.momenta == [0.9] * STEPS_PER_EPOCH and model.optimizer.momentum == 0.9


@pytest.mark.parametrize("make, message", [
    (lambda: ptk.callbacks.LearningRateWarmupCallback(None), "initial_lr"),
    (lambda: ptk.callbacks.LearningRateWarmupCallback(0.1, warmup_epochs=0), "warmup_epochs"),
    (lambda: ptk.callbacks.LearningRateScheduleCallback(0.1, multiplier="fast"), "multiplier"),
    (lambda: ptk.callbacks.LearningRateScheduleCallback(0.1, 0.5, start_epoch=2, end_epoch=2), "end_epoch"),
    (lambda: ptk.callbacks.LearningRateScheduleCallback(0.1, 0.5, steps_per_epoch=0), "steps_per_epoch"),
    (lambda: ptk.callbacks.BroadcastGlobalVariablesCallback(-1), "root_rank"),
    (lambda: ptk.callbacks.BroadcastGlobalVariablesCallback(0, local_variables=[1.0]), "local_variables"),
])
def test_bad_arguments_are_refused_by_name(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_a_learning_rate_schedule_is_refused_before_the_first_step():
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=10, decay_rate=0.5)
    optimizer = ptk.DistributedOptimizer(keras.optimizers.SGD(schedule), sparsity=0.0)
    with pytest.raises(ValueError, match="learning rate is a schedule"):
        train([ptk.callbacks.LearningRateWarmupCallback(0.1)], 1, optimizer)


def test_best_model_checkpoint_saves_improvements_on_rank_0_only(tmp_path):
    """Horovod's ``BestModelCheckpoint``: each rank is given its own folder; only rank 0's gets files, one per
    epoch that improved the (averaged) loss, and the last holds the weights of the epoch that wrote it."""
    template = str(tmp_path / "best-{epoch}.weights.h5")
    checkpoint = ptk.callbacks.BestModelCheckpoint(monitor="loss", save_weights_only=True, mode="min", filepath=template)
    model, _, history = train([ptk.callbacks.MetricAverageCallback(), checkpoint], 3)
    fresh = make_model()  # on every rank: Keras numbers the layers it names per process, and later tests compare
    saved = sorted(path.name for path in tmp_path.iterdir())
    if hvd.rank() != 0:
        assert saved == []
        return
    losses = history.history["loss"]
    improved = [epoch + 1 for epoch, loss in enumerate(losses) if all(loss < before for before in losses[:epoch])]
    assert saved == sorted(f"best-{epoch}.weights.h5" for epoch in improved) and improved[0] == 1
    if improved[-1] == len(losses):  # the last epoch was the best: the file holds the final weights
        fresh.load_weights(str(tmp_path / saved[-1]))
        for loaded, trained in zip(fresh.weights, model.weights):
            np.testing.assert_array_equal(np.asarray(loaded), np.asarray(trained))


def test_best_model_checkpoint_without_a_path_says_so_when_it_would_save():
    checkpoint = ptk.callbacks.BestModelCheckpoint(monitor="loss")  # Horovod's call: Spark sets the path later
    assert checkpoint.filepath is None and checkpoint.save_best_only
    checkpoint.set_model(make_model())
    if hvd.rank() == 0:  # the others never save
        with pytest.raises(ValueError, match="no filepath"):
            checkpoint._save_model(0, None, {"loss": 1.0})
    else:
        checkpoint._save_model(0, None, {"loss": 1.0})
