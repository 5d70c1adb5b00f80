"""The data and model of Horovod's MNIST scripts, shared by the scripts that mimic them: each rank's own
shard of a small synthetic "MNIST", and the same ``Sequential`` without ``Input`` (built by its first batch)."""

import numpy as np
import tensorflow as tf


def synthetic_mnist(rank: int) -> tf.data.Dataset:
    rng = np.random.default_rng(rank)
    images = rng.normal(size=(256, 12, 12, 1)).astype(np.float32)
    labels = rng.integers(0, 10, size=256)
    return tf.data.Dataset.from_tensor_slices((images, labels)).repeat().shuffle(256, seed=rank).batch(16)


def build_mnist_model() -> tf.keras.Sequential:
    return tf.keras.Sequential([
        tf.keras.layers.Conv2D(8, [3, 3], activation="relu"),
        tf.keras.layers.Conv2D(16, [3, 3], activation="relu"),
        tf.keras.layers.MaxPooling2D(pool_size=(2, 2)),
        tf.keras.layers.Dropout(0.25),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(32, activation="relu"),
        tf.keras.layers.Dropout(0.5),
        tf.keras.layers.Dense(10, activation="softmax"),
    ])
