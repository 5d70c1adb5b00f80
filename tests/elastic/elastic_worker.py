"""Worker for test_elastic.py: Horovod elastic training with PacTrain (PyTorch); timeline in timeline.py.

The elastic part is Horovod's documented pattern, unchanged: ``hvd.elastic.TorchState(model=...,
optimizer=...)``, ``@hvd.elastic.run``, ``state.commit()`` every few steps.
"""

import os

import horovod.torch as hvd
import torch
from timeline import Timeline, fingerprint, parse_args

import pactrain_hvd.torch as pt

args = parse_args()
torch.set_num_threads(1)
hvd.init()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                            torch.nn.Linear(64, 4))
opt = pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3),
                              named_parameters=model.named_parameters(), sparsity=0.9, ranking="layer", begin_step=2, end_step=20,
                              frequency=3, pack_min_numel=0, packed_values=args.packed_values)


def masks() -> dict:
    return {name: mask.numpy() for name, mask in opt.masks().items()}


def describe() -> dict:
    ternary = opt.pactrain_state.quantized
    lanes = ternary.layout.lanes if ternary is not None else None  # int32 lanes per word
    return dict(opt_step=opt.step_count, masks=fingerprint(masks()), lanes=lanes)


def train_step(step: int) -> None:
    generator = torch.Generator().manual_seed(10_000 * hvd.rank() + step)
    inputs, labels = torch.randn(16, 32, generator=generator), torch.randint(0, 4, (16,), generator=generator)
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(inputs), labels).backward()
    opt.step()


timeline = Timeline(args, hvd, describe)
timeline.log("start", host=os.environ.get("HOROVOD_HOSTNAME"), rank=hvd.rank(), size=hvd.size())
state = hvd.elastic.TorchState(model=model, optimizer=opt, step=0)
timeline.run(state, train_step)
timeline.save_final(state, {k: v.numpy() for k, v in model.state_dict().items()}, masks(), opt.step_count)
