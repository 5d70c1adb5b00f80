"""Horovod's Keras MNIST script in Horovod's idiom, on synthetic data: a ``Sequential`` without ``Input`` (built
by the first batch), ``fit`` with Horovod's four callbacks. The PacTrain lines: the optimizer, and the
``ptk.callbacks.`` prefix. The Keras 3 line: ``compile`` without ``experimental_run_tf_function``. Horovod's
checkpoints the whole model (``.h5``); this one the weights (``.weights.h5``), which is quicker.

    horovodrun -np 2 -H localhost:2 --gloo python tests/horovod_scripts/keras_fit.py
"""

import tempfile

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

# Each rank its own shard of a small synthetic "MNIST"; the model is built by its first batch.
dataset = synthetic_mnist(hvd.rank())
mnist_model = build_mnist_model()

# Horovod: adjust learning rate based on number of GPUs.
scaled_lr = 0.001 * hvd.size()
opt = tf.optimizers.Adam(scaled_lr)

# Horovod: add Horovod DistributedOptimizer (PacTrain: ours, pruning to 75 % by step 12).
opt = ptk.DistributedOptimizer(opt, sparsity=0.75, begin_step=0, end_step=12, frequency=4)

mnist_model.compile(loss=tf.losses.SparseCategoricalCrossentropy(), optimizer=opt, metrics=["accuracy"])

callbacks = [
    # Horovod: broadcast initial variable states from rank 0 to all other processes.
    ptk.callbacks.BroadcastGlobalVariablesCallback(0),
    # Horovod: average metrics among workers at the end of every epoch.
    ptk.callbacks.MetricAverageCallback(),
    # Horovod: using `lr = 1.0 * hvd.size()` from the very beginning leads to worse final accuracy.
    ptk.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=2, verbose=1),
    # After the warm-up, halve the learning rate every epoch (scaled_lr * 0.5 ** (epoch - 2)).
    ptk.callbacks.LearningRateScheduleCallback(initial_lr=scaled_lr, multiplier=0.5, start_epoch=2),
]

# Horovod: save checkpoints only on worker 0 to prevent other workers from corrupting them.
checkpoints = tempfile.mkdtemp()
if hvd.rank() == 0:
    callbacks.append(tf.keras.callbacks.ModelCheckpoint(checkpoints + "/checkpoint-{epoch}.weights.h5",
                                                        save_weights_only=True))

# Horovod: write logs on worker 0.
verbose = 1 if hvd.rank() == 0 else 0

history = mnist_model.fit(dataset, steps_per_epoch=16 // hvd.size(), callbacks=callbacks, epochs=4, verbose=verbose)

# The checks (not Horovod's script).
from checks import check, ranks_agree  # noqa: E402

lr = history.history["lr"]
if not np.allclose(lr[1:], [scaled_lr, scaled_lr, scaled_lr * 0.5]) or not lr[0] < scaled_lr:
    raise AssertionError(f"learning rates per epoch {lr}: expected the warm-up to reach {scaled_lr} in epoch 2, "
                         "and half of it in epoch 4")
ranks_agree({key: np.array(values) for key, values in history.history.items()}, "averaged metrics")
check("keras_fit.py", mnist_model.trainable_variables, opt.masks(), 0.75, optimizer_variables(opt))
