"""``--profile``: measure here, on this machine's CPU (or the first GPU torch sees), one worker's compute
and each method's compression for the user's model.

Forward + backward of a random batch (``--input-shape``, ``--batch-size``; the loss is the output's mean, the
time does not depend on the values), the optimizer's update (SGD with momentum), and per method the
arithmetic its compression runs on every gradient: a cast to fp16 and back (fp16), a gather of the survivors
at 0.9 sparsity and a scatter back (PacTrain), ``torch.topk`` at 1 % and a scatter (Top-k), the rank-4
projections and the rebuild (PowerSGD). Medians of ``repeats`` timed runs after one untimed. Forward's
share of the compute is taken as a third (backward costs about twice forward). On a CPU the load average
as the measurement ended is kept beside the times: other work on the same cores inflates them.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from pactrain_hvd.planner.step_time import Costs


def _median_s(function: Callable[[], None], repeats: int, sync: Callable[[], None]) -> float:
    function()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(model: Any, input_shape: Sequence[int], batch_size: int, repeats: int = 2,
            integer_inputs: int | None = None) -> tuple[Costs, dict]:
    """``Costs`` of one worker's step of ``model`` (a module on the meta device is rebuilt for real by the
    caller), and what was measured. ``integer_inputs``: token ids below this (a language model) instead of
    normal floats."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    model = model.to(device)
    shape = (batch_size, *input_shape)
    inputs = (torch.randint(0, integer_inputs, shape, device=device) if integer_inputs
              else torch.randn(shape, device=device))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)

    def forward() -> Any:
        out = model(inputs)
        return (out if torch.is_tensor(out) else out[0]).float().mean()

    def forward_backward() -> None:
        optimizer.zero_grad(set_to_none=False)
        forward().backward()

    try:
        compute_s = _median_s(forward_backward, repeats, sync)
    except (RuntimeError, TypeError, ValueError) as error:
        raise ValueError(f"--input-shape {list(input_shape)}: the model's forward failed on a batch of that shape "
                         f"({error})") from None
    update_s = _median_s(optimizer.step, repeats, sync)
    # a sparse gradient (nn.Embedding(sparse=True)) timed as the dense tensor the planner models it as
    grads = [p.grad.to_dense() if p.grad.is_sparse else p.grad for p in model.parameters() if p.grad is not None]
    compress = {"dense": 0.0, **{kind: _median_s(run, repeats, sync) for kind, run in _codecs(grads).items()}}
    costs = Costs(compute_s=compute_s, update_s=update_s, compress_s=compress)
    measured = {"device": device, "batch_size": batch_size, "input_shape": list(input_shape),
                "forward_backward_s": compute_s, "update_s": update_s, "compress_s": compress}
    if device == "cpu":
        measured.update(load=os.getloadavg()[0], cpus=len(os.sched_getaffinity(0)))
    return costs, measured


def load_note(measured: dict) -> str:
    """``, load L on N cores`` for a CPU measurement, with a warning where the load average passed the core
    count (other work shared the CPU); empty for a GPU."""
    if "load" not in measured:
        return ""
    busy = measured["load"] > measured["cpus"]
    return (f", load {measured['load']:.1f} on {measured['cpus']} cores"
            + (": other work shared the CPU, so these times are high" if busy else ""))


def _codecs(grads: list) -> dict[str, Callable[[], None]]:
    import torch

    flat = [g.reshape(-1) for g in grads]
    survivors = [torch.randperm(f.numel(), device=f.device)[: max(1, f.numel() // 10)] for f in flat]
    big = [f for f in flat if f.numel() >= 4096]
    matrices = [g.reshape(g.shape[0], -1) for g in grads if g.dim() >= 2 and g.numel() >= 4096]
    qs = [torch.randn(m.shape[1], 4, device=m.device) for m in matrices]

    def fp16() -> None:
        for f in flat:
            f.half().float()

    def pactrain() -> None:
        for f, index in zip(flat, survivors):
            torch.zeros_like(f).index_copy_(0, index, f.index_select(0, index))

    def topk() -> None:
        for f in big:
            _, index = torch.topk(f.abs(), max(1, f.numel() // 100), sorted=False)
            torch.zeros_like(f).index_copy_(0, index, f.index_select(0, index))

    def powersgd() -> None:
        for m, q in zip(matrices, qs):
            p, _ = torch.linalg.qr(m @ q)
            (p @ (m.t() @ p).t())

    return {"fp16": fp16, "pactrain": pactrain, "topk": topk, "powersgd": powersgd}
