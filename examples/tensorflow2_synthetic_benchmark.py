"""Synthetic TF2 benchmark: Horovod's ``tensorflow2_synthetic_benchmark.py`` with PacTrain.

Same flags and output as Horovod's script (a ``keras.applications`` model on random data, images/sec
per iteration and their mean +- 1.96 std), plus ``--sparsity`` and the wire bytes per step. The
PacTrain change is the tape line. Run::

    horovodrun -np 2 -H localhost:2 --gloo .venv/bin/python examples/tensorflow2_synthetic_benchmark.py \\
        --model ResNet50 --batch-size 32
    mpirun -np 2 .venv/bin/python examples/tensorflow2_synthetic_benchmark.py --model MobileNetV2 --batch-size 16
"""

from __future__ import annotations

import argparse
import timeit

from example_support.quiet_start import import_tensorflow  # noqa: E402

import_tensorflow()  # TF as it starts, without the CUDA probe's error lines on machines with no GPU

import horovod.tensorflow as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import pactrain_hvd.tensorflow as pt  # noqa: E402
from example_support.progress import Progress  # noqa: E402
from pactrain_hvd.tensorflow.pruning import backing_variable  # noqa: E402

parser = argparse.ArgumentParser(description="TensorFlow Synthetic Benchmark with PacTrain",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument("--fp16-allreduce", "--fp16", dest="fp16", action="store_true", help="fp16 values on the wire")
parser.add_argument("--model", type=str, default="ResNet50", help="a keras.applications model")
parser.add_argument("--batch-size", type=int, default=32, help="input batch size per worker")
parser.add_argument("--image-size", type=int, default=224, help="input height and width")
parser.add_argument("--num-warmup-batches", type=int, default=10, help="number of warm-up batches that don't count")
parser.add_argument("--num-batches-per-iter", type=int, default=10, help="number of batches per benchmark iteration")
parser.add_argument("--num-iters", type=int, default=10, help="number of benchmark iterations")
parser.add_argument("--sparsity", type=float, default=0.9, help="PacTrain sparsity, pruned once at step 0; 0: Horovod")
parser.add_argument("--threads", type=int, default=0, help="CPU threads per worker (0: TensorFlow's choice)")
parser.add_argument("--logdir", default="", help="TensorBoard folder ('' for none)")
args = parser.parse_args()

hvd.init()
if args.threads:
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
gpus = tf.config.experimental.list_physical_devices("GPU")
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
    tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")

model = getattr(tf.keras.applications, args.model)(weights=None, input_shape=(args.image_size, args.image_size, 3))
opt = tf.keras.optimizers.SGD(0.01)
loss_fn = tf.keras.losses.SparseCategoricalCrossentropy()
state = pt.PacTrainState(compression=hvd.Compression.fp16 if args.fp16 else hvd.Compression.none,
                         sparsity=args.sparsity, begin_step=0, end_step=0, optimizer=opt)

data = tf.random.uniform([args.batch_size, args.image_size, args.image_size, 3])
target = tf.random.uniform([args.batch_size, 1], minval=0, maxval=999, dtype=tf.int64)


@tf.function(autograph=False)
def benchmark_step() -> None:
    with tf.GradientTape() as tape:
        loss = loss_fn(target, model(data, training=True))
    # Horovod: add Horovod Distributed GradientTape. PacTrain: this line is the change.
    tape = pt.DistributedGradientTape(tape, state=state)
    gradients = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(gradients, model.trainable_variables))


def log(text: str) -> None:
    if hvd.rank() == 0:
        print(text, flush=True)


# Horovod: every rank starts from rank 0's weights (PacTrain computes its masks from them).
hvd.broadcast_variables([backing_variable(v) for v in model.variables], root_rank=0)
device = "GPU" if gpus else "CPU"
log(f"Model: {args.model}")
log(f"Batch size: {args.batch_size}")
log(f"Number of {device}s: {hvd.size()}")
log("Running warmup...")
timeit.timeit(benchmark_step, number=args.num_warmup_batches)

writer = tf.summary.create_file_writer(args.logdir) if hvd.rank() == 0 and args.logdir else None
log("Running benchmark...")
img_secs = []
# Each iteration writes its own line; the bar (a terminal) or one closing line (a log) adds the count.
bar = Progress(range(args.num_iters), desc="benchmark", unit="iter", enabled=hvd.rank() == 0, every_percent=100)
for iteration in bar:
    seconds = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
    img_sec = args.batch_size * args.num_batches_per_iter / seconds
    bar.write(f"Iter #{iteration}: {img_sec:.1f} img/sec per {device}")
    img_secs.append(img_sec)
    if writer is not None:
        with writer.as_default(step=iteration):
            tf.summary.scalar("img_per_sec", img_sec)
            tf.summary.scalar("wire_bytes_per_step", state.stats()["sent_bytes"])

mean, conf = np.mean(img_secs), 1.96 * np.std(img_secs)
stats = state.stats()
log(f"Img/sec per {device}: {mean:.1f} +-{conf:.1f}")
log(f"Total img/sec on {hvd.size()} {device}(s): {hvd.size() * mean:.1f} +-{hvd.size() * conf:.1f}")
log(f"Sparsity {stats['sparsity']:.3f}: {stats['sent_bytes'] / 1e6:.2f} MB handed to the all-reduce per step, "
    f"dense {stats['dense_bytes'] / 1e6:.2f} MB ({stats['compression_ratio']:.1f}x less)")
