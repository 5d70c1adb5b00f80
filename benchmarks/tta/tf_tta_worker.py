"""One TensorFlow rank of one time-to-accuracy run (``tf-`` methods); the harness starts it as it starts
``tta_worker.py``, with the same flags, and reads the same record.

    ip netns exec ptb-<pid>-w0 env HOROVOD_RANK=0 ... python -m benchmarks.tta.tf_tta_worker \\
        --workload image --method tf-pactrain-0.98-ternary-w0-0 --steps 600 --eval-every 40 --out rank0.json

The image workload of ``tta_worker.py`` in TensorFlow: FashionVGG in Keras (``examples/tensorflow2_fashion_mnist.py``,
the torch model's layers), a ``tf.function`` tape loop (``hvd.DistributedGradientTape`` for ``tf-dense`` and
``tf-fp16``, ``pt.DistributedGradientTape`` for PacTrain, pruning as the torch worker's: ``total_steps=--steps``
and the method's window). The same as torch's where TensorFlow allows: the data order (torch's
``DistributedSampler`` with its seed and epochs draws the indices), every rank's initial weights from one seed
(the start-up broadcast is skipped when they already agree), batch 64 per worker, learning rate 0.05 x batch / 64
per worker times the workers, momentum 0.9, weight decay 5e-4 added to the averaged gradient (torch's SGD),
cosine to 0 over ``--steps``, and the evaluation (the first ``--eval-samples`` test images, sharded, batches of
500). What differs is each framework's: Keras' initializers and its momentum form (velocity scaled by the
learning rate of each step). A step is one graph, so a run records step times, not phases; tracing it is done
before the training clock starts (``trace_s`` in the record). Only the image
workload; ``--compute-only``: one process, no Horovod, the plain optimizer (the bound).
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path

from example_support.quiet_start import import_tensorflow  # noqa: E402

import_tensorflow()

import horovod.tensorflow as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from torch.utils.data.distributed import DistributedSampler  # noqa: E402

import pactrain_hvd.tensorflow as pt  # noqa: E402
from benchmarks.common.examples import example  # noqa: E402
from benchmarks.common.methods import MethodSpec, parse_method, pruning_schedule  # noqa: E402
from benchmarks.common.nic import tx_counter  # noqa: E402
from benchmarks.throughput.tf_worker import compression_of  # noqa: E402
from benchmarks.tta.worker_arguments import parse_args  # noqa: E402
from example_support.data import load_fashion_mnist  # noqa: E402
from pactrain_hvd.tensorflow.pruning import backing_variable  # noqa: E402

WEIGHT_DECAY, MOMENTUM, EVAL_BATCH = 5e-4, 0.9, 500  # tta_worker.py's image recipe
IMAGE_SPEC, LABEL_SPEC = tf.TensorSpec([None, 28, 28, 1], tf.float32), tf.TensorSpec([None], tf.int64)


class Batches:
    """This rank's training batches in torch's order: ``DistributedSampler(shuffle=True, seed=data_seed)`` from
    epoch 1, whole batches only (``drop_last``), as the torch worker's loader."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, batch_size: int, rank: int, size: int,
                 data_seed: int = 0) -> None:
        self.images, self.labels, self.batch_size = images, labels, batch_size
        self.sampler = DistributedSampler(range(len(images)), num_replicas=size, rank=rank, shuffle=True,
                                          seed=data_seed)
        self.epoch, self.order, self.position = 0, np.zeros(0, np.int64), 0

    def next(self) -> tuple[np.ndarray, np.ndarray]:
        if self.position + self.batch_size > len(self.order):
            self.epoch += 1
            self.sampler.set_epoch(self.epoch)
            self.order, self.position = np.fromiter(iter(self.sampler), np.int64), 0
        chosen = self.order[self.position:self.position + self.batch_size]
        self.position += self.batch_size
        return self.images[chosen], self.labels[chosen].astype(np.int64)


def make_wrap(spec: MethodSpec | None, optimizer, steps: int):
    """(the tape wrapper, the PacTrain state or None) for the method; no wrapper for the bound."""
    if spec is None:
        return (lambda tape: tape), None
    if spec.kind == "pactrain":
        state = pt.PacTrainState(compression=compression_of(spec), optimizer=optimizer, sparsity=spec.sparsity,
                                 packed_values=spec.packed_values,
                                 **pruning_schedule(spec, steps))
        return (lambda tape: pt.DistributedGradientTape(tape, state=state)), state
    return (lambda tape: hvd.DistributedGradientTape(tape, compression=compression_of(spec))), None


