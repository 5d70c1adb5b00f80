"""Multi-rank TensorFlow tests, run under ``horovodrun -np 2`` once per Keras (3, then tf-keras 2):

    horovodrun -np 2 -H localhost:2 --gloo python -m pytest tests/parallel/tensorflow
    TF_USE_LEGACY_KERAS=1 horovodrun -np 2 -H localhost:2 --gloo python -m pytest tests/parallel/tensorflow

The tests use ``tf.keras``, which that variable points at Keras 3 or tf-keras 2. Every
assertion is reached by every rank: values are compared after an allgather.
"""

import itertools
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import horovod.tensorflow as hvd  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
from horovod.runner.common.util.env import get_env_rank_and_size  # noqa: E402

import pactrain_hvd.tensorflow as pt  # noqa: E402
from pactrain_hvd.tensorflow.pruning import backing_variable, variable_names  # noqa: E402

LEGACY_KERAS = os.environ.get("TF_USE_LEGACY_KERAS", "0").lower() in ("1", "true", "yes")
keras = tf.keras
# Two ranks share two cores: one compute thread each (set before TF runs any op).
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(2)
_check_names = itertools.count()
# Registered at init, as in Horovod's process-set tests: with 2 ranks, rank 0 alone and rank 1 outside.
EVEN_RANKS = hvd.ProcessSet(list(range(0, get_env_rank_and_size()[1], 2)))


@pytest.fixture(scope="session", autouse=True)
def horovod():
    hvd.init(process_sets=[EVEN_RANKS])
    assert hvd.size() >= 2, "run these tests under horovodrun -np 2"
    assert keras.__name__.startswith("tf_keras") == LEGACY_KERAS, f"tf.keras is {keras.__name__}"
    yield hvd


def make_model(seed: int = 0):
    """Two convolutions (one below, one above the default packing size) and a dense head with a bias."""
    keras.utils.set_random_seed(seed)
    return keras.Sequential([
        keras.Input((8, 8, 3)),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(10),
    ])


def batch(step: int, size: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """Different data on every rank and step."""
    rng = np.random.default_rng(1000 * hvd.rank() + step)
    return rng.normal(size=(size, 8, 8, 3)).astype(np.float32), rng.integers(0, 10, size=size)


def batches(steps: int, start: int = 0, size: int = 8) -> tuple[np.ndarray, np.ndarray]:
    parts = [batch(step, size) for step in range(start, start + steps)]
    return np.concatenate([x for x, _ in parts]), np.concatenate([y for _, y in parts])


def compiled(model, opt):
    model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def fit(model, steps, start=0, callbacks=()):
    x, y = batches(steps, start)
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=list(callbacks))


def loss_fn(labels, logits):
    return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))


def tape_step(model, opt, state):
    """Horovod's TF2 example loop, one line changed: the tape is wrapped on every step, the state carries over."""

    @tf.function(autograph=False)
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        tape = pt.DistributedGradientTape(tape, state=state)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return grads

    return step


def horovod_idiom_step(model, opt, wrap):
    """Horovod's TF2 example step: ``tape = wrap(tape)`` inside the tf.function; the wrapped tapes are kept."""
    tapes = []

    @tf.function(autograph=False)
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        tape = wrap(tape)
        tapes.append(tape)
        sources = [backing_variable(v) for v in model.trainable_variables]  # Horovod's tape needs tf.Variable.ref
        grads = tape.gradient(loss, sources)
        opt.apply_gradients(zip(grads, model.trainable_variables))

    return step, tapes


def counting_verifications(state) -> list:
    """The schedule steps at which ``state`` ran the Mask Tracker."""
    steps, verify = [], state.bound.pruner.verify

    def counted(step, *args, **kwargs):
        steps.append(step)
        return verify(step, *args, **kwargs)

    state.bound.pruner.verify = counted
    return steps


def named(variables) -> dict:
    """``{name: tf.Variable}`` under the names PacTrain uses (Keras 3 paths or TF names)."""
    return dict(zip(variable_names(variables), (backing_variable(v) for v in variables)))


def gathered_equal(tensors: dict) -> dict:
    """``{name: True if every rank holds bitwise the same values}``, computed on every rank."""
    verdict = {}
    for name, tensor in tensors.items():
        flat = tf.reshape(tf.convert_to_tensor(tensor), [1, -1])
        gathered = hvd.allgather(flat, name=f"check.{next(_check_names)}").numpy()
        verdict[name] = all(np.array_equal(gathered[0], gathered[r]) for r in range(1, hvd.size()))
    return verdict


def assert_same_on_all_ranks(tensors: dict, what: str = "variable") -> None:
    different = [name for name, same in gathered_equal(tensors).items() if not same]
    assert not different, f"{what}s differ between ranks: {different}"
