"""One TensorFlow rank of one benchmark cell (``tf-`` and ``keras-`` methods); the harness starts it as it starts
``worker.py``, with the same arguments, and reads the same record.

    ip netns exec ptb-<pid>-w0 env HOROVOD_RANK=0 ... python -m benchmarks.throughput.tf_worker \\
        --model fashion-vgg --method tf-pactrain-0.9-fp16 --batch-size 64 --out rank0.json

``tf-`` methods train in a ``tf.function`` tape loop (``hvd.DistributedGradientTape`` for dense and fp16,
``pt.DistributedGradientTape`` for PacTrain), ``keras-`` methods in ``model.fit`` with
``ptk.DistributedOptimizer`` (``sparsity=0`` for dense and fp16: Horovod's own Keras optimizer does not
average under Keras 3) and ``ptk.callbacks.BroadcastGlobalVariablesCallback``. The model is FashionVGG in
Keras (``examples/tensorflow2_fashion_mnist.py``), on one random batch as the torch worker's.

A step is one graph: the reduction, packing and the update run inside it, so they are not timed apart.
``compute`` is the forward and backward of the same model and batch in a graph of their own, timed on
every rank at once after the timed steps (so the ranks share the CPU as during the steps); ``comm_wait``
is the rest of the step (reduction, packing, update). PacTrain methods also record what packing and
unpacking the step's gradients costs with the masks in place, with no reduction between them, and every
record has the number of traces of the step function after its first call and at the end (``traces_first_call``,
``traces``: equal when nothing retraced after the first call).
``--compute-only``: one process, no Horovod, the tape loop with the plain optimizer (the bound).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from example_support.quiet_start import import_tensorflow  # noqa: E402

import_tensorflow()

import horovod.tensorflow as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import pactrain_hvd.tensorflow as pt  # noqa: E402
import pactrain_hvd.tensorflow.keras as ptk  # noqa: E402
from benchmarks.common.examples import example  # noqa: E402
from benchmarks.common.methods import MethodSpec, parse_method, pruning_schedule  # noqa: E402
from benchmarks.common.nic import counter_delta, nic_counters, tx_bytes  # noqa: E402
from benchmarks.throughput.arguments import worker_arguments  # noqa: E402
from pactrain_hvd.tensorflow.pruning import backing_variable  # noqa: E402

TF_MODELS = ("fashion-vgg",)
LEARNING_RATE, MOMENTUM = 0.01, 0.9  # worker.py's


def build_model(name: str) -> tf.keras.Model:
    if name not in TF_MODELS:
        raise ValueError(f"TensorFlow methods run {', '.join(TF_MODELS)}, not {name!r}")
    return example("tensorflow2_fashion_mnist").fashion_vgg()


def synthetic_batch(batch_size: int, seed: int) -> tuple[tf.Tensor, tf.Tensor]:
    rng = np.random.default_rng(seed)
    return (tf.constant(rng.normal(size=(batch_size, 28, 28, 1)).astype(np.float32)),
            tf.constant(rng.integers(0, 10, size=batch_size), tf.int64))


def compression_of(spec: MethodSpec):
    """Horovod's compression: fp16 for ``fp16``, PacTrain with fp16 values, and ternary's dense-plan tensors."""
    return hvd.Compression.fp16 if spec.fp16_values or spec.quantized_values else hvd.Compression.none


def pactrain_arguments(spec: MethodSpec) -> dict:
    if spec.kind != "pactrain":
        return {"sparsity": 0.0}
    return {"sparsity": spec.sparsity, "packed_values": spec.packed_values,
            **pruning_schedule(spec, None)}


class Tape:
    """The tape loop: one ``tf.function`` per step (forward, backward, reduction, update)."""

    def __init__(self, spec: MethodSpec | None, model: tf.keras.Model, optimizer) -> None:
        self.traces, self.state = 0, None
        loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        variables = model.trainable_variables
        if spec is not None and spec.kind == "pactrain":
            self.state = pt.PacTrainState(compression=compression_of(spec), optimizer=optimizer,
                                          **pactrain_arguments(spec))

        # Horovod's own tape keys gradients by ``variable.ref()``, which Keras 3 variables lack: it differentiates
        # the tf.Variables behind them (the one change a Horovod tape script needs under Keras 3).
        sources = [backing_variable(v) for v in variables] if spec is not None and self.state is None else variables

        def wrap(tape: tf.GradientTape):
            if spec is None:
                return tape
            if self.state is not None:
                return pt.DistributedGradientTape(tape, state=self.state)
            return hvd.DistributedGradientTape(tape, compression=compression_of(spec))

        @tf.function(autograph=False)
        def step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
            self.traces += 1  # Python: runs once per trace
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            grads = wrap(tape).gradient(loss, sources)
            optimizer.apply_gradients(zip(grads, variables))
            return loss

        self.step = step

    def run(self, x: tf.Tensor, y: tf.Tensor, count: int) -> tuple[list[float], list[float]]:
        """``count`` steps: each one's seconds (until its loss is on the host) and loss."""
        seconds, losses = [], []
        for _ in range(count):
            start = time.perf_counter()
            losses.append(float(self.step(x, y)))
            seconds.append(time.perf_counter() - start)
        return seconds, losses


