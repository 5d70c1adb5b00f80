"""PacTrainState, pruning helpers and the Keras optimizer in one process: arguments, slots, checkpoints."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import horovod.tensorflow as hvd  # noqa: E402
import keras  # noqa: E402 - Keras 3, whatever TF_USE_LEGACY_KERAS says
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402

import pactrain_hvd.tensorflow as pt  # noqa: E402
import pactrain_hvd.tensorflow.keras as ptk  # noqa: E402
from pactrain_hvd.core import num_to_keep  # noqa: E402
from pactrain_hvd.tensorflow.pruning import optimizer_slots, select_prunable, variable_names  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def horovod():
    hvd.init()


def small_model(api=keras):
    api.utils.set_random_seed(0)
    return api.Sequential([api.Input((6,)), api.layers.Dense(80, name="hidden"), api.layers.Dense(3, name="out")])


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(sparsity=1.0), ValueError, "sparsity must be in"),
    (dict(frequency=0), ValueError, "frequency"),
    (dict(op=hvd.Adasum), ValueError, "op="),
    (dict(op=hvd.Sum, gradient_predivide_factor=2.0), ValueError, "gradient_predivide_factor"),
    (dict(groups=0), ValueError, "groups"),
    (dict(groups=[1, 2]), ValueError, "groups"),
    (dict(compression=object()), TypeError, "compression"),
    (dict(process_set="all"), TypeError, "process_set"),
    (dict(prunable="hidden*"), TypeError, "prunable"),
    (dict(packed_values="int8"), ValueError, "packed_values must be one of 'inherit', 'fp16', 'bf16', 'ternary', 'int3', got 'int8'"),
])
def test_state_rejects_bad_arguments_before_communicating(kwargs, error, message):
    with pytest.raises(error, match=message):
        pt.PacTrainState(**kwargs)


def test_keras_optimizer_and_tape_reject_bad_arguments():
    with pytest.raises(ValueError, match="op currently only supports Average and Sum"):
        ptk.DistributedOptimizer(keras.optimizers.SGD(), op=hvd.Min)
    with pytest.raises(ValueError, match="backward_passes_per_step must be an int > 0, got 0"):
        ptk.DistributedOptimizer(keras.optimizers.SGD(), backward_passes_per_step=0)
    with pytest.raises(TypeError, match="average_aggregated_gradients must be a bool"):
        ptk.DistributedOptimizer(keras.optimizers.SGD(), backward_passes_per_step=2, average_aggregated_gradients=1)
    with pytest.raises(TypeError, match="Keras 3 or tf-keras optimizer"):
        ptk.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1))
    with pytest.raises(TypeError, match="already"):
        ptk.DistributedOptimizer(ptk.DistributedOptimizer(keras.optimizers.SGD()))
    with pytest.raises(TypeError, match="unexpected keyword argument 'sparsty'"):
        ptk.DistributedOptimizer(keras.optimizers.SGD(), sparsty=0.5)
    state = pt.PacTrainState()
    with tf.GradientTape() as tape:
        pass
    with pytest.raises(ValueError, match="sparsity, compression must be left unset|compression, sparsity"):
        pt.DistributedGradientTape(tape, compression=hvd.Compression.fp16, state=state, sparsity=0.5)
    with pytest.raises(TypeError, match="gradtape"):
        pt.DistributedGradientTape(object())


def test_distributed_optimizer_is_a_subclassable_subclass_with_the_same_config():
    base = keras.optimizers.Adam(learning_rate=0.01, beta_1=0.8)
    opt = ptk.DistributedOptimizer(base, sparsity=0.5, ranking="layer")
    assert isinstance(opt, keras.optimizers.Adam) and type(opt).__name__ == "Adam"
    assert opt.get_config() == base.get_config()
    assert type(ptk.DistributedOptimizer(keras.optimizers.Adam())) is type(opt)  # one class per optimizer class

    class Custom(type(opt)):
        def apply(self, grads, trainable_variables=None):  # subclassing the result must not recurse
            return super().apply(grads, trainable_variables)

    model = small_model()
    custom = Custom.from_config(base.get_config())
    custom.pactrain_state = pt.PacTrainState(sparsity=0.5, ranking="layer", begin_step=0, end_step=0, optimizer=custom)
    x = tf.ones((4, 6))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(x))
    custom.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    assert len(custom.masks()) == 2 and all(name.endswith("kernel") for name in custom.masks())


def test_names_and_prunable_selection():
    a, b, c = tf.Variable(tf.ones((2, 2)), name="w"), tf.Variable(tf.ones((2, 2)), name="w"), tf.Variable(1.0, name="b")
    assert variable_names([a, b, c]) == ["w:0", "w:0#1", "b:0"]
    named = dict(zip(variable_names([a, b, c]), [a, b, c]))
    assert select_prunable(named, None) == ["w:0", "w:0#1"]
    assert select_prunable(named, ["w:0#*"]) == ["w:0#1"]
    assert select_prunable(named, lambda name, v: v.shape.rank == 0) == ["b:0"]


@pytest.mark.parametrize("make", [
    lambda: keras.optimizers.SGD(momentum=0.9), lambda: keras.optimizers.Adam(amsgrad=True),
    lambda: keras.optimizers.RMSprop(momentum=0.5, centered=True), lambda: keras.optimizers.Adafactor(),
    lambda: tf_keras.optimizers.SGD(momentum=0.9), lambda: tf_keras.optimizers.Adam(),
    lambda: tf_keras.optimizers.legacy.Adam(),
], ids=["k3-sgd", "k3-adam-amsgrad", "k3-rmsprop", "k3-adafactor", "tfk-sgd", "tfk-adam", "tfk-legacy-adam"])
def test_optimizer_slots_finds_per_coordinate_state(make):
    optimizer = make()
    api = keras if hasattr(type(optimizer), "stateless_apply") else tf_keras
    model = small_model(api)
    variables = model.trainable_variables
    if hasattr(optimizer, "get_slot_names"):
        optimizer._create_all_weights(variables)
    else:
        optimizer.build(variables)
    kernel = variables[0]
    slots = optimizer_slots(optimizer, kernel)
    expected = {"SGD": 1, "Adam": 3 if getattr(optimizer, "amsgrad", False) else 2, "RMSprop": 3, "Adafactor": 1}
    assert len(slots) == expected[type(optimizer).__name__], [s.name for s in slots]
    assert all(s.shape == kernel.shape for s in slots)
    assert optimizer_slots(None, kernel) == []


def test_single_process_state_masks_packs_and_checkpoints(monkeypatch):
    monkeypatch.setenv("HOROVOD_ELASTIC", "1")  # one process communicates only under elastic (as Horovod)
    model = small_model()
    opt = keras.optimizers.SGD(0.1, momentum=0.9)
    state = pt.PacTrainState(sparsity=0.75, ranking="layer", begin_step=0, end_step=0, pack_min_numel=300, optimizer=opt)
    x = tf.random.stateless_normal((8, 6), seed=(0, 1))
    for _ in range(2):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(model(x) ** 2)
        grads = pt.DistributedGradientTape(tape, state=state).gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
    masks = state.masks()
    names = variable_names(model.trainable_variables)
    assert set(masks) == {names[0], names[2]}
    assert all(int(mask.sum()) == num_to_keep(mask.size, 0.75) for mask in masks.values())
    stats = state.stats()
    assert stats["step"] == 1 and state.step_count == 2
    hidden = stats["tensors"][names[0]]
    assert hidden["packed"] and hidden["sent_bytes"] == 4 * int(masks[names[0]].sum())
    out = stats["tensors"][names[2]]
    assert not out["packed"] and out["sent_bytes"] == 4 * 240  # below pack_min_numel: dense, masked
    for grad, name in zip(grads, names):
        if name in masks:
            assert np.all(grad.numpy()[~masks[name]] == 0)

    blob = state.serialize()
    saved_settings = dict(sparsity=0.75, ranking="layer", begin_step=0, end_step=0)
    with pytest.raises(pt.CheckpointError, match=r"other PacTrain settings \(end_step 0 -> 1000"):
        pt.PacTrainState(sparsity=0.75, ranking="layer").deserialize(blob)
    with pytest.warns(pt.ChangedSettingsWarning, match="masks only shrink"):
        pt.PacTrainState(sparsity=0.75, ranking="layer", resume_changed_settings=True).deserialize(blob)
    fresh = pt.PacTrainState(**saved_settings)
    fresh.deserialize(blob)
    assert fresh.step_count == 2 and all(np.array_equal(fresh.masks()[n], m) for n, m in masks.items())
    fresh.bind(small_model().trainable_variables)  # same layer names under another model prefix
    assert [int(m.sum()) for m in fresh.masks().values()] == [int(m.sum()) for m in masks.values()]
    with pytest.raises(pt.CheckpointError, match="not a PacTrain state"):
        fresh.deserialize(b"not npz")
    shallow = pt.PacTrainState(**saved_settings)
    shallow.bind(keras.Sequential([keras.Input((6,)), keras.layers.Dense(80)]).trainable_variables)
    with pytest.raises(pt.CheckpointError, match="only 2 variables are bound"):
        shallow.deserialize(blob)
    with pytest.raises(ValueError, match="not prunable here"):
        state.set_masks({"nope": np.ones(3, bool)})


@pytest.mark.parametrize("values", ["inherit", "ternary"])
def test_one_process_communicates_nothing_and_still_prunes(values, monkeypatch):
    """Horovod reduces only with another rank (or under elastic): the local gradient, pruned, never quantised."""
    for collective in ("allreduce", "grouped_allreduce", "allgather", "broadcast_object"):
        monkeypatch.setattr(hvd, collective, lambda *args, _name=collective, **kwargs: pytest.fail(f"hvd.{_name}"))
    model = small_model()
    opt = keras.optimizers.SGD(0.1, momentum=0.9)
    state = pt.PacTrainState(sparsity=0.75, ranking="layer", begin_step=0, end_step=2, frequency=1, pack_min_numel=0, verify_every=1,
                             packed_values=values, optimizer=opt)
    names = variable_names(model.trainable_variables)

    @tf.function(autograph=False)
    def step(x):
        with tf.GradientTape(persistent=True) as tape:
            loss = tf.reduce_mean(model(x) ** 2)
        local = tape.gradient(loss, model.trainable_variables)
        grads = pt.DistributedGradientTape(tape, state=state).gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return local, grads

    for number in range(4):
        local, grads = step(tf.random.stateless_normal((8, 6), seed=(number, 1)))
        masks = state.masks()
        for name, plain, ours in zip(names, local, grads):
            expected = np.where(masks[name], plain.numpy(), 0) if name in masks else plain.numpy()
            np.testing.assert_array_equal(ours.numpy(), expected, err_msg=f"{name}, step {number}")
    assert state.step_count == 4 and state.stats()["sent_bytes"] == 0
    assert sorted(masks) == [names[0], names[2]]
    for name, variable in zip(names, model.trainable_variables):
        if name in masks:
            assert int(masks[name].sum()) == num_to_keep(masks[name].size, 0.75)
            assert not variable.numpy()[~masks[name]].any()
    pt.broadcast_masks(state)  # nothing to broadcast to


def test_values_is_the_deprecated_name_of_packed_values():
    """As in torch: ``values=`` and its ``"fp32"`` keep working with a DeprecationWarning at the caller."""
    for kwargs, packed in ((dict(values="fp32"), "inherit"), (dict(values="ternary"), "ternary"),
                           (dict(packed_values="fp32"), "inherit")):
        with pytest.warns(DeprecationWarning, match="deprecated") as caught:
            state = pt.PacTrainState(**kwargs)
        assert state.reduction.packed_values == packed and caught[0].filename == __file__
    with pytest.warns(DeprecationWarning, match="values= is deprecated"):
        opt = ptk.DistributedOptimizer(keras.optimizers.SGD(), values="fp16")
    assert opt.pactrain_state.reduction.packed_values == "fp16"
    with pytest.raises(ValueError, match="not both"):
        pt.PacTrainState(packed_values="fp16", values="fp16")
    with pytest.warns(DeprecationWarning) as caught:  # read once by the tape, not again when it checks its state
        pt.DistributedGradientTape(tf.GradientTape(), packed_values="fp32")
    assert len(caught) == 1 and caught[0].filename == __file__
