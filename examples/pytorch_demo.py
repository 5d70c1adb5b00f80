"""`make demo`: two ranks train a small CNN on Fashion-MNIST with PacTrain.

A plain Horovod training script; the only PacTrain line is the optimizer. Rank 0 prints,
per epoch, loss, test accuracy, sparsity, wire bytes per step against dense, and samples/s.

    horovodrun -np 2 -H localhost:2 --gloo python examples/pytorch_demo.py
"""

import argparse
import time

import horovod.torch as hvd
import torch
from torch import nn
from tqdm import tqdm

import pactrain_hvd.torch as pt
from pactrain_hvd.data import load_fashion_mnist

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--batch-size", type=int, default=64)
parser.add_argument("--train-samples", type=int, default=12000, help="per job, split across ranks")
parser.add_argument("--sparsity", type=float, default=0.9)
parser.add_argument("--fp16", action="store_true", help="carry packed values as fp16")
args = parser.parse_args()

hvd.init()
torch.manual_seed(42)
torch.set_num_threads(1)

train_images, train_labels = load_fashion_mnist("train")
test_images, test_labels = load_fashion_mnist("test")


def to_tensors(images, labels):
    return torch.from_numpy(images).float().div_(255).unsqueeze(1), torch.from_numpy(labels).long()


x_train, y_train = to_tensors(train_images[: args.train_samples], train_labels[: args.train_samples])
x_train, y_train = x_train[hvd.rank() :: hvd.size()], y_train[hvd.rank() :: hvd.size()]  # this rank's shard
x_test, y_test = to_tensors(test_images[:2000], test_labels[:2000])

model = nn.Sequential(
    nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
    nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10),
)
steps_per_epoch = len(x_train) // args.batch_size
optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size(), momentum=0.9)
optimizer = pt.DistributedOptimizer(  # the one changed line (was hvd.DistributedOptimizer)
    optimizer, named_parameters=model.named_parameters(),
    compression=hvd.Compression.fp16 if args.fp16 else hvd.Compression.none,
    sparsity=args.sparsity, begin_step=0, end_step=steps_per_epoch, frequency=max(1, steps_per_epoch // 8),
)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)

for epoch in range(args.epochs):
    model.train()
    order = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(epoch))
    sent = dense = 0
    losses = []
    start = time.perf_counter()
    bar = tqdm(range(steps_per_epoch), desc=f"epoch {epoch + 1}", disable=hvd.rank() != 0, leave=False, mininterval=2)
    for step in bar:
        index = order[step * args.batch_size : (step + 1) * args.batch_size]
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x_train[index]), y_train[index])
        loss.backward()
        optimizer.step()
        stats = optimizer.stats()
        sent, dense = sent + stats["sent_bytes"], dense + stats["dense_bytes"]
        losses.append(loss.item())
        bar.set_postfix(loss=f"{loss.item():.3f}", sparsity=f"{stats['sparsity']:.2f}")
    elapsed = time.perf_counter() - start
    model.eval()
    with torch.no_grad():
        correct = (model(x_test).argmax(1) == y_test).float().mean()
    accuracy = hvd.allreduce(correct, name="test_accuracy").item()
    mean_loss = hvd.allreduce(torch.tensor(sum(losses) / len(losses)), name="train_loss").item()
    if hvd.rank() == 0:
        print(f"epoch {epoch + 1}: loss {mean_loss:.4f}  test acc {accuracy:.4f}  "
              f"sparsity {optimizer.stats()['sparsity']:.3f}  "
              f"wire/step {sent / steps_per_epoch / 1e3:.1f} kB vs dense {dense / steps_per_epoch / 1e3:.1f} kB "
              f"({dense / sent:.1f}x less)  {steps_per_epoch * args.batch_size * hvd.size() / elapsed:.0f} samples/s",
              flush=True)
