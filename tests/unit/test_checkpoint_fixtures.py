"""Checkpoints written by an earlier version load into today's states: one committed fixture of each format.

The fixtures (``fixtures/checkpoints``, written by its ``make.py`` on two ranks) hold rank 0's state after three
steps at sparsity 0.5 with int3 values. Here one process (Horovod of size 1) loads each: the masks, the schedule
position, the held scales and rank 0's error memory come back as saved, and the world size change is said.
"""

import io
import os
import socket
import warnings
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from pactrain_hvd.core import WorldSizeChangedWarning  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures" / "checkpoints"
SETTINGS = dict(sparsity=0.5, begin_step=0, end_step=0, ranking="layer", pack_min_numel=0, packed_values="int3")
PRUNED = ("0.weight", "2.weight")


def torch_model():
    return torch.nn.Sequential(torch.nn.Linear(32, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


@pytest.mark.parametrize("fixture, extra", [("torch.pt", {}), ("torch-local-steps.pt", {"sync_every": 2})])
def test_a_torch_checkpoint_of_the_committed_format_loads(fixture, extra):
    import horovod.torch as hvd

    import pactrain_hvd.torch as pt

    hvd.init()
    saved = pt.load_checkpoint(FIXTURES / fixture)
    model = torch_model()
    model.load_state_dict(saved["model"])
    opt = pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                  named_parameters=model.named_parameters(), **SETTINGS, **extra)
    with pytest.warns(WorldSizeChangedWarning, match="saved with world size 2"):
        opt.load_state_dict(saved["optimizer"])
    entry, state = saved["optimizer"]["pactrain"], opt.pactrain_state
    assert state.step_count == 3 and sorted(state.masks()) == list(PRUNED)
    for name in PRUNED:
        assert torch.equal(state.masks()[name], entry["masks"][name].bool())
        assert torch.count_nonzero(state.masks()[name]) == entry["masks"][name].numel() // 2
        assert not dict(model.named_parameters())[name][~state.masks()[name]].any(), "pruned weights stay 0"
    held = state.quantized.scale_vector(sorted(state.parameters))
    torch.testing.assert_close(held, entry["quantized_scales"], equal_nan=True)
    residuals = state.quantized.memory.state_dict()
    for name in PRUNED:
        assert torch.equal(residuals[name], entry["quantized"]["residuals"][name])
    if extra:
        for name, anchor in entry["outer"]["anchor"].items():
            assert torch.equal(state.outer.anchor[name], anchor)
            assert torch.equal(state.outer.momentum[name], entry["outer"]["momentum"][name])


def test_a_ddp_hook_state_of_the_committed_format_loads():
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from pactrain_hvd.torch.ddp import PacTrainHookState

    saved = torch.load(FIXTURES / "ddp.pt")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        module = torch_model()
        module.load_state_dict(saved["model"])
        model = DistributedDataParallel(module)
        state = PacTrainHookState(model, torch.optim.SGD(model.parameters(), lr=0.1), **SETTINGS)
        state.load_state_dict(saved["hook"])
        assert state.step_count == 3 and sorted(state.masks()) == list(PRUNED)
        for name in PRUNED:
            assert torch.equal(state.masks()[name], saved["hook"]["masks"][name].bool())
        residuals = state.memory.state_dict()
        for name, residual in saved["hook"]["quantized"]["residuals"].items():
            assert torch.equal(residuals[name], residual)
        now = state.state_dict()  # today's entry: the one format, with the world size it was written on
        assert now["world_size"] == 1 and now["step"] == 3 and set(now["masks"]) == set(PRUNED)
        with pytest.warns(WorldSizeChangedWarning, match="saved with world size 2, loading it with 1"):
            state.load_state_dict({**now, "world_size": 2})
    finally:
        dist.destroy_process_group()


def test_a_tensorflow_state_of_the_committed_format_loads():
    import horovod.tensorflow as hvd
    import keras

    import pactrain_hvd.tensorflow as pt

    hvd.init()
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(4)])
    with np.load(FIXTURES / "tensorflow-weights.npz") as weights:
        model.set_weights([weights[f"arr_{i}"] for i in range(len(weights.files))])
    blob = (FIXTURES / "tensorflow.npz").read_bytes()
    state = pt.PacTrainState(**SETTINGS)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        state.deserialize(blob)  # before binding: applied when the variables bind
        state.bind(model.trainable_variables)
    assert any(issubclass(w.category, WorldSizeChangedWarning) for w in caught)
    assert state.step_count == 3 and len(state.masks()) == 2
    with np.load(FIXTURES / "tensorflow.npz") as saved, np.load(io.BytesIO(state.serialize())) as again:
        for key in ("step", "positions", "mask_0", "mask_1", "quantized_rank", "scale_positions", "quantized_scales",
                    "residual_0", "residual_1"):
            np.testing.assert_array_equal(again[key], saved[key], err_msg=key)
        for i, position in enumerate(saved["positions"]):
            kernel = np.asarray(model.trainable_variables[position])
            assert not kernel[~saved[f"mask_{i}"].astype(bool)].any(), "pruned weights stay 0"
