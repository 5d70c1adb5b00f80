"""Fashion-MNIST with FashionVGG in Keras, a ``tf.function`` tape loop, Horovod and PacTrain.

The TensorFlow twin of ``examples/pytorch_fashion_mnist.py --model vgg``: the same layers and
parameter count (``fashion_vgg``), the same recipe (SGD with momentum 0.9 and weight decay 5e-4 added
to the averaged gradient as torch's SGD does, learning rate 0.05 per worker scaled by the workers,
batch 64 per worker, cosine to 0 over the run, the torch example's pruning flags and their defaults).
The PacTrain change is the tape line. Run::

    horovodrun -np 2 -H localhost:2 --gloo .venv/bin/python examples/tensorflow2_fashion_mnist.py --sparsity 0.9

Data: Debian's ``dataset-fashion-mnist`` package (``apt-get install dataset-fashion-mnist``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from example_support.quiet_start import import_tensorflow  # noqa: E402

import_tensorflow()  # TF as it starts, without the CUDA probe's error lines on machines with no GPU

import horovod.tensorflow as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import pactrain_hvd.tensorflow as pt  # noqa: E402
from example_support.cli import add_pactrain_arguments, schedule_arguments  # noqa: E402
from example_support.data import load_fashion_mnist  # noqa: E402
from example_support.progress import Progress  # noqa: E402
from pactrain_hvd.tensorflow.pruning import backing_variable  # noqa: E402

# Training-set statistics of Fashion-MNIST pixels scaled to [0, 1] (as the torch example).
PIXEL_MEAN, PIXEL_STD = 0.2860, 0.3530


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="TensorFlow Fashion-MNIST (FashionVGG) with Horovod + PacTrain",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model", choices=("vgg",), default="vgg", help="FashionVGG (the torch example's --model vgg)")
    parser.add_argument("--batch-size", type=int, default=64, help="training batch size per worker")
    parser.add_argument("--test-batch-size", type=int, default=1000, help="evaluation batch size per worker")
    parser.add_argument("--epochs", type=int, default=2, help="epochs to train")
    parser.add_argument("--lr", type=float, default=0.05, help="learning rate per worker (scaled by the worker count)")
    parser.add_argument("--lr-schedule", choices=("constant", "cosine"), default="constant",
                        help="cosine: anneal to 0 over the run")
    parser.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    parser.add_argument("--weight-decay", type=float, default=5e-4, help="L2 weight decay (added to the gradient)")
    parser.add_argument("--seed", type=int, default=42, help="random seed")
    parser.add_argument("--fp16", "--fp16-allreduce", dest="fp16", action="store_true",
                        help="fp16 values on the wire (hvd.Compression.fp16)")
    add_pactrain_arguments(parser)
    parser.add_argument("--max-steps", type=int, default=None, help="stop after this many optimizer steps in all")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per worker")
    parser.add_argument("--data-dir", default=None, help="folder with the IDX .gz files (default: Debian's)")
    parser.add_argument("--logdir", default="", help="unused (the torch example's TensorBoard flag)")
    parser.add_argument("--result-json", default=None, help="write the final metrics here (rank 0)")
    return parser.parse_args(argv)


def fashion_vgg(widths: tuple[int, int] = (32, 64), hidden: int = 1024, num_classes: int = 10) -> tf.keras.Model:
    """``pytorch_fashion_mnist.FashionVGG`` in Keras: two 3x3 conv pairs (32, 64 channels, batch norm with
    torch's momentum and epsilon) and a 3136-1024-1024-10 head; 4.3 M parameters, built (28x28x1 inputs)."""
    layers = tf.keras.layers

    def conv(channels: int) -> list:
        return [layers.Conv2D(channels, 3, padding="same", use_bias=False),
                layers.BatchNormalization(momentum=0.9, epsilon=1e-5), layers.ReLU()]

    return tf.keras.Sequential([
        tf.keras.Input((28, 28, 1)), *conv(widths[0]), *conv(widths[0]), layers.MaxPooling2D(2),
        *conv(widths[1]), *conv(widths[1]), layers.MaxPooling2D(2),
        layers.Flatten(), layers.Dense(hidden, activation="relu"), layers.Dropout(0.3),
        layers.Dense(hidden, activation="relu"), layers.Dropout(0.3), layers.Dense(num_classes),
    ], name="fashion_vgg")


def normalized(images: np.ndarray) -> np.ndarray:
    """uint8 (N, 28, 28) -> float32 (N, 28, 28, 1), normalized as the torch example."""
    return ((images.astype(np.float32) / 255.0 - PIXEL_MEAN) / PIXEL_STD)[..., None]


def shard(count: int, epoch: int, rank: int, size: int, shuffle: bool = True) -> np.ndarray:
    """This rank's sample indices for ``epoch``: one permutation of all samples (seeded by the epoch), every
    ``size``-th from ``rank`` (as ``DistributedSampler``, padded to equal shards)."""
    order = np.random.default_rng(epoch).permutation(count) if shuffle else np.arange(count)
    padded = int(np.ceil(count / size)) * size
    order = np.concatenate([order, order[:padded - count]])
    return order[rank::size]


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)  # Horovod: limit CPU threads per worker
    tf.keras.utils.set_random_seed(args.seed)
    images, labels = load_fashion_mnist("train", args.data_dir)
    images = normalized(images)
    test_images, test_labels = load_fashion_mnist("test", args.data_dir)
    test_images = normalized(test_images)
    steps_per_epoch = int(np.ceil(len(shard(len(images), 0, hvd.rank(), hvd.size())) / args.batch_size))
    total_steps = args.epochs * steps_per_epoch
    if args.max_steps is not None:
        total_steps = min(total_steps, args.max_steps)

    model = fashion_vgg()
    lr = args.lr * hvd.size()
    if args.lr_schedule == "cosine":
        lr = tf.keras.optimizers.schedules.CosineDecay(lr, decay_steps=max(total_steps, 1))
    opt = tf.keras.optimizers.SGD(lr, momentum=args.momentum)
    compression = hvd.Compression.fp16 if args.fp16 else hvd.Compression.none
    state = pt.PacTrainState(compression=compression, sparsity=args.sparsity, **schedule_arguments(args, total_steps),
                             packed_values=args.packed_values, ranking=args.ranking, optimizer=opt)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    image_spec = tf.TensorSpec([None, 28, 28, 1], tf.float32)
    label_spec = tf.TensorSpec([None], tf.int64)

    @tf.function(input_signature=[image_spec, label_spec])  # a smaller last batch does not retrace
    def train_step(x: tf.Tensor, y: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            loss = loss_fn(y, logits)
        # The PacTrain line: was hvd.DistributedGradientTape(tape, compression=compression).
        tape = pt.DistributedGradientTape(tape, state=state)
        grads = tape.gradient(loss, model.trainable_variables)
        grads = [g + args.weight_decay * v for g, v in zip(grads, model.trainable_variables)]  # torch's weight_decay
        opt.apply_gradients(zip(grads, model.trainable_variables))
        correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, 1), y), tf.int64))
        return loss, correct

    @tf.function(input_signature=[image_spec, label_spec])
    def eval_step(x: tf.Tensor, y: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        logits = model(x, training=False)
        loss = tf.reduce_sum(tf.keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))
        return loss, tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, 1), y), tf.int64))

    def global_sum(values: list[float], name: str) -> list[float]:
        return hvd.allreduce(tf.constant(values, tf.float64), op=hvd.Sum, name=name).numpy().tolist()

    def evaluate(name: str) -> tuple[float, float]:
        loss_sum, correct = 0.0, 0
        indices = np.arange(len(test_images))[hvd.rank()::hvd.size()]
        for start in range(0, len(indices), args.test_batch_size):
            batch = indices[start:start + args.test_batch_size]
            loss, right = eval_step(test_images[batch], test_labels[batch])
            loss_sum, correct = loss_sum + float(loss), correct + int(right)
        loss_sum, correct, seen = global_sum([loss_sum, correct, len(indices)], name)
        return loss_sum / seen, correct / seen

    # Horovod: every rank starts from rank 0's weights (PacTrain ranks its masks on them).
    hvd.broadcast_variables([backing_variable(v) for v in model.variables], root_rank=0)
    schedule = state.config.schedule
    parameters = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    if hvd.rank() == 0:
        print(f"Fashion-MNIST (TensorFlow) on {hvd.size()} workers: {parameters} parameters, {total_steps} steps, "
              f"sparsity {args.sparsity} (prune steps {schedule.begin_step}..{schedule.end_step} every "
              f"{schedule.frequency}), fp16 {args.fp16}, packed values {args.packed_values}", flush=True)
    step, history, totals = 0, [], {"sent_bytes": 0, "dense_bytes": 0}
    last_sent = 0
    started = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        if step >= total_steps:
            break
        order = shard(len(images), epoch, hvd.rank(), hvd.size())
        epoch_started, sent, dense, steps = time.perf_counter(), 0, 0, 0
        loss_sum, correct, seen = 0.0, 0, 0
        for start in Progress(range(0, len(order), args.batch_size), desc=f"epoch {epoch}", enabled=hvd.rank() == 0):
            if step >= total_steps:
                break
            batch = order[start:start + args.batch_size]
            loss, right = train_step(images[batch], labels[batch])
            stats = state.stats()
            last_sent = stats["sent_bytes"]
            sent, dense, steps, step = sent + stats["sent_bytes"], dense + stats["dense_bytes"], steps + 1, step + 1
            loss_sum, correct, seen = loss_sum + float(loss) * len(batch), correct + int(right), seen + len(batch)
        seconds = time.perf_counter() - epoch_started
        loss_sum, correct, seen = global_sum([loss_sum, correct, seen], f"train_metrics.{epoch}")
        test_loss, test_accuracy = evaluate(f"test_metrics.{epoch}")
        totals["sent_bytes"] += sent
        totals["dense_bytes"] += dense
        history.append({"epoch": epoch, "step": step, "steps": steps, "sent_bytes": sent, "dense_bytes": dense,
                        "train_loss": loss_sum / seen, "train_accuracy": correct / seen, "test_loss": test_loss,
                        "test_accuracy": test_accuracy, "sparsity": state.stats()["sparsity"], "train_seconds": seconds,
                        "samples": int(seen)})
        if hvd.rank() == 0:
            print(f"epoch {epoch}: loss {loss_sum / seen:.4f} train acc {correct / seen:.4f} test loss {test_loss:.4f} "
                  f"test acc {test_accuracy:.4f} sparsity {history[-1]['sparsity']:.3f} "
                  f"sent {sent / max(steps, 1) / 1e3:.1f} kB/step vs dense {dense / max(steps, 1) / 1e3:.1f} kB/step",
                  flush=True)
    wall_seconds = time.perf_counter() - started
    last = history[-1] if history else {}
    result = dict(
        example="tensorflow2_fashion_mnist", framework="tensorflow", tensorflow=tf.__version__,
        world_size=hvd.size(), sparsity_target=args.sparsity, fp16=args.fp16, packed_values=args.packed_values,
        lr_schedule=args.lr_schedule, epochs=len(history), batch_size=args.batch_size, seed=args.seed,
        prune_schedule=[schedule.begin_step, schedule.end_step, schedule.frequency], ranking=args.ranking,
        parameters=parameters, sparsity=state.stats()["sparsity"], test_accuracy=last.get("test_accuracy"),
        test_loss=last.get("test_loss"), train_loss=last.get("train_loss"), wall_seconds=wall_seconds,
        samples_per_s=sum(h["samples"] for h in history) / max(sum(h["train_seconds"] for h in history), 1e-9),
        steps=step, sent_bytes=totals["sent_bytes"], dense_bytes=totals["dense_bytes"],
        compression_ratio=totals["dense_bytes"] / totals["sent_bytes"] if totals["sent_bytes"] else 1.0,
        last_step_sent_bytes=last_sent, traces=state.traces, history=history,
    )
    if hvd.rank() == 0:
        print(f"done: test accuracy {result['test_accuracy']:.4f}, sparsity {result['sparsity']:.3f}, "
              f"sent {result['sent_bytes'] / 1e6:.2f} MB vs dense {result['dense_bytes'] / 1e6:.2f} MB, "
              f"{wall_seconds:.1f} s, reduction traced {state.traces} time(s)", flush=True)
        if args.result_json:
            Path(args.result_json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.result_json).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
