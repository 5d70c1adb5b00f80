"""benchmarks/model/reference_models.py and regime_map.py: the published models' shapes and compute."""

import pytest

from benchmarks.model import regime_map
from benchmarks.model.reference_models import MODELS


@pytest.mark.parametrize("model, parameters", [("resnet18", 11_689_512), ("resnet50", 25_557_032),
                                               ("vgg16", 138_357_544), ("gpt2-small", 124_439_808)])
def test_parameter_counts_match_the_published_models(model, parameters):
    # torchvision's resnet18 / resnet50 / vgg16 and GPT-2 small's public checkpoint hold these many parameters
    assert sum(t.numel for t in MODELS[model][0]()) == parameters


def test_compute_scales_the_reference_step_by_multiply_adds():
    assert regime_map.compute_s(1.8e9, 128) == pytest.approx(1.28e-3 * 128)
    assert regime_map.compute_s(3.8e9, 64) == pytest.approx(1.28e-3 * 3.8 / 1.8 * 64)


def test_verdicts():
    assert [regime_map.verdict(r) for r in (0.5, 0.95, 1.0, 1.05, 2.0)] == ["win", "tie", "tie", "tie", "lose"]
