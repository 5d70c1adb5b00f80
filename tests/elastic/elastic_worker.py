"""Worker for test_elastic.py: Horovod elastic training with PacTrain; one worker waits to be killed.

The elastic part is Horovod's documented pattern, unchanged: ``hvd.elastic.TorchState(model=...,
optimizer=...)``, ``@hvd.elastic.run``, ``state.commit()`` every few steps. Everything else is
instrumentation: one JSON line per event in ``<out>/log.<pid>.jsonl``, final weights and masks in
``<out>/final.rank<r>.npz``, and the victim's PID in ``<out>/victim.pid``.

Timeline with the defaults: masks change at steps 2, 5, 8, 11, 14, 17, 20; commits after steps
4, 8, 12, ...; in its first life rank 1 stops before step 10 and waits for SIGKILL, so the survivor
loses uncommitted steps 8 and 9 (and the mask change at 8), rolls back to the commit at 8, trains
alone, waits at the commit at 12 for the killed worker's host to come back, and both finish.
"""

import argparse
import hashlib
import json
import os
import time

import horovod.torch as hvd
import numpy as np
import torch

import pactrain_hvd.torch as pt

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--steps", type=int, default=24)
parser.add_argument("--commit-every", type=int, default=4)
parser.add_argument("--kill-at", type=int, default=10)
parser.add_argument("--rejoin-by", type=int, default=12, help="alone from this commit on, wait for the second worker")
parser.add_argument("--rejoin-timeout", type=float, default=90.0)
parser.add_argument("--values", default="fp32", help="ternary: lane width follows the world size")
args = parser.parse_args()

torch.set_num_threads(1)
LOG = os.path.join(args.out, f"log.{os.getpid()}.jsonl")
VICTIM = os.path.join(args.out, "victim.pid")


def log(event: str, **fields) -> None:
    with open(LOG, "a") as f:
        f.write(json.dumps(dict(event=event, pid=os.getpid(), time=time.time(), **fields)) + "\n")


def fingerprint(opt: pt.DistributedOptimizer) -> str:
    digest = hashlib.sha256()
    for name, mask in sorted(opt.masks().items()):
        digest.update(name.encode())
        digest.update(mask.numpy().tobytes())
    return digest.hexdigest()[:16]


hvd.init()
log("start", host=os.environ.get("HOROVOD_HOSTNAME"), rank=hvd.rank(), size=hvd.size())
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                            torch.nn.Linear(64, 4))
opt = pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3),
                              named_parameters=model.named_parameters(), sparsity=0.9, begin_step=2, end_step=20,
                              frequency=3, pack_min_numel=0, values=args.values)


def snapshot(state, event: str, **fields) -> None:
    lanes = opt._ternary.layout.lanes if opt._ternary is not None else None  # int32 lanes per word
    log(event, rank=hvd.rank(), size=hvd.size(), step=state.step, opt_step=opt.step_count, masks=fingerprint(opt),
        lanes=lanes, **fields)


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
        generator = torch.Generator().manual_seed(10_000 * hvd.rank() + step)
        inputs, labels = torch.randn(16, 32, generator=generator), torch.randint(0, 4, (16,), generator=generator)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(inputs), labels).backward()
        opt.step()
        state.step = step + 1
        snapshot(state, "step")
        if state.step % args.commit_every == 0:
            state.commit()
            snapshot(state, "commit")
            if hvd.size() < 2 and args.rejoin_by <= state.step < args.steps:
                wait_for_rejoin(state)


state = hvd.elastic.TorchState(model=model, optimizer=opt, step=0)
state.register_reset_callbacks([lambda: snapshot(state, "reset")])
train(state)
snapshot(state, "done")
np.savez(os.path.join(args.out, f"final.rank{hvd.rank()}.npz"), rank=hvd.rank(), size=hvd.size(), step=state.step,
         opt_step=opt.step_count, **{f"weight|{k}": v.numpy() for k, v in model.state_dict().items()},
         **{f"mask|{k}": v.numpy() for k, v in opt.masks().items()})
