"""Run the documentation's snippets of one kind on every rank and check what they leave behind.

    horovodrun -np 2 -H localhost:2 --gloo python tests/docs/run_examples.py torch
    horovodrun -np 2 -H localhost:2 --gloo python tests/docs/run_examples.py tensorflow
    torchrun --standalone --nproc-per-node 2 tests/docs/run_examples.py ddp

Each snippet runs in a fresh namespace, after its setup (a tiny model, per-rank data, an optimizer).
Where it leaves a PacTrain optimizer or hook state that has not stepped, the check trains it over
the setup's data. Then every rank asserts that the model's weights are bitwise those of rank 0 and
that every pruned weight is exactly 0, and prints ``ok <page>:<line> ...``.
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from doc_examples import Block, runnable  # noqa: E402

TORCH_MODEL = """
import torch
import horovod.torch as hvd
import pactrain_hvd.torch as pt

hvd.init()
torch.manual_seed(0)

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 8, 3)
        self.fc = torch.nn.Linear(8 * 6 * 6, 10)

    def forward(self, x):
        return self.fc(torch.relu(self.conv1(x)).flatten(1))

model = Net()
generator = torch.Generator().manual_seed(hvd.rank())
train_loader = torch.utils.data.DataLoader(
    torch.utils.data.TensorDataset(torch.randn(128, 1, 8, 8, generator=generator),
                                   torch.randint(0, 10, (128,), generator=generator)), batch_size=16)
epochs = 2
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

"""

TORCH_PACTRAIN = TORCH_MODEL + """
import os
import tempfile

total_steps = epochs * len(train_loader)
opt = pt.DistributedOptimizer(opt, named_parameters=model.named_parameters(), sparsity=0.8,
                              begin_step=0, end_step=4, frequency=2)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
for x, y in list(train_loader)[:4]:
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
path = os.path.join(tempfile.mkdtemp(), "checkpoint.pt")
if hvd.rank() == 0:
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, path)
opt.zero_grad()
x, y = next(iter(train_loader))
loss = torch.nn.functional.cross_entropy(model(x), y)
"""

TF_MODEL = """
import numpy as np
import tensorflow as tf
import horovod.tensorflow as hvd
from tensorflow import keras

import pactrain_hvd.tensorflow as pt
import pactrain_hvd.tensorflow.keras as ptk

hvd.init()
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(4)])
rng = np.random.default_rng(hvd.rank())
x, y = rng.standard_normal((4096, 8)).astype("float32"), rng.integers(0, 4, 4096)
"""

TF_TAPE = TF_MODEL + """
opt = keras.optimizers.SGD(0.05, momentum=0.9)
loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(16).take(224)
"""

DDP_MODEL = """
import os