class StepTimer(tf.keras.callbacks.Callback):
    """Each batch's seconds in ``fit``, from its begin to its loss on the host."""

    def __init__(self) -> None:
        super().__init__()
        self.seconds: list[float] = []
        self.losses: list[float] = []

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        self.start = time.perf_counter()

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.losses.append(float(logs["loss"]))
        self.seconds.append(time.perf_counter() - self.start)


class Fit:
    """Keras ``fit``: the PacTrain optimizer, the broadcast callback, one repeated batch."""

    def __init__(self, spec: MethodSpec, model: tf.keras.Model, optimizer) -> None:
        self.model = model
        self.optimizer = ptk.DistributedOptimizer(optimizer, compression=compression_of(spec), **pactrain_arguments(spec))
        self.state = self.optimizer.pactrain_state if spec.kind == "pactrain" else None
        model.compile(optimizer=self.optimizer, jit_compile=False,
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        self.callbacks = [ptk.callbacks.BroadcastGlobalVariablesCallback(0)]
        self.traces, train_step = 0, model.train_step

        def counted(data):  # Python: runs once per trace of fit's step function
            self.traces += 1
            return train_step(data)

        model.train_step = counted  # read when fit makes its step function

    def run(self, x: tf.Tensor, y: tf.Tensor, count: int) -> tuple[list[float], list[float]]:
        timer = StepTimer()
        data = tf.data.Dataset.from_tensors((x, y)).repeat()
        self.model.fit(data, steps_per_epoch=count, epochs=1, verbose=0, callbacks=[*self.callbacks, timer])
        self.callbacks = []  # broadcast once, at the first fit
        return timer.seconds, timer.losses


def compute_seconds(model: tf.keras.Model, x: tf.Tensor, y: tf.Tensor, count: int) -> list[float]:
    """Forward and backward alone, in a graph of their own: the compute phase of a step."""
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function(autograph=False)
    def gradients(x: tf.Tensor, y: tf.Tensor) -> list[tf.Tensor]:
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        return tape.gradient(loss, model.trainable_variables)

    gradients(x, y)
    seconds = []
    for _ in range(count):
        start = time.perf_counter()
        [g.numpy() for g in gradients(x, y)[-1:]]  # the last gradient is ready when all are (one graph)
        seconds.append(time.perf_counter() - start)
    return seconds


def pack_unpack_seconds(state: pt.PacTrainState, model: tf.keras.Model, count: int) -> float | None:
    """Median seconds to pack and unpack every pruned gradient with the state's masks and plans, no reduction:
    the packing a PacTrain step adds (ternary's encoding is not this path)."""
    compressors = state.bound.compressors
    variables = dict(zip(state.bound.names, model.trainable_variables))
    pairs = [(compressors[name], variables[name]) for name in compressors if name in variables]
    if not pairs:
        return None

    @tf.function(autograph=False)
    def pack_unpack() -> list[tf.Tensor]:
        restored = []
        for compressor, variable in pairs:
            wire, ctx = compressor.compress(tf.convert_to_tensor(backing_variable(variable)))
            restored.append(compressor.decompress(wire, ctx))
        return restored

    pack_unpack()
    seconds = []
    for _ in range(count):
        start = time.perf_counter()
        [t.numpy() for t in pack_unpack()[-1:]]
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def payload_bytes(spec: MethodSpec, state, model: tf.keras.Model) -> dict[str, int]:
    if state is not None:
        return {"allreduce_bytes": int(state.stats()["sent_bytes"]), "allgather_bytes": 0}
    element = 2 if spec.fp16_values else 4
    return {"allreduce_bytes": sum(int(v.shape.num_elements()) * element for v in model.trainable_variables),
            "allgather_bytes": 0}


def run(args: argparse.Namespace) -> dict:
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    spec = None if args.compute_only else parse_method(args.method)
    rank, size = 0, 1
    if spec is not None:
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
    tf.keras.utils.set_random_seed(args.seed)
    model = build_model(args.model)
    optimizer = tf.keras.optimizers.SGD(LEARNING_RATE, momentum=MOMENTUM)
    if spec is not None and spec.frontend == "keras":
        trainer = Fit(spec, model, optimizer)
    else:
        trainer = Tape(spec, model, optimizer)
        if spec is not None:  # every rank starts from rank 0's weights (masks are ranked on them)
            hvd.broadcast_variables([backing_variable(v) for v in model.variables], root_rank=0)
    x, y = synthetic_batch(args.batch_size, args.seed * 1000 + rank)

    def fence() -> None:
        if spec is not None:
            hvd.allreduce(tf.zeros(1), name="bench.fence")

    device = args.device if spec is not None else ""
    warm_s, losses = trainer.run(x, y, 1)  # the first call traces the step (twice where it makes variables)
    first_traces = trainer.traces
    more_s, more_losses = trainer.run(x, y, args.warmup - 1) if args.warmup > 1 else ([], [])
    warm_s, losses = warm_s + more_s, losses + more_losses
    fence()
    before = nic_counters(device) if device else None
    tx_start, timed_start = (tx_bytes(device) if device else 0), time.perf_counter()
    step_s, timed_losses = trainer.run(x, y, args.steps)
    timed_s, tx_timed = time.perf_counter() - timed_start, (tx_bytes(device) - tx_start if device else 0)
    fence()
    after = nic_counters(device) if device else None
    fence()
    compute = statistics.median(compute_seconds(model, x, y, max(3, args.steps)))  # every rank at once
    state = trainer.state
    pack_s = pack_unpack_seconds(state, model, max(3, args.steps)) if state is not None else None
    fence()
    steps = [{"total": s, "compute": min(compute, s), "compress": 0.0, "comm_wait": max(s - compute, 0.0), "update": 0.0}
             for s in step_s]
    record = {
        "rank": rank, "size": size, "model": args.model, "method": args.method if spec else "compute-only",
        "framework": "tensorflow", "phases_in_graph": True, "comm_in_backward": False,
        "batch_size": args.batch_size, "threads": args.threads, "warmup": args.warmup,
        "parameters": sum(int(v.shape.num_elements()) for v in model.trainable_variables),
        "steps": steps, "losses": losses + timed_losses, "warmup_step_s": warm_s, "compute_s": compute,
        "pack_unpack_s": pack_s, "traces_first_call": first_traces, "traces": trainer.traces,
        "reduction_traces": state.traces if state is not None else None,
        "nic": {"device": device, **counter_delta(before, after)} if before else None,
        # No separate forward window here (one graph per step): the NIC's rate over the timed steps, less the
        # payload's ring bytes, is not control traffic either, so the control estimate is left out.
        "control_tx_bytes_per_s": 0.0 if device else None,
        "payload": payload_bytes(spec, state, model) if spec else None,
        "python": platform.python_version(), "tensorflow": tf.__version__,
        "horovod_env": {k: v for k, v in os.environ.items() if k.startswith("HOROVOD_")},
        "timed_s": timed_s, "timed_tx_bytes": tx_timed,
    }
    if state is not None and rank == 0:
        record["pactrain_stats"] = state.stats()
    return record


def main(argv: list[str] | None = None) -> None:
    args = worker_arguments(__doc__, "tf-dense", argv)
    record = run(args)
    Path(args.out).write_text(json.dumps(record, default=float))
    if record["size"] > 1:
        hvd.shutdown()


if __name__ == "__main__":
    sys.exit(main())
