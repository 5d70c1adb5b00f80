"""Horovod's Keras callbacks, working under Keras 3 and tf-keras 2 (``TF_USE_LEGACY_KERAS=1``).

Same names and arguments as ``horovod.tensorflow.keras.callbacks``: ``BroadcastGlobalVariablesCallback``,
``MetricAverageCallback``, ``LearningRateScheduleCallback``, ``LearningRateWarmupCallback``,
``BestModelCheckpoint`` (which also takes ``filepath=``: Horovod's leaves it to its Spark estimator). A script
written for Horovod's switches by prefix (``hvd.callbacks.X`` -> ``ptk.callbacks.X``). Horovod 0.28's own
fail on today's Keras: they take ``get_value`` / ``set_value`` from ``import keras``, which is Keras 3 even
when the model is tf-keras 2's, and Keras 3's backend has neither; they read ``optimizer.lr`` and call
``optimizer.variables()`` and ``variable.ref()``, all gone in Keras 3. These work with any Keras
optimizer, ours or not.

What a Horovod Keras script needs beyond the prefix under Keras 3 is Keras' own change, not ours:
``compile(experimental_run_tf_function=False)`` is gone (drop the argument), ``optimizer.variables``
is a list (no call), and Horovod's ops have no XLA kernels, so a GPU ``compile`` needs
``jit_compile=False`` (Keras 3 defaults to XLA there).

Momentum correction (``momentum_correction=True``) changes the momentum only where the optimizer holds
it in a variable (tf-keras' legacy optimizers): Keras 3 and tf-keras 2 optimizers hold a Python number,
a constant of the traced step, so changing it between batches would either do nothing or, before the
first trace, be kept for the whole run. Those are left alone, with a warning.
"""

from pactrain_hvd.tensorflow.keras.callbacks.broadcast import BroadcastGlobalVariablesCallback
from pactrain_hvd.tensorflow.keras.callbacks.checkpoint import BestModelCheckpoint
from pactrain_hvd.tensorflow.keras.callbacks.learning_rate import (
           LearningRateScheduleCallback,
           LearningRateWarmupCallback,
)
from pactrain_hvd.tensorflow.keras.callbacks.metrics import MetricAverageCallback

__all__ = ["BestModelCheckpoint", "BroadcastGlobalVariablesCallback", "LearningRateScheduleCallback", "LearningRateWarmupCallback",
           "MetricAverageCallback"]
