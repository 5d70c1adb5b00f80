"""One rank of a fault case (``test_faults.py``): a mistake on one rank, or on all, made on purpose.

Every rank prints ``FAULT rank=<r> <ErrorType>: <message>`` for the error it ends with (exit 3), or
``DONE rank=<r> ...`` if training ended normally (exit 0), then ``SECONDS rank=<r> <s>``: from Horovod's
start to that end (interpreter and framework start-up excluded, which a loaded machine stretches).
"""

import argparse
import hashlib
import os
import signal
import subprocess
import sys
import time

import numpy as np

STEPS = 12
STARTED: list[float] = []  # when Horovod was up
CASES = ("frequency", "total_steps", "sparsity_off", "nan", "nan_one_rank", "no_broadcast", "exception", "kill",
         "kill_in_mask_update", "stop", "clean")
STOP_S = 20  # case "stop": how long rank 1 stays stopped (run it under a shorter HOROVOD_GLOO_TIMEOUT_SECONDS)


def settings(case: str, rank: int) -> dict:
    """PacTrain arguments per rank: the settings cases give rank 1 its own."""
    common = dict(sparsity=0.5, begin_step=0, end_step=8, frequency=4, ranking="layer", pack_min_numel=0)
    if case == "frequency":
        return dict(common, frequency=(4, 8)[rank])
    if case == "total_steps":  # begin 11 / 10, end 66 / 65: rank 0 would update masks at step 10 alone
        return dict(sparsity=0.5, total_steps=(110, 109)[rank], frequency=5, ranking="layer", pack_min_numel=0)
    if case == "sparsity_off":
        return dict(common, sparsity=(0.5, 0.0)[rank])
    return common


def poison(case: str, rank: int, step: int) -> bool:
    """Whether this rank makes a weight NaN before ``step`` (the step before a mask update)."""
    return step == 3 and (case == "nan" or (case == "nan_one_rank" and rank == 1))


def mistake(case: str, rank: int, step: int) -> None:
    if rank == 1 and step == 3 and case == "exception":
        raise RuntimeError("a bug in rank 1's training loop")
    if rank == 1 and step == 3 and case == "kill":
        os._exit(9)
    if rank == 1 and step == 3 and case == "stop":  # a process stopped (SIGSTOP), continued STOP_S later
        subprocess.Popen(["sh", "-c", f"sleep {STOP_S}; kill -CONT {os.getpid()}"])
        os.kill(os.getpid(), signal.SIGSTOP)


def kill_inside_mask_updates(opt, rank: int) -> None:
    """Case ``kill_in_mask_update``: rank 1 dies while it ranks the masks of step 4 (a schedule update)."""
    pruner = opt.pactrain_state.pruner
    rank_masks = pruner.rank

    def dying(step: int, *args, **kwargs):
        if rank == 1 and step == 4:
            os.kill(os.getpid(), signal.SIGKILL)
        return rank_masks(step, *args, **kwargs)

    pruner.rank = dying


def digest(arrays) -> str:
    """The weights' SHA-256 (16 hex digits): equal across runs that computed the same weights."""
    return hashlib.sha256(b"".join(np.ascontiguousarray(a).tobytes() for a in arrays)).hexdigest()[:16]


def run_torch(case: str, plain: bool) -> str:
    import horovod.torch as hvd
    import torch

    import pactrain_hvd.torch as pt

    hvd.init()
    STARTED.append(time.monotonic())
    rank = hvd.rank()
    torch.manual_seed(rank if case == "no_broadcast" else 0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    inner = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    if plain:
        opt = hvd.DistributedOptimizer(inner, named_parameters=model.named_parameters())
    else:
        opt = pt.DistributedOptimizer(inner, named_parameters=model.named_parameters(), **settings(case, rank))
        if case == "kill_in_mask_update":
            kill_inside_mask_updates(opt, rank)
    if case != "no_broadcast":
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    masks_before = {}
    for step in range(STEPS):
        mistake(case, rank, step)
        if poison(case, rank, step):
            masks_before = {name: mask.clone() for name, mask in opt.masks().items()}
            with torch.no_grad():
                model[0].weight[0, 0] = float("nan")
        generator = torch.Generator().manual_seed(1000 * rank + step)
        inputs, labels = torch.randn(32, 64, generator=generator), torch.randint(0, 10, (32,), generator=generator)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(inputs), labels).backward()
        try:
            opt.step()
        except pt.NonFiniteWeightsError:
            after = opt.masks()
            assert after.keys() == masks_before.keys(), "masks changed at a non-finite mask update"
            assert all(torch.equal(after[name], mask) for name, mask in masks_before.items()), "masks changed"
            assert all(mask.any() for mask in after.values()), "an all-zero mask"
            assert opt.pactrain_state.stats()["sparsity"] < 1.0
            raise
    return f"steps={STEPS} weights={digest(p.detach().numpy() for p in model.parameters())}"


