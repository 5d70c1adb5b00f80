"""The optimizer's own update on pruned tensors: one process, no Horovod, no PacTrain code.

    python -m benchmarks.micro.update_cost --workload language    # AdamW + clipping, the char-GPT
    python -m benchmarks.micro.update_cost --workload image       # SGD with momentum, FashionVGG

Times the plain update (clip where the workload clips, then ``optimizer.step()``) of a
time-to-accuracy workload twice on the same gradients: dense, then with ``--sparsity`` of every
prunable tensor's coordinates at exactly 0 in the weights, gradients and optimizer state (what
PacTrain leaves there). The difference is the optimizer's arithmetic on zeros, which a PacTrain
run's update phase includes but no PacTrain pass causes.

Each of torch's implementations of the update is timed (``--implementations``): ``default`` (what the
workload builds: on CPU torch picks the for-loop one), ``for-loop``, ``foreach`` and ``fused``. On this
CPU torch's ``sqrt`` kernel is many times slower on exact zeros than on normal numbers (the last line
prints it); the for-loop and foreach Adam updates take a square root of every second moment, the fused
kernel does not go through that kernel.
"""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import torch

from benchmarks.micro.micro_pack import median_seconds
from benchmarks.tta import tta_worker


def update_seconds(model: torch.nn.Module, optimizer: torch.optim.Optimizer, clip_norm: float, repeats: int) -> float:
    def update() -> None:
        if clip_norm:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
        optimizer.step()

    return median_seconds(update, repeats)


@torch.no_grad()
def zero_out(model: torch.nn.Module, optimizer: torch.optim.Optimizer, sparsity: float) -> None:
    """``sparsity`` of every prunable (>= 2-D) tensor's coordinates to 0 in weight, gradient and state."""
    generator = torch.Generator().manual_seed(0)
    for p in model.parameters():
        if p.dim() >= 2:
            pruned = torch.rand(p.shape, generator=generator) < sparsity
            p.masked_fill_(pruned, 0)
            p.grad.masked_fill_(pruned, 0)
            for value in optimizer.state[p].values():
                if torch.is_tensor(value) and value.shape == p.shape:
                    value.masked_fill_(pruned, 0)


# Keyword arguments that make torch pick one implementation of a built-in optimizer's update.
IMPLEMENTATIONS = {"default": {}, "for-loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}


def rebuilt(optimizer: torch.optim.Optimizer, implementation: str) -> torch.optim.Optimizer:
    """The same optimizer and parameter groups, with ``implementation``'s update."""
    groups = [{**group, **IMPLEMENTATIONS[implementation]} for group in optimizer.param_groups]
    return type(optimizer)(groups)


def dense_and_zeros(workload: str, implementation: str, sparsity: float, repeats: int) -> tuple[str, float, float]:
    """(optimizer name, dense update seconds, update seconds with ``sparsity`` zeros) on a fresh workload."""
    torch.manual_seed(0)
    settings = SimpleNamespace(workload=workload, batch_size=None, eval_samples=500, eval_batches=1, seed=1)
    job = tta_worker.build_workload(settings, rank=0, size=1)
    optimizer = rebuilt(job.make_optimizer(job.model, 1), implementation)
    inputs, targets = job.next_batch()
    job.loss(job.model(inputs), targets).backward()
    dense = update_seconds(job.model, optimizer, job.clip_norm, repeats)
    zero_out(job.model, optimizer, sparsity)
    return type(optimizer).__name__, dense, update_seconds(job.model, optimizer, job.clip_norm, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=("image", "language"), default="language")
    parser.add_argument("--sparsity", type=float, default=0.9)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--implementations", nargs="+", choices=tuple(IMPLEMENTATIONS), default=list(IMPLEMENTATIONS))
    args = parser.parse_args()
    torch.set_num_threads(1)  # as the benchmark's workers
    for implementation in args.implementations:
        name, dense, sparse = dense_and_zeros(args.workload, implementation, args.sparsity, args.repeats)
        print(f"workload={args.workload} optimizer={name} implementation={implementation} "
              f"threads={torch.get_num_threads()} dense_update_ms={dense * 1e3:.1f} "
              f"update_with_{args.sparsity:g}_zero_ms={sparse * 1e3:.1f} ratio={sparse / dense:.2f}")
    numel = 1 << 22
    zeros, ones = torch.zeros(numel), torch.ones(numel)
    print(f"torch.sqrt of {numel} elements: zeros {median_seconds(lambda: torch.sqrt(zeros), args.repeats) * 1e3:.2f} ms, "
          f"ones {median_seconds(lambda: torch.sqrt(ones), args.repeats) * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