import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(784, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
generator = torch.Generator().manual_seed(int(os.environ["RANK"]))
train_loader = torch.utils.data.DataLoader(
    torch.utils.data.TensorDataset(torch.randn(128, 784, generator=generator),
                                   torch.randint(0, 10, (128,), generator=generator)), batch_size=16)
epochs = 2
"""

SETUPS = {"": "", "model": TORCH_MODEL, "pactrain": TORCH_PACTRAIN, "keras": TF_MODEL, "tape": TF_TAPE,
          "ddp": DDP_MODEL}


def train_torch(model, opt, loader, epochs):
    import torch

    for _ in range(epochs):
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()


def check_torch(block: Block, ns: dict) -> str:
    import horovod.torch as hvd

    import pactrain_hvd.torch as pt

    model = ns["model"]
    opt = ns.get("opt")
    if not isinstance(opt, pt.DistributedOptimizer):
        return identical_torch(model, lambda t: hvd.allgather(t)) + ", no PacTrain optimizer left to check"
    if opt.step_count == 0:
        train_torch(model, opt, ns["train_loader"], ns.get("epochs", 1))
    identical = identical_torch(model, lambda t: hvd.allgather(t))
    return f"{identical}, {zeros_torch(dict(model.named_parameters()), opt.masks())}, step {opt.step_count}"


def identical_torch(model, allgather) -> str:
    import torch

    for name, p in model.named_parameters():
        gathered = allgather(p.detach().reshape(1, -1).float())
        for rank in range(1, gathered.shape[0]):
            assert torch.equal(gathered[0], gathered[rank]), f"{name} differs between rank 0 and rank {rank}"
    return "ranks identical"


def zeros_torch(parameters: dict, masks: dict) -> str:
    pruned = 0
    for name, mask in masks.items():
        weight = parameters[name].detach()
        assert (weight[~mask] == 0).all(), f"{name}: a pruned weight is not 0"
        pruned += int((~mask).sum())
    return f"{pruned} pruned weights 0"


def check_tensorflow(block: Block, ns: dict) -> str:
    import horovod.tensorflow as hvd
    import numpy as np
    import tensorflow as tf

    model = ns["model"]
    for v in model.trainable_variables:
        gathered = hvd.allgather(tf.reshape(tf.convert_to_tensor(v), [1, -1])).numpy()
        for rank in range(1, gathered.shape[0]):
            assert np.array_equal(gathered[0], gathered[rank]), f"{v.name} differs between rank 0 and rank {rank}"
    states = [ns["opt"].pactrain_state] if hasattr(ns.get("opt"), "pactrain_state") else []
    for v in model.trainable_variables:
        for source in (v, getattr(v, "value", None)):
            states += [state for _, state in getattr(source, "__dict__", {}).get("_pactrain_tape_states", {}).values()]
    pruned = 0
    for state in {id(s): s for s in states}.values():
        for name, mask in state.masks().items():
            weight = np.asarray(state.bound.pruner.variables[name].numpy())
            assert (weight[~mask] == 0).all(), f"{name}: a pruned weight is not 0"
            pruned += int((~mask).sum())
    return f"ranks identical, {pruned} pruned weights 0" + ("" if states else ", no PacTrain state left to check")


def check_ddp(block: Block, ns: dict) -> str:
    import torch
    import torch.distributed as dist

    model, state = ns["model"], ns.get("state")
    optimizer = ns.get("optimizer") or ns.get("opt")
    if state is not None and state.step_count == 0:
        train_torch(model, optimizer, ns["train_loader"], ns.get("epochs", 1))

    def allgather(t):
        out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
        dist.all_gather(out, t)
        return torch.cat(out)

    identical = identical_torch(model, allgather)
    if state is None:
        return identical
    return f"{identical}, {zeros_torch(state.parameters, state.masks())}, step {state.step_count}"


def run(block: Block, check) -> str:
    ns: dict = {"__name__": "__main__"}
    exec(compile(SETUPS[block.setup], f"<setup {block.setup}>", "exec"), ns)
    exec(compile("\n" * block.line + block.code, str(block.page), "exec"), ns)  # tracebacks name the page's lines
    return check(block, ns)


def main(kind: str) -> None:
    selected = runnable(kind)
    assert selected, f"no {kind} examples"
    if kind == "ddp":
        import torch.distributed as dist

        # One process group serves every snippet: a second init is skipped and a snippet's clean-up
        # waits for the check and the snippets after it (re-creating the group can hang in rendezvous).
        init, destroy = dist.init_process_group, dist.destroy_process_group
        dist.init_process_group = lambda *a, **k: None if dist.is_initialized() else init(*a, **k)
        dist.destroy_process_group = lambda *a, **k: None
        for block in selected:
            result = run(block, check_ddp)
            print(f"ok {block.id} [rank {dist.get_rank()}]: {result}", flush=True)
            dist.barrier()
        destroy()
        # Every check has passed. About one exit in ten of this 2-process torchrun job then aborts in C++
        # teardown ("terminate called without an active exception"; 3-4 of 40 runs, on this version and the
        # one before); leaving without interpreter teardown keeps that out of the snippets' verdict.
        sys.stdout.flush()
        os._exit(0)
    check = check_torch if kind == "torch" else check_tensorflow
    for block in selected:
        result = run(block, check)
        if kind == "torch":
            import horovod.torch as hvd
        else:
            import horovod.tensorflow as hvd
        print(f"ok {block.id} [rank {hvd.rank()}]: {result}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
