"""Fashion-MNIST with a small ResNet, trained with Horovod + PacTrain.

A plain Horovod training script (after Horovod's examples/pytorch/pytorch_mnist.py): the one
PacTrain change is the ``pt.DistributedOptimizer(...)`` line. Run it with either launcher::

    horovodrun -np 2 -H localhost:2 --gloo .venv/bin/python examples/pytorch_fashion_mnist.py
    mpirun --allow-run-as-root -np 2 .venv/bin/python examples/pytorch_fashion_mnist.py

Data: Debian's ``dataset-fashion-mnist`` package (``apt-get install dataset-fashion-mnist``).
TensorBoard: ``tensorboard --logdir runs``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import horovod.torch as hvd
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import pactrain_hvd.torch as pt
from example_support.cli import add_pactrain_arguments, schedule_arguments
from example_support.data import load_fashion_mnist
from example_support.progress import Progress
from example_support.torch_reporting import WireTally, global_sum, log_step, tensorboard_writer
from pactrain_hvd.core import rewound_cosine

# Training-set statistics of Fashion-MNIST pixels scaled to [0, 1].
PIXEL_MEAN, PIXEL_STD = 0.2860, 0.3530


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="PyTorch Fashion-MNIST with Horovod + PacTrain",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model", choices=sorted(MODELS), default="resnet",
                        help="resnet: 78 k parameters (fast); vgg: 4.3 M, communication-bound on a slow link")
    parser.add_argument("--batch-size", type=int, default=64, help="training batch size per worker")
    parser.add_argument("--test-batch-size", type=int, default=1000, help="evaluation batch size per worker")
    parser.add_argument("--epochs", type=int, default=2, help="epochs to train")
    parser.add_argument("--lr", type=float, default=0.05, help="learning rate per worker (scaled by the worker count)")
    parser.add_argument("--lr-schedule", choices=("constant", "cosine", "cosine-rewind"), default="constant",
                        help="cosine: anneal to 0 over the run, so the last steps do not decide the test score; "
                             "cosine-rewind: after the last mask change, anneal again from the rate of the first one")
    parser.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    parser.add_argument("--weight-decay", type=float, default=5e-4, help="SGD weight decay")
    parser.add_argument("--seed", type=int, default=42, help="random seed")
    parser.add_argument("--fp16", "--fp16-allreduce", dest="fp16", action="store_true",
                        help="fp16 values on the wire (hvd.Compression.fp16)")
    add_pactrain_arguments(parser)
    parser.add_argument("--max-steps", type=int, default=None, help="stop after this many optimizer steps in all")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per worker")
    parser.add_argument("--no-cuda", action="store_true", help="train on CPU even where CUDA is available")
    parser.add_argument("--data-dir", default=None, help="folder with the IDX .gz files (default: Debian's)")
    parser.add_argument("--logdir", default="runs/fashion_mnist", help="TensorBoard folder ('' for none)")
    parser.add_argument("--log-every", type=int, default=10, help="steps between TensorBoard points")
    parser.add_argument("--result-json", default=None, help="write the final metrics here (rank 0)")
    args = parser.parse_args(argv)
    args.cuda = not args.no_cuda and torch.cuda.is_available()
    return args


# -- model --------------------------------------------------------------------------------------
class BasicBlock(nn.Module):
    """Two 3x3 convolutions with batch norm and an identity (or 1x1 projection) shortcut."""

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                                          nn.BatchNorm2d(out_channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class FashionResNet(nn.Module):
    """28x28 -> 16 channels -> 32 @ 14x14 -> 64 @ 7x7 -> 10 classes; about 78k parameters."""

    def __init__(self, widths: tuple[int, int, int] = (16, 32, 64), num_classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, widths[0], 3, padding=1, bias=False), nn.BatchNorm2d(widths[0]),
                                  nn.ReLU())
        self.layer1 = BasicBlock(widths[0], widths[0])
        self.layer2 = BasicBlock(widths[0], widths[1], stride=2)
        self.layer3 = BasicBlock(widths[1], widths[2], stride=2)
        self.fc = nn.Linear(widths[2], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layer3(self.layer2(self.layer1(self.stem(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class FashionVGG(nn.Module):
    """VGG-style: two 3x3 conv pairs (32, 64 channels, batch norm) and a 3136-1024-1024-10 head;
    4.3 M parameters, 99 % of them in the head's weights, which PacTrain prunes. The workload
    PacTrain is for: on one CPU thread a batch-64 step is a fraction of a second, while its fp32
    gradient (17 MB) takes longer than that to cross a 100 Mbit/s link."""

    def __init__(self, widths: tuple[int, int] = (32, 64), hidden: int = 1024, num_classes: int = 10) -> None:
        super().__init__()

        def conv(c_in: int, c_out: int) -> list[nn.Module]:
            return [nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU()]

        self.features = nn.Sequential(*conv(1, widths[0]), *conv(widths[0], widths[0]), nn.MaxPool2d(2),
                                      *conv(widths[0], widths[1]), *conv(widths[1], widths[1]), nn.MaxPool2d(2))
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(widths[1] * 7 * 7, hidden), nn.ReLU(), nn.Dropout(0.3),
                                        nn.Linear(hidden, hidden), nn.ReLU(), nn.Dropout(0.3),
                                        nn.Linear(hidden, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


MODELS = {"resnet": FashionResNet, "vgg": FashionVGG}


# -- data ---------------------------------------------------------------------------------------
def make_loader(split: str, batch_size: int, data_dir: str | None,
                shuffle: bool) -> tuple[DataLoader, DistributedSampler]:
    """Each worker reads its shard (Horovod: DistributedSampler with num_replicas=hvd.size())."""
    images, labels = load_fashion_mnist(split, root=data_dir)
    dataset = TensorDataset(torch.from_numpy(images).unsqueeze(1), torch.from_numpy(labels))
    sampler = DistributedSampler(dataset, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=shuffle, seed=0)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler), sampler


def to_device(images: torch.Tensor, labels: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalized float images and labels on ``device``."""
    images = (images.to(device).float() / 255.0 - PIXEL_MEAN) / PIXEL_STD
    return images, labels.to(device)


