"""Worker for test_elastic.py: the Keras twin of ``elastic_worker.py`` (same timeline, events and files).

The elastic part is Horovod's documented pattern with one name changed: ``ptk.elastic.KerasState``
for ``hvd.elastic.KerasState``; ``@hvd.elastic.run`` and ``state.commit()`` are Horovod's. The
step is a ``tf.function`` around ``ptk.DistributedOptimizer.apply_gradients``.
"""

import os

import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf
from timeline import Timeline, fingerprint, parse_args

import pactrain_hvd.tensorflow.keras as ptk
from pactrain_hvd.tensorflow.pruning import variable_names

keras = tf.keras  # Keras 3, or tf-keras 2 under TF_USE_LEGACY_KERAS=1

args = parse_args()
hvd.init()
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"),
                          keras.layers.Dense(64, activation="relu"), keras.layers.Dense(4)])
opt = ptk.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9, weight_decay=1e-3), sparsity=0.9, ranking="layer",
                               begin_step=2, end_step=20, frequency=3, pack_min_numel=0, packed_values=args.packed_values)
loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


@tf.function
def apply(inputs: tf.Tensor, labels: tf.Tensor) -> None:
    with tf.GradientTape() as tape:
        loss = loss_fn(labels, model(inputs, training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))


def train_step(step: int) -> None:
    rng = np.random.default_rng(10_000 * hvd.rank() + step)
    apply(rng.normal(size=(16, 32)).astype(np.float32), rng.integers(0, 4, size=16))


def describe() -> dict:
    return dict(opt_step=opt.step_count, masks=fingerprint(opt.masks()), lanes=None)


timeline = Timeline(args, hvd, describe)
timeline.log("start", host=os.environ.get("HOROVOD_HOSTNAME"), rank=hvd.rank(), size=hvd.size())
state = ptk.elastic.KerasState(model, opt, step=0)
timeline.run(state, train_step)
timeline.save_final(state, dict(zip(variable_names(model.weights), (np.asarray(w) for w in model.weights))),
                    opt.masks(), opt.step_count)
