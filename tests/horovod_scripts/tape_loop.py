"""Horovod's TensorFlow 2 MNIST script in Horovod's idiom, on synthetic data: a ``tf.function`` step that wraps
the tape, a model built by its first call, the variables broadcast after the first batch. The PacTrain line:
the tape (with its pruning arguments). The Keras 3 line: ``opt.variables`` is a list, not a method.

    horovodrun -np 2 -H localhost:2 --gloo python tests/horovod_scripts/tape_loop.py
"""

import horovod.tensorflow as hvd
import tensorflow as tf
from mnist import build_mnist_model, synthetic_mnist

import pactrain_hvd.tensorflow as pt
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
loss = tf.losses.SparseCategoricalCrossentropy()

# Horovod: adjust learning rate based on number of GPUs.
opt = tf.optimizers.Adam(0.001 * hvd.size())

tapes = []  # for the checks at the end, not Horovod's


@tf.function
def training_step(images, labels, first_batch):
    with tf.GradientTape() as tape:
        probs = mnist_model(images, training=True)
        loss_value = loss(labels, probs)

    # Horovod: add Horovod Distributed GradientTape (PacTrain: ours, pruning to 75 % by step 12).
    tape = pt.DistributedGradientTape(tape, sparsity=0.75, begin_step=0, end_step=12, frequency=4, optimizer=opt)
    tapes.append(tape)

    grads = tape.gradient(loss_value, mnist_model.trainable_variables)
    opt.apply_gradients(zip(grads, mnist_model.trainable_variables))

    # Horovod: broadcast initial variable states from rank 0 to all other processes.
    # This is necessary to ensure consistent initialization of all workers when
    # training is started with random weights or restored from a checkpoint.
    #
    # Note: broadcast should be done after the first gradient step to ensure optimizer
    # initialization.
    if first_batch:
        hvd.broadcast_variables(mnist_model.variables, root_rank=0)
        hvd.broadcast_variables(opt.variables, root_rank=0)  # Horovod's: opt.variables()

    return loss_value


# Horovod: adjust number of steps based on number of GPUs.
for batch, (images, labels) in enumerate(dataset.take(40 // hvd.size())):
    loss_value = training_step(images, labels, batch == 0)

    if batch % 10 == 0 and hvd.local_rank() == 0:
        print(f"Step #{batch}\tLoss: {float(loss_value):.6f}")

# The checks (not Horovod's script).
from checks import check  # noqa: E402

state = tapes[-1].pactrain_state
if state.step_count != 40 // hvd.size():
    raise AssertionError(f"tape_loop.py: {state.step_count} reductions, expected {40 // hvd.size()}")
check("tape_loop.py", mnist_model.trainable_variables, state.masks(), 0.75, optimizer_variables(opt))