# -- train and evaluate -------------------------------------------------------------------------
def train_epoch(model, optimizer, loader, epoch: int, state: dict, args, writer) -> dict:
    """One pass over this worker's shard (or up to --max-steps); returns averages over all workers."""
    model.train()
    tally, loss_sum, correct, seen = WireTally(), 0.0, 0, 0
    started = time.perf_counter()
    for images, labels in Progress(loader, desc=f"epoch {epoch}", enabled=hvd.rank() == 0):
        if args.max_steps is not None and state["step"] >= args.max_steps:
            break
        images, labels = to_device(images, labels, state["device"])
        optimizer.zero_grad()
        output = model(images)
        loss = F.cross_entropy(output, labels)
        loss.backward()
        optimizer.step()
        if state["scheduler"] is not None:
            state["scheduler"].step()
        stats = optimizer.stats()
        tally.add(stats)
        state["tally"].add(stats)
        batch_correct = int((output.argmax(1) == labels).sum())
        loss_sum, correct, seen = loss_sum + loss.item() * len(labels), correct + batch_correct, seen + len(labels)
        state["step"] += 1
        if writer is not None and state["step"] % args.log_every == 0:
            log_step(writer, state["step"], loss.item(), batch_correct / len(labels), stats)
    seconds = time.perf_counter() - started
    loss_sum, correct, seen = global_sum([loss_sum, correct, seen], f"train_metrics.{epoch}")
    return dict(tally.as_dict(hvd.size()), train_loss=loss_sum / max(seen, 1), train_accuracy=correct / max(seen, 1),
                samples=int(seen), train_seconds=seconds, samples_per_s=seen / seconds if seconds else 0.0)


@torch.no_grad()
def evaluate(model, loader, device: torch.device, name: str) -> tuple[float, float]:
    """(loss, top-1 accuracy) over the whole test set, each worker scoring its shard."""
    model.eval()
    loss_sum, correct, seen = 0.0, 0, 0
    for images, labels in loader:
        images, labels = to_device(images, labels, device)
        output = model(images)
        loss_sum += float(F.cross_entropy(output, labels, reduction="sum"))
        correct += int((output.argmax(1) == labels).sum())
        seen += len(labels)
    loss_sum, correct, seen = global_sum([loss_sum, correct, seen], name)
    return loss_sum / seen, correct / seen


def report_epoch(epoch: int, metrics: dict) -> None:
    if hvd.rank() != 0:
        return
    steps = max(metrics["steps"], 1)
    print(f"epoch {epoch}: loss {metrics['train_loss']:.4f} train acc {metrics['train_accuracy']:.4f} "
          f"test loss {metrics['test_loss']:.4f} test acc {metrics['test_accuracy']:.4f} "
          f"sparsity {metrics['sparsity']:.3f} sent {metrics['sent_bytes'] / steps / 1e3:.1f} kB/step "
          f"vs dense {metrics['dense_bytes'] / steps / 1e3:.1f} kB/step "
          f"({metrics['compression_ratio']:.2f}x) {metrics['samples_per_s']:.0f} samples/s", flush=True)


