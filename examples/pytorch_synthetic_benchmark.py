"""PyTorch synthetic benchmark with Horovod + PacTrain (after Horovod's pytorch_synthetic_benchmark.py).

Same flags, output and timing as Horovod's script, with ``pt.DistributedOptimizer`` in place of
``hvd.DistributedOptimizer``. The models are torchvision-compatible ResNets built here (same
layers, parameter names and counts: resnet18 has 11,689,512 parameters) because torchvision is
not a dependency. Pruning is one-shot at step 0 (``--prune-step``), so every timed batch runs at
the final sparsity. Adasum is not offered: packed all-reduce supports Average/Sum/Min/Max.

    horovodrun -np 2 -H localhost:2 --gloo .venv/bin/python examples/pytorch_synthetic_benchmark.py \\
        --model resnet18 --batch-size 8 --image-size 64 --num-iters 3
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import horovod.torch as hvd
import numpy as np
import torch
import torch.backends.cudnn as cudnn
import torch.nn.functional as F
from torch import nn

import pactrain_hvd.torch as pt
from example_support.progress import Progress
from example_support.torch_reporting import log_wire, tensorboard_writer
from pactrain_hvd.core import ring_allreduce_bytes


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="PyTorch Synthetic Benchmark with Horovod + PacTrain",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--fp16-allreduce", "--fp16", dest="fp16_allreduce", action="store_true",
                        help="use fp16 compression during allreduce")
    parser.add_argument("--model", choices=sorted(RESNETS), default="resnet18", help="model to benchmark")
    parser.add_argument("--batch-size", type=int, default=32, help="input batch size")
    parser.add_argument("--image-size", type=int, default=224, help="height and width of the synthetic images")
    parser.add_argument("--num-classes", type=int, default=1000, help="classes of the synthetic labels")
    parser.add_argument("--num-warmup-batches", type=int, default=10,
                        help="number of warm-up batches that don't count towards benchmark")
    parser.add_argument("--num-batches-per-iter", type=int, default=10,
                        help="number of batches per benchmark iteration")
    parser.add_argument("--num-iters", "--epochs", dest="num_iters", type=int, default=10,
                        help="number of benchmark iterations")
    parser.add_argument("--no-cuda", action="store_true", default=False, help="disables CUDA training")
    parser.add_argument("--sparsity", type=float, default=0.9, help="PacTrain sparsity; 0 is plain Horovod")
    parser.add_argument("--prune-step", type=int, default=0, help="the optimizer step that prunes (one shot)")
    parser.add_argument("--max-steps", type=int, default=None,
                        help="stop after this many batches in all (warm-up included)")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per worker")
    parser.add_argument("--seed", type=int, default=42, help="random seed")
    parser.add_argument("--logdir", default="runs/synthetic_benchmark", help="TensorBoard folder ('' for none)")
    parser.add_argument("--result-json", default=None, help="write the final metrics here (rank 0)")
    args = parser.parse_args(argv)
    args.cuda = not args.no_cuda and torch.cuda.is_available()
    return args


# -- ResNet, torchvision's layout ---------------------------------------------------------------
def conv3x3(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)


def conv1x1(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, kernel_size=1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int, downsample: nn.Module | None, norm_layer) -> None:
        super().__init__()
        self.conv1 = conv3x3(inplanes, planes, stride)
        self.bn1 = norm_layer(planes)
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = norm_layer(planes)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + identity)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int, downsample: nn.Module | None, norm_layer) -> None:
        super().__init__()
        self.conv1 = conv1x1(inplanes, planes)
        self.bn1 = norm_layer(planes)
        self.conv2 = conv3x3(planes, planes, stride)
        self.bn2 = norm_layer(planes)
        self.conv3 = conv1x1(planes, planes * self.expansion)
        self.bn3 = norm_layer(planes * self.expansion)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        return F.relu(self.bn3(self.conv3(out)) + identity)


class ResNet(nn.Module):
    """He et al. 2016, laid out as torchvision.models.ResNet (names match its state dict)."""

    def __init__(self, block: type[nn.Module], layers: list[int], num_classes: int = 1000,
                 norm_layer=nn.BatchNorm2d) -> None:
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = norm_layer(64)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(block, 64, layers[0], 1, norm_layer)
        self.layer2 = self._make_layer(block, 128, layers[1], 2, norm_layer)
        self.layer3 = self._make_layer(block, 256, layers[2], 2, norm_layer)
        self.layer4 = self._make_layer(block, 512, layers[3], 2, norm_layer)
        self.fc = nn.Linear(512 * block.expansion, num_classes)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    def _make_layer(self, block, planes: int, blocks: int, stride: int, norm_layer) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(conv1x1(self.inplanes, planes * block.expansion, stride),
                                       norm_layer(planes * block.expansion))
        layers = [block(self.inplanes, planes, stride, downsample, norm_layer)]
        self.inplanes = planes * block.expansion
        layers += [block(self.inplanes, planes, 1, None, norm_layer) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(F.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


RESNETS = {
    "resnet18": (BasicBlock, [2, 2, 2, 2]),
    "resnet34": (BasicBlock, [3, 4, 6, 3]),
    "resnet50": (Bottleneck, [3, 4, 6, 3]),
}


def build_model(name: str, num_classes: int, norm_layer=nn.BatchNorm2d) -> ResNet:
    block, layers = RESNETS[name]
    return ResNet(block, layers, num_classes=num_classes, norm_layer=norm_layer)


# -- reporting ----------------------------------------------------------------------------------
def log(message: str) -> None:
    if hvd.rank() == 0:
        print(message, flush=True)


def log_iteration(writer, iteration: int, img_sec: float, stats: dict) -> None:
    writer.add_scalar("benchmark/img_per_sec_per_worker", img_sec, iteration)
    log_wire(writer, iteration, stats)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    hvd.init()
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    if args.cuda:
        torch.cuda.set_device(hvd.local_rank())  # Horovod: pin GPU to local rank
    cudnn.benchmark = True

    # Horovod's benchmark synchronizes batch norm across workers; hvd.SyncBatchNorm needs CUDA.
    model = build_model(args.model, args.num_classes, norm_layer=hvd.SyncBatchNorm if args.cuda else nn.BatchNorm2d)
    if args.cuda:
        model.cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size())
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    # The PacTrain line: was hvd.DistributedOptimizer(optimizer, named_parameters=..., compression=...).
    optimizer = pt.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), compression=compression,
                                        sparsity=args.sparsity, begin_step=args.prune_step, end_step=args.prune_step)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    data = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
    target = torch.randint(0, args.num_classes, (args.batch_size,))
    if args.cuda:
        data, target = data.cuda(), target.cuda()
    budget = {"left": args.max_steps if args.max_steps is not None else float("inf")}

    def benchmark_steps(count: int) -> int:
        """Run up to ``count`` training steps within the --max-steps budget; returns how many ran."""
        count = int(min(count, budget["left"]))
        for _ in range(count):
            optimizer.zero_grad()
            loss = F.cross_entropy(model(data), target)
            loss.backward()
            optimizer.step()
        if args.cuda:
            torch.cuda.synchronize()
        budget["left"] -= count
        return count

    device = "GPU" if args.cuda else "CPU"
    log(f"Model: {args.model} ({sum(p.numel() for p in model.parameters())} parameters)")
    log(f"Batch size: {args.batch_size}, image size: {args.image_size}")
    log(f"Number of {device}s: {hvd.size()}")
    log(f"PacTrain sparsity: {args.sparsity} (one-shot at step {args.prune_step}), "
        f"fp16 all-reduce: {args.fp16_allreduce}")

    writer = tensorboard_writer(args.logdir)
    log("Running warmup...")
    started = time.perf_counter()
    benchmark_steps(args.num_warmup_batches)
    log("Running benchmark...")
    img_secs, steps, sent_bytes, dense_bytes = [], 0, 0, 0
    # Each iteration writes its own line; the bar (a terminal) or one closing line (a log) adds the count.
    bar = Progress(range(args.num_iters), desc="benchmark", unit="iter", enabled=hvd.rank() == 0, every_percent=100)
    for iteration in bar:
        tic = time.perf_counter()
        ran = benchmark_steps(args.num_batches_per_iter)
        if ran == 0:
            break
        img_sec = args.batch_size * ran / (time.perf_counter() - tic)
        stats = optimizer.stats()
        steps += ran
        sent_bytes, dense_bytes = sent_bytes + ran * stats["sent_bytes"], dense_bytes + ran * stats["dense_bytes"]
        bar.write(f"Iter #{iteration}: {img_sec:.1f} img/sec per {device}")
        img_secs.append(img_sec)
        if writer is not None:
            log_iteration(writer, iteration, img_sec, stats)
    wall_seconds = time.perf_counter() - started

    img_sec_mean = float(np.mean(img_secs)) if img_secs else 0.0
    img_sec_conf = float(1.96 * np.std(img_secs)) if img_secs else 0.0
    stats = optimizer.stats()
    log(f"Img/sec per {device}: {img_sec_mean:.1f} +-{img_sec_conf:.1f}")
    log(f"Total img/sec on {hvd.size()} {device}(s): {hvd.size() * img_sec_mean:.1f} +-{hvd.size() * img_sec_conf:.1f}")
    log(f"Sparsity {stats['sparsity']:.3f}: sent {stats['sent_bytes'] / 1e6:.2f} MB/step vs dense "
        f"{stats['dense_bytes'] / 1e6:.2f} MB/step ({stats['compression_ratio']:.2f}x), ring all-reduce "
        f"{ring_allreduce_bytes(stats['sent_bytes'], hvd.size()) / 1e6:.2f} MB/step per worker")
    result = dict(
        example="synthetic_benchmark", model=args.model, world_size=hvd.size(), device=device,
        batch_size=args.batch_size, image_size=args.image_size, sparsity_target=args.sparsity,
        sparsity=stats["sparsity"], fp16=args.fp16_allreduce, img_sec_per_worker=img_sec_mean,
        img_sec_conf=img_sec_conf, img_sec_total=hvd.size() * img_sec_mean, img_secs=img_secs, steps=steps,
        sent_bytes=sent_bytes, dense_bytes=dense_bytes,
        compression_ratio=dense_bytes / sent_bytes if sent_bytes else 1.0,
        ring_bytes_per_worker=ring_allreduce_bytes(sent_bytes, hvd.size()), wall_seconds=wall_seconds,
    )
    if writer is not None:
        writer.close()
    if hvd.rank() == 0 and args.result_json:
        Path(args.result_json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.result_json).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
