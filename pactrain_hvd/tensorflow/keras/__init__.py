"""PacTrain for Keras 3 and tf-keras 2: ``hvd.DistributedOptimizer`` -> ``ptk.DistributedOptimizer``."""

from horovod.tensorflow.compression import Compression

from pactrain_hvd.tensorflow.keras import callbacks, elastic
from pactrain_hvd.tensorflow.keras.optimizer import DistributedOptimizer, PartialDistributedOptimizer

__all__ = ["Compression", "DistributedOptimizer", "PartialDistributedOptimizer", "callbacks", "elastic"]
