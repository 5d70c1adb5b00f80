"""Worker for test_resume.py: train, checkpoint, die abruptly; or resume; or run uninterrupted."""

import argparse
import os
import signal

import horovod.torch as hvd
import torch

import pactrain_hvd.torch as pt

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, required=True)
parser.add_argument("--checkpoint", required=True)
parser.add_argument("--resume", action="store_true")
parser.add_argument("--die-after-checkpoint", action="store_true")
parser.add_argument("--result", required=True)
parser.add_argument("--packed-values", default="inherit")
args = parser.parse_args()

hvd.init()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
opt = pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3),
                              named_parameters=model.named_parameters(), sparsity=0.9, ranking="layer", begin_step=2, end_step=12,
                              frequency=3, pack_min_numel=0, packed_values=args.packed_values)
# Ternary error memory belongs to each rank: every rank keeps its own file.
per_rank = args.packed_values == "ternary"
checkpoint = f"{args.checkpoint}.rank{hvd.rank()}" if per_rank else args.checkpoint
start = 0
if args.resume:  # the usual Horovod pattern: rank 0 reads (or every rank its own), everyone receives
    if per_rank or hvd.rank() == 0:
        state = pt.load_checkpoint(checkpoint)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
    # Optimizer state first: on a rank with fresh state Horovod takes a zero-gradient step to
    # create it, which weight decay would apply to the weights; the parameters broadcast after it.
    hvd.broadcast_optimizer_state(opt.optimizer, root_rank=0)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    pt.broadcast_masks(opt, root_rank=0)
    start = opt.step_count

for step in range(start, start + args.steps):
    generator = torch.Generator().manual_seed(10_000 * hvd.rank() + step)
    inputs, labels = torch.randn(16, 32, generator=generator), torch.randint(0, 4, (16,), generator=generator)
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(inputs), labels).backward()
    opt.step()

if args.die_after_checkpoint:
    if per_rank or hvd.rank() == 0:
        pt.save_checkpoint(checkpoint, {"model": model.state_dict(), "optimizer": opt.state_dict()})
    hvd.barrier()
    os.kill(os.getpid(), signal.SIGKILL)  # no clean shutdown: the checkpoint is all that survives

if hvd.rank() == 0:
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, args.result)
