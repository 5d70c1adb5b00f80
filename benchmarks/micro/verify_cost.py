"""Mask Tracker cost: one verification (fingerprints + allgather) against one training step, 2+ ranks.

    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \\
    horovodrun -np 2 -H localhost:2 --gloo python -m benchmarks.micro.verify_cost --model resnet18

Every rank uses one thread. The model is pruned once to ``--sparsity`` (masks of real density);
then, in the same processes, the script times full PacTrain steps (forward, backward, packed
all-reduce, SGD update) and ``Pruner.verify()`` alone (each repeat starts after a barrier, so
it measures the allgather's round trip, not a wait for the slower rank). Rank 0 prints medians,
the cost per verification against a step, and the amortised share for the default schedule
(``begin_step=0, end_step=1000, frequency=100``: 11 mask changes) and ``verify_every``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import horovod.torch as hvd
import torch

import pactrain_hvd.torch as pt
from benchmarks.common.models import build, loss_fn, synthetic_batch
from pactrain_hvd.core import PolynomialSchedule, fingerprint_table, mask_fingerprint
from pactrain_hvd.core.keywords import DEFAULT_VERIFY_EVERY


def verifications_per_run(steps: int, verify_every: int, schedule: PolynomialSchedule) -> int:
    """Mask Tracker checks in ``steps`` optimizer steps: one per mask change, one per ``verify_every`` steps."""
    changes = sum(schedule.is_update_step(step) for step in range(steps))
    periodic = steps // verify_every if verify_every else 0
    return changes + periodic


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--sparsity", type=float, default=0.9)
    parser.add_argument("--steps", type=int, default=6, help="timed training steps (after 2 warm-up steps)")
    parser.add_argument("--repeats", type=int, default=20, help="timed verifications")
    parser.add_argument("--run-steps", type=int, default=1000, help="length of the run the cost is amortised over")
    args = parser.parse_args()

    torch.set_num_threads(1)
    hvd.init()
    torch.manual_seed(0)
    model = build(args.model)
    opt = pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                                  named_parameters=model.named_parameters(), sparsity=args.sparsity,
                                  begin_step=0, end_step=0, verify_every=0)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    generator = torch.Generator().manual_seed(hvd.rank())

    def train_step() -> None:
        inputs, targets = synthetic_batch(args.model, args.batch_size, generator)
        opt.zero_grad()
        loss_fn(args.model, model(inputs), targets).backward()
        opt.step()

    def barrier() -> None:
        hvd.allreduce(torch.zeros(1), name="verify_cost.barrier")

    step_times, verify_times, fingerprint_times = [], [], []
    for index in range(args.steps + 2):  # step 0 prunes; two warm-up steps
        barrier()
        start = time.perf_counter()
        train_step()
        if index >= 2:
            step_times.append(time.perf_counter() - start)
    masks = {name: mask.numpy() for name, mask in opt.masks().items()}
    state = opt.pactrain_state
    prunable = {name: state.parameters[name].numel() for name in state.prunable_names}
    for _ in range(args.repeats + 1):
        barrier()
        start = time.perf_counter()
        state.verify()
        verify_times.append(time.perf_counter() - start)
        start = time.perf_counter()
        fingerprint_table(prunable, {name: mask_fingerprint(mask) for name, mask in masks.items()}, opt.step_count)
        fingerprint_times.append(time.perf_counter() - start)
    verify_times, fingerprint_times = verify_times[1:], fingerprint_times[1:]  # first call: warm-up

    gathered = hvd.allgather_object((statistics.median(step_times), statistics.median(verify_times),
                                     statistics.median(fingerprint_times)))
    if hvd.rank() != 0:
        return
    step_s = max(g[0] for g in gathered)  # a step ends when the slowest rank ends
    verify_s = max(g[1] for g in gathered)
    fingerprint_s = max(g[2] for g in gathered)
    schedule = PolynomialSchedule(args.sparsity)  # the default schedule
    count = verifications_per_run(args.run_steps, DEFAULT_VERIFY_EVERY, schedule)
    changes = sum(schedule.is_update_step(step) for step in range(args.run_steps))
    kept = sum(int(m.sum()) for m in masks.values())
    print(f"model {args.model}, batch {args.batch_size}, {hvd.size()} ranks, 1 thread each, "
          f"{len(masks)} masked tensors, {kept} kept coordinates (sparsity {args.sparsity})")
    print(f"step (median of {len(step_times)}, slowest rank): {step_s * 1e3:.1f} ms")
    print(f"verification (median of {args.repeats}, slowest rank): {verify_s * 1e3:.2f} ms "
          f"= {100 * verify_s / step_s:.3f} % of a step (hashing every mask, done once per mask change: "
          f"{fingerprint_s * 1e3:.2f} ms)")
    print(f"amortised at verify_every={DEFAULT_VERIFY_EVERY}: {100 * verify_s / DEFAULT_VERIFY_EVERY / step_s:.4f} % "
          f"of a step")
    print(f"over a {args.run_steps}-step run with the default schedule: {count} verifications ({changes} mask changes "
          f"+ {count - changes} periodic) = {100 * count * verify_s / (args.run_steps * step_s):.4f} % of training time")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
