"""Horovod's Keras synthetic benchmark in Horovod's idiom, with a tiny model: ``fit`` on one cached random
batch, images per second from a timing callback. The PacTrain lines: the optimizer (sparse from the first
step, packed values as ternary codes) and the callback's prefix. The Keras 3 line: ``compile`` without
``experimental_run_tf_function``.

    horovodrun -np 2 -H localhost:2 --gloo python tests/horovod_scripts/keras_synthetic_benchmark.py --fp16-allreduce
"""

import argparse
import sys
from timeit import default_timer as timer

import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf

import pactrain_hvd.tensorflow as pt
import pactrain_hvd.tensorflow.keras as ptk
from pactrain_hvd.tensorflow.pruning import optimizer_variables

# Benchmark settings
parser = argparse.ArgumentParser(description="TensorFlow Synthetic Benchmark",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument("--fp16-allreduce", action="store_true", default=False, help="use fp16 compression during allreduce")
parser.add_argument("--batch-size", type=int, default=8, help="input batch size")
parser.add_argument("--num-warmup-batches", type=int, default=2, help="number of warm-up batches that don't count")
parser.add_argument("--num-batches-per-iter", type=int, default=4, help="number of batches per benchmark iteration")
parser.add_argument("--num-iters", type=int, default=3, help="number of benchmark iterations")
args = parser.parse_args(sys.argv[1:] or ["--fp16-allreduce"])

# Horovod: initialize Horovod.
hvd.init()

# Horovod: pin GPU to be used to process local rank (one GPU per process).
gpus = tf.config.experimental.list_physical_devices("GPU")
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
    tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")

# A tiny stand-in for keras.applications' models (built: it has an Input).
tf.keras.utils.set_random_seed(hvd.rank())  # ranks start apart; the callback gives them rank 0's weights
model = tf.keras.Sequential([
    tf.keras.Input((16, 16, 3)),
    tf.keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
    tf.keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
    tf.keras.layers.GlobalAveragePooling2D(),
    tf.keras.layers.Dense(100),
])
opt = tf.optimizers.SGD(0.01)

# Horovod: (optional) compression algorithm.
compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none

# Horovod: add Horovod DistributedOptimizer (PacTrain: ours, 90 % pruned from the first step).
opt = ptk.DistributedOptimizer(opt, compression=compression, schedule=pt.ConstantSparsity(0.9),
                               packed_values="ternary", pack_min_numel=0)

model.compile(loss=tf.losses.SparseCategoricalCrossentropy(from_logits=True), optimizer=opt)

callbacks = [
    # Horovod: broadcast initial variable states from rank 0 to all other processes.
    ptk.callbacks.BroadcastGlobalVariablesCallback(0),
]


class TimingCallback(tf.keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.img_secs = []

    def on_epoch_begin(self, epoch, logs=None):
        self.starttime = timer()

    def on_epoch_end(self, epoch, logs=None):
        time = timer() - self.starttime
        img_sec = args.batch_size * args.num_batches_per_iter / time
        print("Iter #%d: %.1f img/sec per %s" % (epoch, img_sec, "GPU" if gpus else "CPU"))  # noqa: UP031
        # skip warm up epoch
        if epoch > 0:
            self.img_secs.append(img_sec)

    def on_train_end(self, logs=None):
        img_sec_mean = np.mean(self.img_secs)
        img_sec_conf = 1.96 * np.std(self.img_secs)
        print("Img/sec per %s: %.1f +-%.1f" % ("GPU" if gpus else "CPU", img_sec_mean, img_sec_conf))  # noqa: UP031
        print("Total img/sec on %d %s(s): %.1f +-%.1f" %  # noqa: UP031
              (hvd.size(), "GPU" if gpus else "CPU", hvd.size() * img_sec_mean, hvd.size() * img_sec_conf))


# Horovod: write logs on worker 0.
verbose = 1 if hvd.rank() == 0 else 0
if hvd.rank() == 0:
    timing = TimingCallback()
    callbacks.append(timing)

# Synthetic dataset
data = tf.random.uniform([args.batch_size, 16, 16, 3])
target = tf.random.uniform([args.batch_size, 1], minval=0, maxval=99, dtype=tf.int64)
dataset = tf.data.Dataset.from_tensor_slices((data, target)).cache().repeat().batch(args.batch_size)

# Train the model.
model.fit(dataset, steps_per_epoch=args.num_batches_per_iter, callbacks=callbacks,
          epochs=args.num_iters, verbose=verbose)

# The checks (not Horovod's script).
from checks import check  # noqa: E402

if opt.stats()["values"] != "ternary" or not any(t["packed"] for t in opt.stats()["tensors"].values()):
    raise AssertionError(f"keras_synthetic_benchmark.py: expected packed ternary values, got {opt.stats()}")
check("keras_synthetic_benchmark.py", model.trainable_variables, opt.masks(), 0.9, optimizer_variables(opt))
