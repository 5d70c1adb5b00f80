"""Two ranks train a small CNN on Fashion-MNIST with PacTrain, or with ``--dense`` plain Horovod
(``--dense --fp16``: with ``hvd.Compression.fp16``).

A plain Horovod training script; the only PacTrain line is the optimizer. Rank 0 prints the
test accuracy every ``--eval-every`` steps and, with ``--result-json``, writes the curve and the
throughput. ``make demo`` (``python -m benchmarks.demo.demo``) runs it three ways (dense,
dense with fp16, PacTrain), side by side, on an emulated 100 Mbit/s link per worker; by hand:

    horovodrun -np 2 -H localhost:2 --gloo python examples/pytorch_demo.py [--dense [--fp16]]
"""

import argparse
import json
import time
from pathlib import Path

import horovod.torch as hvd
import torch
from torch import nn

import pactrain_hvd.torch as pt
from example_support.data import load_fashion_mnist
from example_support.progress import Progress

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--dense", action="store_true", help="plain hvd.DistributedOptimizer, the baseline")
parser.add_argument("--steps", type=int, default=90)
parser.add_argument("--batch-size", type=int, default=64, help="per worker")
parser.add_argument("--train-samples", type=int, default=12000, help="per job, split across ranks")
parser.add_argument("--test-samples", type=int, default=2000, help="split across ranks")
parser.add_argument("--eval-every", type=int, default=30, help="steps between test-accuracy points")
parser.add_argument("--sparsity", type=float, default=0.9)
parser.add_argument("--prune-from", type=float, default=0.0, help="fraction of the steps before pruning begins")
parser.add_argument("--prune-until", type=float, default=0.25, help="fraction of the steps when pruning ends")
parser.add_argument("--fp16", action="store_true", help="carry (packed) values as fp16")
parser.add_argument("--result-json", type=Path, default=None, help="rank 0 writes the run's figures here")
args = parser.parse_args()

hvd.init()
torch.manual_seed(42)
torch.set_num_threads(1)


def to_tensors(images, labels):
    return torch.from_numpy(images).float().div_(255).unsqueeze(1), torch.from_numpy(labels).long()


train_images, train_labels = load_fashion_mnist("train")
test_images, test_labels = load_fashion_mnist("test")
x_train, y_train = to_tensors(train_images[: args.train_samples], train_labels[: args.train_samples])
x_train, y_train = x_train[hvd.rank() :: hvd.size()], y_train[hvd.rank() :: hvd.size()]  # this rank's shard
x_test, y_test = to_tensors(test_images[: args.test_samples], test_labels[: args.test_samples])
x_test, y_test = x_test[hvd.rank() :: hvd.size()], y_test[hvd.rank() :: hvd.size()]

# 1.6 M parameters, most in the first linear layer: 6.5 MB of fp32 gradients per step.
model = nn.Sequential(
    nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
    nn.Flatten(), nn.Linear(64 * 7 * 7, 512), nn.ReLU(), nn.Linear(512, 10),
)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size(), momentum=0.9)
compression = hvd.Compression.fp16 if args.fp16 else hvd.Compression.none
prune_begin, prune_end = int(args.steps * args.prune_from), max(1, int(args.steps * args.prune_until))
if args.dense:
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), compression=compression)
else:
    optimizer = pt.DistributedOptimizer(  # the one changed line (was hvd.DistributedOptimizer)
        optimizer, named_parameters=model.named_parameters(), compression=compression,
        sparsity=args.sparsity, begin_step=prune_begin, end_step=prune_end,
        frequency=max(1, (prune_end - prune_begin) // 6),
        ranking="global",  # 90 % of all weights, most from the big linear layer, not 90 % of each small conv
    )
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
dense_bytes = sum(p.numel() for p in model.parameters()) * (2 if args.fp16 else 4)


def test_accuracy() -> float:
    model.eval()
    with torch.no_grad():
        correct = (model(x_test).argmax(1) == y_test).sum()
    model.train()
    return hvd.allreduce(correct.float(), op=hvd.Sum, name="test_correct").item() / args.test_samples


label = ("Horovod fp16" if args.fp16 else "dense Horovod") if args.dense else f"PacTrain {args.sparsity:g}"
if hvd.rank() == 0:
    print(f"{label}: {hvd.size()} workers, {sum(p.numel() for p in model.parameters()):,} parameters, "
          f"{args.steps} steps of {args.batch_size} per worker", flush=True)
curve = [(0.0, 0, test_accuracy())]  # (training seconds, step, test accuracy); evaluation is not timed
train_seconds, sent_bytes = 0.0, 0
order = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(0))
bar = Progress(range(1, args.steps + 1), desc=label, enabled=hvd.rank() == 0)
for step in bar:
    started = time.perf_counter()
    index = order[torch.arange((step - 1) * args.batch_size, step * args.batch_size) % len(order)]
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(x_train[index]), y_train[index])
    loss.backward()
    optimizer.step()
    train_seconds += time.perf_counter() - started
    sent_bytes += dense_bytes if args.dense else optimizer.stats()["sent_bytes"]
    bar.set_postfix(loss=f"{loss.item():.3f}")
    if step % args.eval_every == 0 or step == args.steps:
        curve.append((train_seconds, step, test_accuracy()))
        bar.write(f"{label}: step {step}: test accuracy {curve[-1][2]:.4f}, {train_seconds:.1f} s of training")

samples_per_s = args.steps * args.batch_size * hvd.size() / train_seconds
if hvd.rank() == 0:
    print(f"{label}: test accuracy {curve[-1][2]:.4f}, {samples_per_s:.0f} samples/s, "
          f"{sent_bytes / args.steps / 1e6:.2f} MB per step handed to Horovod (dense {dense_bytes / 1e6:.2f} MB)",
          flush=True)
    if args.result_json:
        args.result_json.write_text(json.dumps({
            "label": label, "dense": args.dense, "world_size": hvd.size(), "steps": args.steps,
            "batch_size": args.batch_size, "samples_per_s": samples_per_s, "train_seconds": train_seconds,
            "test_accuracy": curve[-1][2], "curve": curve, "sent_bytes_per_step": sent_bytes / args.steps,
            "dense_bytes_per_step": dense_bytes,
        }, indent=1))
