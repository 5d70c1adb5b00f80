"""Fashion-MNIST with Keras 3, Horovod and PacTrain.

Horovod's ``examples/tensorflow2/tensorflow2_keras_mnist.py`` on Fashion-MNIST, written for
Keras 3 (TF's default since 2.16). The PacTrain change is the optimizer line; the callbacks come from
``pactrain_hvd.tensorflow.keras.callbacks`` because Horovod's fail on Keras 3 variables. Run::

    horovodrun -np 2 -H localhost:2 --gloo .venv/bin/python examples/tensorflow2_keras_fashion_mnist.py

Data: Debian's ``dataset-fashion-mnist`` package (``apt-get install dataset-fashion-mnist``).
"""

from __future__ import annotations

import argparse
import json
import os

from example_support.quiet_start import import_tensorflow  # noqa: E402

import_tensorflow()  # TF as it starts, without the CUDA probe's error lines on machines with no GPU

import horovod.tensorflow.keras as hvd  # noqa: E402
import tensorflow as tf  # noqa: E402

import pactrain_hvd.tensorflow.keras as ptk  # noqa: E402
from example_support.data import load_fashion_mnist  # noqa: E402
from example_support.progress import Progress  # noqa: E402


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Keras 3 Fashion-MNIST with Horovod + PacTrain",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--steps-per-epoch", type=int, default=100, help="steps per epoch on each worker")
    parser.add_argument("--batch-size", type=int, default=64, help="batch size per worker")
    parser.add_argument("--lr", type=float, default=0.001, help="Adam learning rate per worker (scaled by workers)")
    parser.add_argument("--sparsity", type=float, default=0.9, help="final PacTrain sparsity; 0 is plain Horovod")
    parser.add_argument("--fp16", action="store_true", help="fp16 values on the wire (hvd.Compression.fp16)")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per worker")
    parser.add_argument("--data-dir", default=None, help="folder with the IDX .gz files (default: Debian's)")
    parser.add_argument("--logdir", default="runs/keras_fashion_mnist", help="TensorBoard folder ('' for none)")
    parser.add_argument("--result-json", default=None, help="write the final metrics here (rank 0)")
    return parser.parse_args()


class WireScalars(tf.keras.callbacks.Callback):
    """TensorBoard scalars of PacTrain's last step at the end of every epoch: sparsity, wire bytes, ratio."""

    def __init__(self, logdir: str) -> None:
        super().__init__()
        self.writer = tf.summary.create_file_writer(os.path.join(logdir, "pactrain"))

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        stats = self.model.optimizer.stats()
        with self.writer.as_default(step=epoch):
            tf.summary.scalar("sparsity", stats["sparsity"])
            tf.summary.scalar("wire_bytes_per_step", stats["sent_bytes"])
            tf.summary.scalar("dense_bytes_per_step", stats["dense_bytes"])
            tf.summary.scalar("compression_ratio", stats["compression_ratio"])


class RankZeroProgress(tf.keras.callbacks.Callback):
    """Rank 0's progress (``example_support.progress``), then one line per epoch of the averaged metrics.

    Instead of Keras's own bar (``verbose=1``), whose carriage-return redraws come out of
    ``horovodrun`` as fragments. Place it after ``MetricAverageCallback``.
    """

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self.bar = Progress(total=self.params["steps"], desc=f"epoch {epoch + 1}", enabled=hvd.rank() == 0)

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if logs and "loss" in logs:
            self.bar.set_postfix(loss=f"{float(logs['loss']):.3f}")
        self.bar.update()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.bar.close()
        if hvd.rank() == 0:
            print(f"epoch {epoch + 1}: " + ", ".join(f"{key} {float(value):.4f}" for key, value in (logs or {}).items()),
                  flush=True)


args = parse_args()
hvd.init()
tf.config.threading.set_intra_op_parallelism_threads(args.threads)
for gpu in tf.config.experimental.list_physical_devices("GPU"):
    tf.config.experimental.set_memory_growth(gpu, True)
gpus = tf.config.experimental.list_physical_devices("GPU")
if gpus:
    tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")

images, labels = load_fashion_mnist("train", args.data_dir)
dataset = tf.data.Dataset.from_tensor_slices((tf.cast(images[..., tf.newaxis] / 255.0, tf.float32),
                                              tf.cast(labels, tf.int64)))
dataset = dataset.repeat().shuffle(10000, seed=hvd.rank()).batch(args.batch_size)
test_images, test_labels = load_fashion_mnist("test", args.data_dir)

model = tf.keras.Sequential([
    tf.keras.Input((28, 28, 1)),
    tf.keras.layers.Conv2D(32, [3, 3], activation="relu"),
    tf.keras.layers.Conv2D(64, [3, 3], activation="relu"),
    tf.keras.layers.MaxPooling2D(pool_size=(2, 2)),
    tf.keras.layers.Dropout(0.25),
    tf.keras.layers.Flatten(),
    tf.keras.layers.Dense(128, activation="relu"),
    tf.keras.layers.Dropout(0.5),
    tf.keras.layers.Dense(10, activation="softmax"),
])

# Horovod: scale the learning rate by the number of workers.
scaled_lr = args.lr * hvd.size()
opt = tf.keras.optimizers.Adam(scaled_lr)

# Horovod: add Horovod DistributedOptimizer. PacTrain: this line is the change
# (plain Horovod: opt = hvd.DistributedOptimizer(opt, compression=compression)).
total_steps = args.epochs * args.steps_per_epoch
compression = hvd.Compression.fp16 if args.fp16 else hvd.Compression.none
opt = ptk.DistributedOptimizer(opt, compression=compression, sparsity=args.sparsity, begin_step=total_steps // 10,
                               end_step=total_steps * 6 // 10, frequency=max(1, total_steps // 20))

# Horovod's ops have no XLA kernels: keep the step out of XLA (Keras 3 compiles on GPUs by default).
model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(), optimizer=opt, metrics=["accuracy"],
              jit_compile=False)

callbacks = [
    # Broadcast initial variable states (and PacTrain masks) from rank 0 to all other processes.
    ptk.callbacks.BroadcastGlobalVariablesCallback(0),
    # Average metrics among workers at the end of every epoch.
    ptk.callbacks.MetricAverageCallback(),
    RankZeroProgress(),
]

# Horovod: write logs on worker 0 only.
if hvd.rank() == 0 and args.logdir:
    callbacks += [tf.keras.callbacks.TensorBoard(args.logdir), WireScalars(args.logdir)]
model.fit(dataset, steps_per_epoch=args.steps_per_epoch, callbacks=callbacks, epochs=args.epochs, verbose=0,
          shuffle=False)  # the dataset is shuffled already (Keras warns otherwise)

loss, accuracy = model.evaluate(test_images[..., None] / 255.0, test_labels, batch_size=1000, verbose=0)
stats = opt.stats()
result = {"test_accuracy": float(accuracy), "test_loss": float(loss), "sparsity": stats["sparsity"],
          "sent_bytes_per_step": stats["sent_bytes"], "dense_bytes_per_step": stats["dense_bytes"],
          "compression_ratio": stats["compression_ratio"], "steps": opt.step_count, "workers": hvd.size()}
if hvd.rank() == 0:
    print(json.dumps(result, indent=2))
    if args.result_json:
        with open(args.result_json, "w", encoding="utf-8") as file:
            json.dump(result, file, indent=2)
