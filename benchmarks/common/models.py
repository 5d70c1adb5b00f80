"""Benchmark models of real shapes, built here because torchvision is not installable beside torch 2.13."""

from __future__ import annotations

import torch
from torch import nn

from benchmarks.common.examples import example


class BasicBlock(nn.Module):
    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = nn.Sequential()
        if stride != 1 or inplanes != planes:
            self.shortcut = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNet18(nn.Module):
    """ResNet-18 for 32x32 inputs (CIFAR stem), 11.2M parameters."""

    def __init__(self, num_classes: int = 10, in_channels: int = 3) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(in_channels, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU())
        layers, inplanes = [], 64
        for planes, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers += [BasicBlock(inplanes, planes, stride), BasicBlock(planes, planes)]
            inplanes = planes
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


_VGG16 = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"]


class VGG16(nn.Module):
    """VGG-16 with batch norm for 32x32 inputs and a 512-512-classes head, 15.3M parameters."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        layers, channels = [], 3
        for item in _VGG16:
            if item == "M":
                layers.append(nn.MaxPool2d(2))
            else:
                layers += [nn.Conv2d(channels, item, 3, padding=1), nn.BatchNorm2d(item), nn.ReLU()]
                channels = item
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                                        nn.Linear(512, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


class DecoderBlock(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attention = nn.MultiheadAttention(width, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor, causal_mask: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attention(h, h, h, attn_mask=causal_mask, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    """GPT-style decoder LM. Defaults (vocab 8192, width 512, 6 layers): 27.4M parameters."""

    def __init__(self, vocab_size: int = 8192, width: int = 512, layers: int = 6, heads: int = 8, context: int = 128) -> None:
        super().__init__()
        self.token = nn.Embedding(vocab_size, width)
        self.position = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(DecoderBlock(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        causal = torch.triu(torch.full((length, length), float("-inf"), device=tokens.device), diagonal=1)
        x = self.token(tokens) + self.position(torch.arange(length, device=tokens.device))
        for block in self.blocks:
            x = block(x, causal)
        return self.head(self.norm(x))


def fashion_vgg() -> nn.Module:
    """``examples/pytorch_fashion_mnist.py``'s FashionVGG (4.3 M parameters, 28x28x1 inputs): the model the
    TensorFlow methods run too, in Keras (``examples/tensorflow2_fashion_mnist.py``)."""
    return example("pytorch_fashion_mnist").FashionVGG()


def build(name: str) -> nn.Module:
    """``resnet18``, ``vgg16``, ``gpt`` or ``fashion-vgg``."""
    models = {"resnet18": ResNet18, "vgg16": VGG16, "gpt": GPT, "fashion-vgg": fashion_vgg}
    if name not in models:
        raise ValueError(f"unknown model {name!r}: choose one of {', '.join(models)}")
    return models[name]()


def synthetic_batch(name: str, batch_size: int, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Random inputs and targets of the model's real shapes (as Horovod's synthetic benchmark)."""
    if name == "gpt":
        tokens = torch.randint(0, 8192, (batch_size, 129), generator=generator)
        return tokens[:, :-1], tokens[:, 1:]
    if name == "fashion-vgg":
        return torch.randn(batch_size, 1, 28, 28, generator=generator), torch.randint(0, 10, (batch_size,), generator=generator)
    return torch.randn(batch_size, 3, 32, 32, generator=generator), torch.randint(0, 10, (batch_size,), generator=generator)


def loss_fn(name: str, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    if name == "gpt":
        return nn.functional.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))
    return nn.functional.cross_entropy(output, target)