def make_scheduler(optimizer: pt.DistributedOptimizer, kind: str, total_steps: int) -> torch.optim.lr_scheduler.LRScheduler | None:
    """``kind``'s learning-rate schedule; ``cosine-rewind`` rewinds it at the last mask change (``rewound_cosine``)."""
    if kind == "constant":
        return None
    if kind == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer.optimizer, T_max=max(total_steps, 1))
    return torch.optim.lr_scheduler.LambdaLR(optimizer.optimizer, rewound_cosine(optimizer.config.schedule, total_steps))


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    hvd.init()
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)  # Horovod: limit CPU threads per worker
    if args.cuda:
        torch.cuda.set_device(hvd.local_rank())  # Horovod: pin GPU to local rank
    device = torch.device("cuda" if args.cuda else "cpu")

    train_loader, train_sampler = make_loader("train", args.batch_size, args.data_dir, shuffle=True)
    test_loader, _ = make_loader("test", args.test_batch_size, args.data_dir, shuffle=False)
    total_steps = args.epochs * len(train_loader)
    if args.max_steps is not None:
        total_steps = min(total_steps, args.max_steps)

    model = MODELS[args.model]().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=args.momentum,
                                weight_decay=args.weight_decay)
    compression = hvd.Compression.fp16 if args.fp16 else hvd.Compression.none
    # The PacTrain line: was hvd.DistributedOptimizer(optimizer, named_parameters=..., compression=...).
    optimizer = pt.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), compression=compression,
                                        sparsity=args.sparsity, **schedule_arguments(args, total_steps),
                                        packed_values=args.packed_values, ranking=args.ranking)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    schedule = optimizer.config.schedule
    begin, end, frequency = schedule.begin_step, schedule.end_step, schedule.frequency
    parameters = sum(p.numel() for p in model.parameters())

    writer = tensorboard_writer(args.logdir)
    if hvd.rank() == 0:
        print(f"Fashion-MNIST on {hvd.size()} workers: {parameters} parameters, "
              f"{total_steps} steps, sparsity {args.sparsity} (prune steps {begin}..{end} every {frequency}), "
              f"fp16 {args.fp16}, packed values {args.packed_values}", flush=True)
    scheduler = make_scheduler(optimizer, args.lr_schedule, total_steps)
    state = {"step": 0, "tally": WireTally(), "device": device, "scheduler": scheduler}
    history = []
    started = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        if args.max_steps is not None and state["step"] >= args.max_steps:
            break
        train_sampler.set_epoch(epoch)
        metrics = train_epoch(model, optimizer, train_loader, epoch, state, args, writer)
        metrics["test_loss"], metrics["test_accuracy"] = evaluate(model, test_loader, device, f"test_metrics.{epoch}")
        metrics.update(epoch=epoch, step=state["step"], sparsity=optimizer.stats()["sparsity"])
        history.append(metrics)
        report_epoch(epoch, metrics)
        if writer is not None:
            for key in ("test_loss", "test_accuracy", "samples_per_s"):
                writer.add_scalar(f"epoch/{key}", metrics[key], state["step"])
    wall_seconds = time.perf_counter() - started

    last = history[-1] if history else {}
    result = dict(
        example="fashion_mnist", world_size=hvd.size(), sparsity_target=args.sparsity, fp16=args.fp16, packed_values=args.packed_values, lr_schedule=args.lr_schedule,
        epochs=len(history), batch_size=args.batch_size, seed=args.seed, prune_schedule=[begin, end, frequency], ranking=args.ranking, parameters=parameters,
        sparsity=optimizer.stats()["sparsity"], test_accuracy=last.get("test_accuracy"),
        test_loss=last.get("test_loss"),
        train_loss=last.get("train_loss"), wall_seconds=wall_seconds,
        samples_per_s=sum(m["samples"] for m in history) / max(sum(m["train_seconds"] for m in history), 1e-9),
        **state["tally"].as_dict(hvd.size()), history=history,
    )
    if writer is not None:
        writer.close()
    if hvd.rank() == 0:
        print(f"done: test accuracy {result['test_accuracy']:.4f}, sparsity {result['sparsity']:.3f}, "
              f"sent {result['sent_bytes'] / 1e6:.2f} MB vs dense {result['dense_bytes'] / 1e6:.2f} MB "
              f"({result['compression_ratio']:.2f}x), {wall_seconds:.1f} s", flush=True)
        if args.result_json:
            Path(args.result_json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.result_json).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
