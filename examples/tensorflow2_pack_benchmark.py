"""Micro-benchmark: what mask-indexed packing costs a TensorFlow training step (one process, no network).

Times, on a ResNet-18-size Keras model (11.2 M parameters, CIFAR stem, 32x32 inputs):

- ``step``: forward + backward + SGD update (``tf.function``), the work a worker does anyway;
- ``pack+unpack``: every gradient through ``PacTrainCompressor.compress`` and ``decompress``
  under the adaptive plan at the target sparsity, without the all-reduce between them.

(``PacTrainState.reduce`` is not timed here: in one process it communicates nothing, by Horovod's rule,
so it neither packs nor unpacks.)

Run::

    .venv/bin/python examples/tensorflow2_pack_benchmark.py --sparsity 0.9 --batch-size 32
"""

from __future__ import annotations

import argparse
import json
import time

from example_support.quiet_start import import_tensorflow  # noqa: E402

import_tensorflow()  # TF as it starts, without the CUDA probe's error lines on machines with no GPU

import horovod.tensorflow as hvd  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import pactrain_hvd.tensorflow as pt  # noqa: E402
from pactrain_hvd.core import magnitude_masks, should_pack  # noqa: E402
from pactrain_hvd.tensorflow.pruning import default_prunable, variable_names  # noqa: E402


def resnet18(input_shape: tuple[int, int, int] = (32, 32, 3), classes: int = 10) -> keras.Model:
    """ResNet-18 (He et al. 2016) with the CIFAR stem: a 3x3 convolution, no max pooling."""

    def block(x, filters: int, stride: int):
        shortcut = x
        x = keras.layers.Conv2D(filters, 3, stride, padding="same", use_bias=False)(x)
        x = keras.layers.ReLU()(keras.layers.BatchNormalization()(x))
        x = keras.layers.Conv2D(filters, 3, padding="same", use_bias=False)(x)
        x = keras.layers.BatchNormalization()(x)
        if stride != 1 or shortcut.shape[-1] != filters:
            shortcut = keras.layers.Conv2D(filters, 1, stride, use_bias=False)(shortcut)
            shortcut = keras.layers.BatchNormalization()(shortcut)
        return keras.layers.ReLU()(keras.layers.Add()([x, shortcut]))

    inputs = keras.Input(input_shape)
    x = keras.layers.Conv2D(64, 3, padding="same", use_bias=False)(inputs)
    x = keras.layers.ReLU()(keras.layers.BatchNormalization()(x))
    for filters, stride in [(64, 1), (64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2), (512, 1)]:
        x = block(x, filters, stride)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(classes)(x), name="resnet18")


def seconds_per_call(function, *args, repeats: int, warmup: int = 2) -> float:
    """Median wall time of ``function(*args)`` until the device is done. Results stay where they
    are: copying 11 M gradient values to numpy would cost more than packing them."""
    def call() -> None:
        function(*args)
        tf.test.experimental.sync_devices()

    for _ in range(warmup):
        call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sparsity", type=float, default=0.9)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (1: as each of 2 ranks on 2 cores)")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    hvd.init()

    model = resnet18()
    variables = model.trainable_variables
    names = variable_names(variables)
    optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(size=(args.batch_size, 32, 32, 3)).astype(np.float32))
    y = tf.constant(rng.integers(0, 10, size=args.batch_size))
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function(autograph=False)
    def gradients():
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        return tape.gradient(loss, variables)

    @tf.function(autograph=False)
    def step():
        grads = gradients()
        optimizer.apply_gradients(zip(grads, variables))
        return grads[0]

    step_seconds = seconds_per_call(step, repeats=args.repeats)

    # The plan at the target sparsity, from magnitude masks of the weights, exactly as PacTrain installs it.
    prunable = {n: v.numpy() for n, v in zip(names, variables) if default_prunable(n, v)}
    masks = magnitude_masks(prunable, args.sparsity)
    packed = {name: should_pack(mask.size, int(mask.sum())) for name, mask in masks.items()}
    compressors = {name: pt.PacTrainCompressor(mask, packed=packed[name]) for name, mask in masks.items()}
    grads = gradients()

    @tf.function(autograph=False)
    def pack_unpack(grads):
        restored = []
        for name, grad in zip(names, grads):
            compressor = compressors.get(name)
            if compressor is None:
                restored.append(grad)
                continue
            wire, ctx = compressor.compress(grad)
            restored.append(compressor.decompress(wire, ctx))
        return restored

    pack_seconds = seconds_per_call(pack_unpack, grads, repeats=args.repeats * 5)

    wire_bytes = sum(int(compressor.compress(grad)[0].shape.num_elements()) * grad.dtype.size
                     for name, grad in zip(names, grads) if (compressor := compressors.get(name)) is not None)
    result = {
        "model": "ResNet-18 (CIFAR stem), Keras 3",
        "parameters": int(sum(v.shape.num_elements() for v in variables)),
        "batch_size": args.batch_size,
        "threads": args.threads,
        "sparsity": args.sparsity,
        "packed_tensors": sum(packed.values()),
        "masked_tensors": len(masks),
        "step_ms": round(step_seconds * 1e3, 2),
        "pack_unpack_ms": round(pack_seconds * 1e3, 3),
        "pack_unpack_percent_of_step": round(100 * pack_seconds / step_seconds, 3),
        "wire_bytes_of_masked_tensors": wire_bytes,
        "dense_bytes_of_masked_tensors": sum(int(mask.size) * 4 for mask in masks.values()),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
