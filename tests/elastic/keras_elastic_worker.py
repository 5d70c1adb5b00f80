"""Worker for test_elastic.py: the Keras twin of ``elastic_worker.py`` (same timeline, events and files).

The elastic part is Horovod's documented pattern with one name changed: ``ptk.elastic.KerasState``
for ``hvd.elastic.KerasState``; ``@hvd.elastic.run`` and ``state.commit()`` are Horovod's. The
step is a ``tf.function`` around ``ptk.DistributedOptimizer.apply_gradients``.
"""

import argparse
import hashlib
import json
import os
import time

import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf

import pactrain_hvd.tensorflow.keras as ptk
from pactrain_hvd.tensorflow.pruning import variable_names

keras = tf.keras  # Keras 3, or tf-keras 2 under TF_USE_LEGACY_KERAS=1

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--steps", type=int, default=24)
parser.add_argument("--commit-every", type=int, default=4)
parser.add_argument("--kill-at", type=int, default=10)
parser.add_argument("--rejoin-by", type=int, default=12, help="alone from this commit on, wait for the second worker")
parser.add_argument("--rejoin-timeout", type=float, default=90.0)
args = parser.parse_args()

LOG = os.path.join(args.out, f"log.{os.getpid()}.jsonl")
VICTIM = os.path.join(args.out, "victim.pid")


def log(event: str, **fields) -> None:
    with open(LOG, "a") as f:
        f.write(json.dumps(dict(event=event, pid=os.getpid(), time=time.time(), **fields)) + "\n")


def fingerprint(opt) -> str:
    digest = hashlib.sha256()
    for name, mask in sorted(opt.masks().items()):
        digest.update(name.encode())
        digest.update(mask.tobytes())
    return digest.hexdigest()[:16]


hvd.init()
log("start", host=os.environ.get("HOROVOD_HOSTNAME"), rank=hvd.rank(), size=hvd.size())
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"),
                          keras.layers.Dense(64, activation="relu"), keras.layers.Dense(4)])
opt = ptk.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9, weight_decay=1e-3), sparsity=0.9,
                               begin_step=2, end_step=20, frequency=3, pack_min_numel=0)
loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


@tf.function
def train_step(inputs: tf.Tensor, labels: tf.Tensor) -> None:
    with tf.GradientTape() as tape:
        loss = loss_fn(labels, model(inputs, training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))


def snapshot(state, event: str, **fields) -> None:
    log(event, rank=hvd.rank(), size=hvd.size(), step=state.step, opt_step=opt.step_count, masks=fingerprint(opt),
        **fields)


def wait_to_be_killed() -> None:
    with open(VICTIM + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(VICTIM + ".tmp", VICTIM)
    time.sleep(600)
    raise SystemExit("the test never killed this worker")


def wait_for_rejoin(state) -> None:
    deadline = time.time() + args.rejoin_timeout
    while time.time() < deadline:
        time.sleep(0.5)
        state.check_host_updates()  # raises HostsUpdatedInterrupt once the host is back
    raise RuntimeError(f"no second worker joined within {args.rejoin_timeout} s")


@hvd.elastic.run
def train(state) -> None:
    snapshot(state, "enter")
    while state.step < args.steps:
        step = state.step
        if step == args.kill_at and hvd.rank() == 1 and not os.path.exists(VICTIM):
            wait_to_be_killed()
        rng = np.random.default_rng(10_000 * hvd.rank() + step)
        train_step(rng.normal(size=(16, 32)).astype(np.float32), rng.integers(0, 4, size=16))
        state.step = step + 1
        snapshot(state, "step")
        if state.step % args.commit_every == 0:
            state.commit()
            snapshot(state, "commit")
            if hvd.size() < 2 and args.rejoin_by <= state.step < args.steps:
                wait_for_rejoin(state)


state = ptk.elastic.KerasState(model, opt, step=0)
state.register_reset_callbacks([lambda: snapshot(state, "reset")])
train(state)
snapshot(state, "done")
weights = dict(zip(variable_names(model.weights), (np.asarray(w) for w in model.weights)))
np.savez(os.path.join(args.out, f"final.rank{hvd.rank()}.npz"), rank=hvd.rank(), size=hvd.size(), step=state.step,
         opt_step=opt.step_count, **{f"weight|{k}": v for k, v in weights.items()},
         **{f"mask|{k}": v for k, v in opt.masks().items()})
