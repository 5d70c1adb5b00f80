"""A steady-state step makes no host sync on the torch path (hooks, all-reduces, codec, update, re-mask).

On CPU nothing blocks, so syncs are counted where they would block on a GPU: the ``Tensor`` methods that
copy a device value to the host (``item``, ``__bool__``, ``__int__``, ``__float__``, ``__index__``,
``cpu``, ``tolist``, ``numpy``), called from PacTrain's or Horovod's code. The wrapped optimizer's own
(torch's Adam reads its step count with ``item()`` when not capturable) are not ours and not counted.
"""

import traceback
from contextlib import contextmanager
from pathlib import Path

import horovod
import pytest
import torch
from conftest import batch, make_model

import pactrain_hvd
import pactrain_hvd.torch as pt

_SYNCING = ("item", "__bool__", "__int__", "__float__", "__index__", "cpu", "tolist", "numpy")
_OURS = (str(Path(pactrain_hvd.__file__).parent), str(Path(horovod.__file__).parent))


@contextmanager
def counted_host_syncs():
    """Yields a list that collects ``(method, caller file:line)`` for every syncing call from our code."""
    calls = []
    own = {name: name in vars(torch.Tensor) for name in _SYNCING}
    originals = {name: getattr(torch.Tensor, name) for name in _SYNCING}

    def counting(name, original):
        def method(self, *args, **kwargs):
            caller = traceback.extract_stack(limit=2)[0]
            if caller.filename.startswith(_OURS):
                calls.append((name, f"{caller.filename}:{caller.lineno}"))
            return original(self, *args, **kwargs)
        return method

    for name, original in originals.items():
        setattr(torch.Tensor, name, counting(name, original))
    try:
        yield calls
    finally:
        for name, original in originals.items():
            if own[name]:
                setattr(torch.Tensor, name, original)
            else:
                delattr(torch.Tensor, name)


def train_step(model, opt, step):
    inputs, labels = batch(step)
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(inputs), labels).backward()
    opt.step()


@pytest.mark.parametrize("packed_values", ["inherit", "fp16", "ternary"])
@pytest.mark.parametrize("make_inner", [
    lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=1e-4),
    lambda params: torch.optim.Adam(params, lr=1e-3),
], ids=["sgd-momentum", "adam"])
def test_a_steady_state_step_makes_no_host_sync(packed_values, make_inner):
    model = make_model()
    opt = pt.DistributedOptimizer(make_inner(model.parameters()), named_parameters=model.named_parameters(),
                                  sparsity=0.9, begin_step=0, end_step=4, frequency=2, pack_min_numel=0,
                                  verify_every=10, packed_values=packed_values)
    for step in range(6):  # masks final after step 4; ternary holds a scale for every packed tensor
        train_step(model, opt, step)
    with counted_host_syncs() as calls:
        for step in range(6, 10):
            train_step(model, opt, step)
    stats = opt.stats()
    assert stats["step"] == 9 and any(t["packed"] for t in stats["tensors"].values()), "packed tensors travelled"
    assert calls == [], f"host syncs in steady-state steps: {calls}"
    with counted_host_syncs() as calls:  # the instrument sees syncs: step 10 runs a Mask Tracker check
        train_step(model, opt, 10)
    assert any("pruning.py" in where for _, where in calls), calls