def run_keras(case: str) -> str:
    """``model.fit`` with the Keras optimizer and Horovod's broadcast callback (whose mask broadcast is then the
    first collective PacTrain runs)."""
    import horovod.tensorflow.keras as hvd
    import keras
    import tensorflow as tf

    import pactrain_hvd.tensorflow.keras as ptk

    hvd.init()
    STARTED.append(time.monotonic())
    rank = hvd.rank()
    tf.random.set_seed(0)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256, activation="relu"), keras.layers.Dense(10)])
    opt = ptk.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9), **settings(case, rank))
    model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    generator = np.random.default_rng(1000 * rank)
    inputs, labels = generator.standard_normal((32 * STEPS, 64)).astype("float32"), generator.integers(0, 10, 32 * STEPS)
    model.fit(inputs, labels, batch_size=32, epochs=1, verbose=0,
              callbacks=[ptk.callbacks.BroadcastGlobalVariablesCallback(0)])
    return f"steps={STEPS}"


def run_tensorflow(case: str, broadcast_masks: bool = False) -> str:
    import horovod.tensorflow as hvd
    import tensorflow as tf

    import pactrain_hvd.tensorflow as pt
    from pactrain_hvd.tensorflow.pruning import backing_variable

    hvd.init()
    STARTED.append(time.monotonic())
    rank = hvd.rank()
    tf.random.set_seed(rank if case == "no_broadcast" else 0)
    model = tf.keras.Sequential([tf.keras.Input((64,)), tf.keras.layers.Dense(256, activation="relu"),
                                 tf.keras.layers.Dense(10)])
    opt = tf.keras.optimizers.SGD(0.05, momentum=0.9)
    state = pt.PacTrainState(optimizer=opt, **settings(case, rank))
    if case != "no_broadcast":
        hvd.broadcast_variables([backing_variable(v) for v in model.variables], root_rank=0)
        if broadcast_masks:  # the resume idiom: the root's masks and schedule position, before the first step
            pt.broadcast_masks(state, root_rank=0)
    for step in range(STEPS):
        mistake(case, rank, step)
        if poison(case, rank, step):
            kernel = backing_variable(model.layers[0].kernel)
            kernel.assign(tf.tensor_scatter_nd_update(kernel, [[0, 0]], [float("nan")]))
        generator = np.random.default_rng(1000 * rank + step)
        inputs = tf.constant(generator.standard_normal((32, 64)), tf.float32)
        labels = tf.constant(generator.integers(0, 10, 32))
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(labels, model(inputs), from_logits=True))
        tape = pt.DistributedGradientTape(tape, state=state)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
    return f"steps={STEPS}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--case", choices=CASES, required=True)
    parser.add_argument("--frontend", choices=("torch", "tensorflow", "tensorflow-broadcast", "keras", "horovod"),
                        default="torch")
    args = parser.parse_args()
    rank = int(os.environ.get("HOROVOD_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "-1")))
    try:
        if args.frontend == "keras":
            result = run_keras(args.case)
        elif args.frontend.startswith("tensorflow"):
            result = run_tensorflow(args.case, broadcast_masks=args.frontend == "tensorflow-broadcast")
        else:
            result = run_torch(args.case, plain=args.frontend == "horovod")
    except Exception as error:  # noqa: BLE001 - what each rank ends with is the point
        print(f"FAULT rank={rank} {type(error).__name__}: {error}".replace("\n", " "), flush=True)
        print(f"SECONDS rank={rank} {time.monotonic() - STARTED[0]:.1f}" if STARTED else "", flush=True)
        sys.exit(3)
    print(f"DONE rank={rank} {result}", flush=True)
    print(f"SECONDS rank={rank} {time.monotonic() - STARTED[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()
