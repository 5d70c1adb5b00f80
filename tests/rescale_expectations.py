"""What ``rescale_survivors`` promises, on host arrays: one check for every frontend's multi-rank test."""

import numpy as np

from pactrain_hvd.core import survivor_scales


def assert_rescaled_once(broadcast: dict, after_step_0: dict, masks: dict, rescale: bool) -> None:
    """After step 0 at learning rate 0: each pruned tensor is its broadcast weights, masked, times its survivor
    scale where ``rescale`` (so it keeps its norm); every other tensor is as broadcast."""
    scales = survivor_scales({name: broadcast[name] for name in masks}, masks)
    assert all(1.5 < scale < 2.5 for scale in scales.values()), scales  # the top 10 % of a uniform init: ~1.9
    for name, weight in after_step_0.items():
        if name not in masks:
            assert np.array_equal(weight, broadcast[name]), f"{name} is not pruned, yet it changed"
            continue
        np.testing.assert_allclose(weight, broadcast[name] * masks[name] * (scales[name] if rescale else 1.0),
                                   rtol=1e-6, atol=0, err_msg=name)
        ratio = np.linalg.norm(weight) / np.linalg.norm(broadcast[name])
        assert abs(ratio - 1) < 1e-5 if rescale else ratio < 0.8, (name, ratio)
