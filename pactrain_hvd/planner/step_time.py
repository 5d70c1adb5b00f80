"""Step time per method: compute, the method's CPU cost, and the wire time that backward does not hide.

A method's ``Traffic`` (``planner.payload``) becomes a ``step_model.StepPlan``: the hooked transfers are
handed to Horovod's background loop as backward reaches them (so they overlap the rest of backward as far
as the link keeps up), PowerSGD's two rounds block after backward. ``step_model.expected_step`` runs the
ring collectives (``2 (n-1)`` latencies plus ``2 (n-1)/n`` of the buffer over the link for an all-reduce;
``n - 1`` latencies and ``n - 1`` contributions for an allgather) through Horovod's cycle and fusion.

The CPU cost of compression (``Costs.compress_s``, seconds per step at 2 workers) is split as the
repository's profile measured it (``reports/step_model/profile.json``, the image workload): Top-k selects in
the hook and scatters one index set per worker after the last transfer; PowerSGD projects ``P``, then ``Q``,
then rebuilds; the other methods cast or pack in the hook and unpack after.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from pactrain_hvd.planner.coordination import Coordination, with_coordination
from pactrain_hvd.planner.methods import Method
from pactrain_hvd.planner.payload import Tensor, Traffic, traffic
from pactrain_hvd.planner.step_model import (
    HOROVOD_DEFAULT_CYCLE_TIME_S,
    HorovodConfig,
    Link,
    Stage,
    StepPlan,
)

# reports/step_model/profile.json, workloads.image: top-k select 12.0 ms, zero 0.66 ms, scatter 0.21 ms per worker;
# PowerSGD project P 2.56 ms, project Q 0.81 ms, reconstruct 2.31 ms
TOPK_SPLIT = {"select": 0.01196, "zero": 0.00066, "scatter_per_worker": 0.00021}
POWERSGD_SPLIT = {"project_p": 0.00256, "project_q": 0.00081, "reconstruct": 0.00231}


@dataclass(frozen=True)
class Costs:
    """One worker's CPU time per step, in seconds.

    Attributes:
        compute_s: forward + backward (> 0).
        update_s: the optimizer's step (>= 0).
        forward_share: forward's part of ``compute_s``, in [0, 1); by default 1/3 (backward costs about twice
            forward).
        compress_s: compression + decompression at 2 workers, by method kind (``Method.kind``; 0 where absent).
    """

    compute_s: float
    update_s: float = 0.0
    forward_share: float = 1 / 3
    compress_s: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.compute_s > 0:
            raise ValueError(f"compute_s (the measured forward + backward) must be > 0, got {self.compute_s}")
        if self.update_s < 0 or not 0 <= self.forward_share < 1:
            raise ValueError(f"update_s must be >= 0 and forward_share in [0, 1), got {self.update_s}, "
                             f"{self.forward_share}")


@dataclass(frozen=True)
class Prediction:
    """A method's predicted step on one cluster (with local steps, per-step means over a sync interval).

    Attributes:
        method: the method predicted.
        handed_bytes: bytes a worker hands the collectives per step.
        sent_bytes: bytes a worker sends per step over the rings.
        step_s: seconds per step.
        compute_s: forward + backward + update, in seconds: the step without communication.
        compress_s: seconds per step of compression and decompression.
        wait_s: seconds per step spent waiting for the network (not hidden behind backward).
        coordination_bytes: Horovod's traffic besides the gradients, in bytes a worker sends per step.
    """

    method: Method
    handed_bytes: int
    sent_bytes: float
    step_s: float
    compute_s: float
    compress_s: float
    wait_s: float
    coordination_bytes: float = 0.0

    @property
    def efficiency(self) -> float:
        """Scaling efficiency: the compute-only step over the predicted step (1.0: communication is free)."""
        return self.compute_s / self.step_s


def step_plan(method: Method, moved: Traffic, costs: Costs, world_size: int) -> StepPlan:
    """``moved`` and ``costs`` as one worker's step."""
    compress = costs.compress_s.get(method.kind, 0.0)
    plan = StepPlan(forward_s=costs.compute_s * costs.forward_share,
                    backward_s=costs.compute_s * (1 - costs.forward_share), update_s=costs.update_s)
    if method.kind == "topk":
        split = TOPK_SPLIT
        unit = compress / (split["select"] + split["zero"] + 2 * split["scatter_per_worker"])
        return replace(plan, hooked=moved.hooked, hook_cpu_s=unit * split["select"],
                       finish_s=unit * (split["zero"] + world_size * split["scatter_per_worker"]))
    if method.kind == "powersgd":
        split = POWERSGD_SPLIT
        unit = compress / sum(split.values())
        cpu = (unit * split["project_p"], unit * split["project_q"])
        return replace(plan, stages=[Stage(c, r) for c, r in zip(cpu, moved.rounds)],
                       finish_s=unit * split["reconstruct"])
    return replace(plan, hooked=moved.hooked, hook_cpu_s=compress / 2, finish_s=compress / 2)


def predict(method: Method, tensors: Sequence[Tensor], world_size: int, link: Link, costs: Costs,
            config: HorovodConfig | None = None, coordination: Coordination | None = None,
            ranking: str = "erk", prunable: Sequence[str] | None = None) -> Prediction:
    """Predicted step of ``method`` on ``world_size`` workers joined by ``link``.

    With local steps (``method.sync_every``) the step is the mean over an interval: a sync step's transfers
    all start after the update, and its communication and compression are spread over the interval. Horovod's
    coordination between syncs is counted once per sync (it runs every cycle; on the links the planner is
    for it is small beside a sync).

    Args:
        method: the method to predict.
        tensors: the model's trainable parameters, in parameter order.
        world_size: number of workers.
        link: each worker's link.
        costs: one worker's measured CPU times per step.
        config: Horovod's cycle and fusion (None: Horovod's own, a 1 ms cycle).
        coordination: the traffic besides the gradients, per cycle and per step (``planner.coordination``;
            None: none).
        ranking: how PacTrain spreads its sparsity: ``"erk"`` (the library's default) or ``"layer"``.
        prunable: glob patterns of the tensors PacTrain prunes (None: those of >= 2 dimensions).

    Returns:
        The predicted step: its time, bytes and their split.
    """
    config = config or HorovodConfig(cycle_time_s=HOROVOD_DEFAULT_CYCLE_TIME_S)
    moved = traffic(replace(method, sync_every=1), tensors, world_size, ranking=ranking, prunable=prunable)
    if method.sync_every > 1:  # the sync starts after the update: nothing of it hides behind backward
        moved.hooked = [replace(transfer, ready_fraction=1.0) for transfer in moved.hooked]
    plan = step_plan(method, moved, costs, world_size)
    solved = with_coordination(plan, world_size, link, config, coordination or Coordination())
    result = solved.prediction
    compute = costs.compute_s + costs.update_s
    every = method.sync_every  # local steps: the sync step's communication, spread over its interval
    extra_s = (solved.step_s - compute) / every
    return Prediction(method=method, handed_bytes=round(moved.handed_bytes / every),
                      sent_bytes=moved.sent_bytes(world_size) / every, step_s=compute + extra_s, compute_s=compute,
                      compress_s=result.compress_s / every, wait_s=extra_s - result.compress_s / every,
                      coordination_bytes=solved.coordination_bytes / every)