def broadcast_unless_identical(model: tf.keras.Model) -> bool:
    """Horovod's start-up broadcast, skipped when every rank's seeded weights already agree (``tta_worker.py``'s)."""
    digest = hashlib.sha256(b"".join(np.asarray(v).tobytes() for v in model.variables)).hexdigest()
    differ = len(set(hvd.allgather_object(digest, name="tta.digest"))) > 1
    if differ:
        hvd.broadcast_variables([backing_variable(v) for v in model.variables], root_rank=0)
    return differ


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, prog="python -m benchmarks.tta.tf_tta_worker", doc=__doc__)
    if args.workload != "image":
        raise SystemExit("the TensorFlow time-to-accuracy worker runs the image workload")
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    spec = None if args.compute_only else parse_method(args.method)
    if spec is not None and spec.framework != "tensorflow":
        raise SystemExit(f"method {args.method!r} is not a TensorFlow method (tf-NAME)")
    if spec is not None:
        hvd.init()
    rank, size = (hvd.rank(), hvd.size()) if spec is not None else (0, 1)
    fashion = example("tensorflow2_fashion_mnist")
    batch_size = args.batch_size or 64
    images, labels = load_fashion_mnist("train")
    batches = Batches(fashion.normalized(images), labels, batch_size, rank, size, args.data_seed)
    test_images, test_labels = load_fashion_mnist("test")
    test_images, test_labels = fashion.normalized(test_images[:args.eval_samples]), test_labels[:args.eval_samples]
    mine = np.arange(len(test_images))[rank::size]  # DistributedSampler(shuffle=False): every size-th from rank
    tf.keras.utils.set_random_seed(args.seed)
    model = fashion.fashion_vgg()
    lr = 0.05 * batch_size / 64 * size
    optimizer = tf.keras.optimizers.SGD(tf.keras.optimizers.schedules.CosineDecay(lr, decay_steps=args.steps),
                                        momentum=MOMENTUM)
    wrap, state = make_wrap(spec, optimizer, args.steps)
    variables = model.trainable_variables
    # Horovod's tape keys gradients by variable.ref(), which Keras 3 variables lack: its sources are the tf.Variables.
    sources = [backing_variable(v) for v in variables] if spec is not None and state is None else variables
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function(input_signature=[IMAGE_SPEC, LABEL_SPEC])
    def train_step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = wrap(tape).gradient(loss, sources)
        grads = [g + WEIGHT_DECAY * v for g, v in zip(grads, variables)]  # torch's weight_decay
        optimizer.apply_gradients(zip(grads, variables))
        return loss

    @tf.function(input_signature=[IMAGE_SPEC, LABEL_SPEC])
    def eval_step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        return tf.reduce_sum(tf.cast(tf.equal(tf.argmax(model(x, training=False), 1), y), tf.int64))

    def evaluate(name: str) -> float:
        correct = sum(int(eval_step(test_images[mine[i:i + EVAL_BATCH]], test_labels[mine[i:i + EVAL_BATCH]]))
                      for i in range(0, len(mine), EVAL_BATCH))
        total = hvd.allreduce(tf.constant([correct, len(mine)], tf.float64), op=hvd.Sum, name=name).numpy()
        return float(total[0] / total[1])

    broadcast = broadcast_unless_identical(model) if spec is not None else False
    traced = time.perf_counter()  # tracing the step (torch has none to do) is kept off the training clock
    train_step.get_concrete_function()
    eval_step.get_concrete_function()
    trace_s = time.perf_counter() - traced
    tx = tx_counter(args.device)
    tx_start, train_s, curve, step_s, losses, handed, packed = tx(), 0.0, [], [], [], [], []
    for step in range(1, args.steps + 1):
        x, y = batches.next()
        started = time.perf_counter()
        losses.append(float(train_step(x, y)))  # the step is done when its loss is on the host
        step_s.append(time.perf_counter() - started)
        train_s += step_s[-1]
        if state is not None:
            step_stats = state.stats()
            handed.append(int(step_stats["sent_bytes"]))
            packed.append(sum(1 for t in step_stats["tensors"].values() if t["packed"]))
        if spec is not None and (step % args.eval_every == 0 or step == args.steps):
            metric = evaluate(f"tta.eval.{step}")
            curve.append([train_s, step, metric, tx() - tx_start])
            if rank == 0:
                print(f"step {step}: test_accuracy {metric:.4f} after {train_s:.1f} s of training", flush=True)
            if args.budget_s:
                verdict = hvd.broadcast(tf.constant([float(train_s >= args.budget_s)]), 0, name="tta.budget")
                if verdict.numpy()[0]:
                    break
    record = {"workload": args.workload, "method": args.method, "metric": "test_accuracy", "rank": rank, "size": size,
              "framework": "tensorflow", "steps": len(step_s), "planned_steps": args.steps, "budget_s": args.budget_s,
              "eval_every": args.eval_every, "batch_size": batch_size, "seed": args.seed, "curve": curve,
              "step_s": step_s, "train_s": train_s, "losses": losses[:: max(1, len(losses) // 50)],
              "parameters": sum(int(v.shape.num_elements()) for v in variables),
              "sparsity": state.stats()["sparsity"] if state is not None else 0.0, "compute_only": args.compute_only,
              "handed_bytes": handed, "packed_tensors": packed, "local_steps": 0, "local_s": 0.0,
              "broadcast": broadcast, "phases_in_graph": True, "trace_s": trace_s}
    if spec is None:  # the bound: the whole step is compute (tta.py reads these phases)
        record["phases_s"] = {"compute": step_s, "update": [0.0] * len(step_s)}
    Path(args.out).write_text(json.dumps(record) + "\n")
    if spec is not None:
        hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
