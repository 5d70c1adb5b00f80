"""The representative workloads are the size PacTrain is for: millions of parameters, nearly all prunable."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from pytorch_char_lm import CharGPT, clipped_step, default_warmup, warmup_cosine  # noqa: E402
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


def test_the_language_schedule_warms_up_linearly_then_decays_to_zero():
    factor = warmup_cosine(total_steps=100, warmup_steps=10)
    assert [factor(s) for s in (0, 4, 9)] == pytest.approx([0.1, 0.5, 1.0])
    assert factor(10) == pytest.approx(1.0)
    assert factor(55) == pytest.approx(0.5)
    assert factor(100) == pytest.approx(0.0, abs=1e-12)
    assert factor(150) == pytest.approx(0.0, abs=1e-12)  # past the end: stays at 0, does not come back up
    assert default_warmup(945) == 47 and default_warmup(100) == 20


def test_clipped_step_on_a_plain_optimizer_clips_the_gradient_norm_before_stepping():
    weight = torch.nn.Parameter(torch.zeros(4))
    weight.grad = torch.full((4,), 3.0)  # norm 6
    clipped_step(torch.optim.SGD([weight], lr=1.0), [weight], clip_norm=1.0)
    assert weight.detach().tolist() == pytest.approx([-0.5] * 4)
