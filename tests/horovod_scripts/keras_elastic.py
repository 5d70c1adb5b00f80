"""Horovod's elastic Keras MNIST script in Horovod's idiom, on synthetic data: a ``Sequential`` without ``Input``
(built by the first batch), ``hvd.elastic.run`` around ``fit``, Horovod's three elastic callbacks, no broadcast
callback (the state's sync broadcasts). The PacTrain lines: the optimizer, and ``ptk.elastic.KerasState`` for
``hvd.elastic.KerasState``. The Keras 3 lines: ``compile`` without ``experimental_run_tf_function``, and the reset
callback assigns ``optimizer.learning_rate`` (Keras 3's backend has no ``set_value``).

    horovodrun -np 2 -H localhost:2 --gloo python tests/horovod_scripts/keras_elastic.py
"""

import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf
from mnist import build_mnist_model, synthetic_mnist

import pactrain_hvd.tensorflow.keras as ptk
from pactrain_hvd.tensorflow.pruning import optimizer_variables

# Horovod: initialize Horovod.
hvd.init()

# Horovod: pin GPU to be used to process local rank (one GPU per process).
gpus = tf.config.experimental.list_physical_devices("GPU")
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
    tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")

# Each rank its own shard of a small synthetic "MNIST"; the model is built by its first batch, from each rank's
# own random initial weights (no common seed): the state's broadcast has to make them equal.
dataset = synthetic_mnist(hvd.rank())
model = build_mnist_model()

# Horovod: adjust learning rate based on number of GPUs.
lr = 0.001
scaled_lr = lr * hvd.size()
opt = tf.optimizers.Adam(scaled_lr)

# Horovod: add Horovod DistributedOptimizer (PacTrain: ours, pruning to 80 % from the first step).
opt = ptk.DistributedOptimizer(opt, sparsity=0.8, begin_step=0, end_step=10, frequency=5)

model.compile(loss=tf.losses.SparseCategoricalCrossentropy(), optimizer=opt, metrics=["accuracy"])


def on_state_reset():
    # Horovod: scale the learning rate to the new number of workers.
    state.model.optimizer.learning_rate.assign(lr * hvd.size())


# Horovod: the state to commit, restore and broadcast (PacTrain: ours, which also carries masks and schedule).
state = ptk.elastic.KerasState(model, batch=0, epoch=0)
state.register_reset_callbacks([on_state_reset])

callbacks = [
    # Horovod: elastic training callbacks to update and commit the state.
    hvd.elastic.CommitStateCallback(state, batches_per_commit=2),
    hvd.elastic.UpdateBatchStateCallback(state),
    hvd.elastic.UpdateEpochStateCallback(state),
]

# Horovod: write logs on worker 0.
verbose = 1 if hvd.rank() == 0 else 0


@hvd.elastic.run
def train(state):
    state.model.fit(dataset, steps_per_epoch=16 // hvd.size(), epochs=3 - state.epoch, callbacks=callbacks,
                    verbose=verbose)


train(state)

# The checks (not Horovod's script).
from checks import check, ranks_agree  # noqa: E402

if state.epoch != 3 or opt.step_count != 3 * (16 // hvd.size()):
    raise AssertionError(f"state.epoch {state.epoch}, optimizer step {opt.step_count}: expected 3 epochs of "
                         f"{16 // hvd.size()} steps")
# A rollback to the last commit keeps ranks equal and pruned zeros zero.
state.restore()
ranks_agree({"epoch": np.array(state.epoch)}, "restored epoch")
check("keras_elastic.py", model.trainable_variables, opt.masks(), 0.8, optimizer_variables(opt))
