"""The planner's virtual workers against a real 2-rank Horovod run: the same weights after the same steps.

Every rank trains a tiny model for a few steps with a real optimizer (PacTrain with fp32 values, Top-k with error
feedback, PacTrain with ternary values, PowerSGD), each on its own micro-batch; then, in the same process, it replays the
run with ``pactrain_hvd.planner.VirtualWorkers``: both ranks' micro-batch gradients on one model copy, reduced by
the virtual workers, the same torch optimizer. With 2 ranks a sum of two values does not depend on its order, so
where the arithmetic is the same the weights must be equal bit for bit.
"""

import faulthandler

import horovod.torch as hvd
import numpy as np
import pytest
import torch

import pactrain_hvd.torch as pt
from benchmarks.baselines.powersgd import PowerSGDDistributedOptimizer
from benchmarks.baselines.topk import TopKDistributedOptimizer
from pactrain_hvd.planner import VirtualWorkers, parse_method
from pactrain_hvd.torch.lanes import Noise

STEPS = 4


@pytest.fixture(autouse=True)
def deadline():
    """A hung collective fails the run (every rank prints its stack and exits) instead of holding the suite."""
    faulthandler.dump_traceback_later(300, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


class Tiny(torch.nn.Module):
    """One prunable matrix of 4,096 elements (Top-k compresses it, PacTrain packs it) and two 1-D tensors."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(7)
        self.fc = torch.nn.Linear(64, 64)
        self.head = torch.nn.Parameter(torch.randn(64) / 8)

    def forward(self, x):
        return (torch.relu(self.fc(x)) * self.head).sum(-1)


def micro_batch(rank: int, step: int):
    generator = torch.Generator().manual_seed(100 * rank + step)
    x = torch.randn(16, 64, generator=generator)
    return x, x[:, :8].sum(-1)


def gradients(model, rank: int, step: int) -> dict[str, np.ndarray]:
    model.zero_grad()
    x, y = micro_batch(rank, step)
    torch.nn.functional.mse_loss(model(x), y).backward()
    return {name: p.grad.detach().numpy().copy() for name, p in model.named_parameters()}


def sgd(model):
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def real_run(make_optimizer) -> tuple[dict[str, torch.Tensor], dict[str, np.ndarray]]:
    model = Tiny()
    opt = make_optimizer(model)
    for step in range(STEPS):
        opt.zero_grad()
        x, y = micro_batch(hvd.rank(), step)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    masks = {name: m.numpy() for name, m in opt.masks().items()} if hasattr(opt, "masks") else {}
    return {name: p.detach().clone() for name, p in model.named_parameters()}, masks


def virtual_run(virtual: VirtualWorkers, masks: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    model = Tiny()
    opt = sgd(model)
    for step in range(STEPS):
        per_rank = [gradients(model, rank, step) for rank in range(virtual.workers)]
        for name, p in model.named_parameters():
            p.grad = torch.from_numpy(virtual.reduce(name, [g[name] for g in per_rank], masks.get(name)))
        opt.step()
        with torch.no_grad():  # PacTrain keeps pruned weights at 0
            for name, p in model.named_parameters():
                if name in masks:
                    p.mul_(torch.from_numpy(masks[name]))
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def torch_noise(rank: int, name: str, step: int, count: int) -> np.ndarray:
    """A rank's rounding noise for a tensor and step as the library draws it (``pactrain_hvd.torch.lanes.Noise``)."""
    return Noise(rank).uniform(name, step, count, torch.device("cpu")).numpy()


def all_true(flag: bool, name: str) -> bool:
    return bool(hvd.allreduce(torch.tensor([int(flag)]), op=hvd.Min, name=f"virtual.check.{name}").item())


def pactrain(values: str, **extra):
    def make(model):
        return pt.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters(), sparsity=0.9,
                                       ranking="layer", begin_step=0, end_step=0, pack_min_numel=0,
                                       packed_values=values, **extra)
    return make


@pytest.mark.parametrize("method, make", [
    ("pactrain-0.9", pactrain("fp32")),
    ("topk", lambda model: TopKDistributedOptimizer(sgd(model), model.named_parameters(), density=0.01)),
])
def test_virtual_workers_equal_a_real_run_bit_for_bit(method, make):
    """PacTrain with fp32 values (the masked mean) and Top-k with error feedback (each rank's own top-k set of
    gradient + memory, the pairs summed in rank order over the size): the same arithmetic, the same weights."""
    real, masks = real_run(make)
    assert method == "topk" or set(masks) == {"fc.weight"}
    replayed = virtual_run(VirtualWorkers(parse_method(method), hvd.size()), masks)
    for name, weight in real.items():
        assert all_true(torch.equal(weight, replayed[name]), f"{method}.{name}"), f"{method}: {name} differs"


def test_virtual_workers_equal_a_real_run_with_ternary_values_bit_for_bit():
    """Ternary values, given the library's noise (``noise=``: torch's generator seeded for the rank, tensor and
    step), the same held MAX scale and the same int32 lanes. Left to its default,
    numpy's noise, a virtual run equals a real one in distribution only. The scale is ``2 x mean |value|``, taken
    by numpy on one side and torch on the other: here the two means agree to the bit; on a tensor where their
    summation orders round differently, a scale one ulp apart would move the weights by about that much."""
    make = pactrain("ternary", compression=hvd.Compression.fp16)
    real, masks = real_run(make)
    replayed = virtual_run(VirtualWorkers(parse_method("pactrain-0.9-ternary"), hvd.size(), noise=torch_noise),
                           masks)
    for name, weight in real.items():
        assert all_true(torch.equal(weight, replayed[name]), f"ternary.{name}"), \
            f"ternary: {name} differs by {(weight - replayed[name]).abs().max()}"
    moved = any(not torch.equal(real[name], Tiny().state_dict()[name]) for name in real)
    assert moved, "the run must have moved the weights"



def test_virtual_workers_follow_a_real_powersgd_run_to_float32_rounding():
    """PowerSGD rank 4 with error feedback and warm start, the first Q drawn as the baseline draws it (torch, seed 0).
    The virtual side multiplies and orthonormalises with numpy, the real one with torch: both in float32, with
    different blocking and LAPACK paths, so each product differs in its last bits and the error memory carries
    the difference on. After 4 steps the weights agree to 1e-5 relative (1e-6 absolute); a wrong factorisation
    (another rank, no error feedback) misses by orders of magnitude more."""
    real, _ = real_run(lambda model: PowerSGDDistributedOptimizer(sgd(model), model.named_parameters(), rank=4))
    start = torch.Generator().manual_seed(0)
    virtual = VirtualWorkers(parse_method("powersgd"), hvd.size(),
                             initial_q=lambda name, rank, cols: torch.randn(rank, cols, generator=start).numpy())
    replayed = virtual_run(virtual, {})
    for name, weight in real.items():
        close = torch.allclose(weight, replayed[name], rtol=1e-5, atol=1e-6)
        assert all_true(close, f"powersgd.{name}"), f"powersgd: {name} differs by {(weight - replayed[name]).abs().max()}"
