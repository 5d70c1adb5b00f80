"""The representative workloads are the size PacTrain is for: millions of parameters, nearly all prunable."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from pytorch_char_lm import CharGPT  # noqa: E402
from pytorch_fashion_mnist import FashionVGG  # noqa: E402

from pactrain_hvd.torch.pruning import default_prunable  # noqa: E402


@pytest.mark.parametrize("make, low, high", [
    (lambda: FashionVGG(), 3e6, 15e6),
    (lambda: CharGPT(77, 128, 320, 4, 4), 5e6, 20e6),
], ids=["image-vgg", "language-gpt"])
def test_representative_workloads_are_millions_of_mostly_prunable_parameters(make, low, high):
    model = make()
    named = dict(model.named_parameters())
    total = sum(p.numel() for p in named.values())
    prunable = sum(p.numel() for name, p in named.items() if default_prunable(name, p))
    assert low <= total <= high
    assert prunable / total > 0.95


def test_the_image_workload_classifies_fashion_mnist_shaped_batches():
    logits = FashionVGG()(torch.zeros(2, 1, 28, 28))
    assert logits.shape == (2, 10)
