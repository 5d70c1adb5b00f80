"""Horovod's traffic besides the gradients: a coordination round every cycle, and a remainder every step.

Horovod's background loop wakes every ``HOROVOD_CYCLE_TIME`` (1 ms unless set) and, on every worker,
exchanges which tensors are ready: a few hundred bytes on the wire each cycle, whether or not a gradient
is waiting. While the loop runs a collective it does not cycle. So a step of ``step_s`` seconds, of which
the loop spends ``busy_s`` in collectives, carries about ``bytes_per_cycle (step_s - busy_s) / cycle``
bytes of coordination, plus a remainder that does not depend on the cycle (``bytes_per_step``: framing of
the small collectives, PacTrain's mask digests and ternary scales, PowerSGD's small tensors).

On a link of Gbit/s this is noise; on one of a few Mbit/s at a 1 ms cycle it is half the link. The model
spreads the coordination over the step: the gradients move at the link's rate less the coordination's mean
rate, ``bytes_per_cycle (step_s - busy_s) / (cycle step_s)``; the remainder is charged at the full rate
after the step. The step depends on the rate and the rate on the step: ``with_coordination`` solves the
fixed point by iteration.

Example::

    >>> from pactrain_hvd.planner.step_model import HorovodConfig, Link, StepPlan, Transfer
    >>> plan = StepPlan(forward_s=0.1, backward_s=0.2, hooked=[Transfer(1.0, 60_000)])
    >>> link = Link(bytes_per_s=600e3)  # 4.8 Mbit/s
    >>> quiet = with_coordination(plan, 2, link, HorovodConfig(cycle_time_s=0.001), Coordination())
    >>> busy = with_coordination(plan, 2, link, HorovodConfig(cycle_time_s=0.001), MEASURED)
    >>> round(quiet.step_s, 3), round(busy.step_s, 3)
    (0.4, 0.467)
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pactrain_hvd.planner.step_model import HorovodConfig, Link, StepPlan, StepPrediction, expected_step


@dataclass(frozen=True)
class Coordination:
    """Bytes a worker sends besides the gradients (see the module's docstring).

    Attributes:
        bytes_per_cycle: bytes sent each cycle the background loop is not running a collective (>= 0).
        bytes_per_step: bytes sent once a step, whatever the cycle (>= 0).
    """

    bytes_per_cycle: float = 0.0
    bytes_per_step: float = 0.0

    def __post_init__(self) -> None:
        if self.bytes_per_cycle < 0 or self.bytes_per_step < 0:
            raise ValueError(f"coordination bytes must be >= 0, got {self.bytes_per_cycle}, {self.bytes_per_step}")


# Horovod 0.28.1 over Gloo, 2 workers, NIC bytes: least squares over the 9 runs of
# bench/results/tta/cycle-time/{1ms,10ms,25ms}/record.json (printed by python -m benchmarks.model.planner_validation --fit)
MEASURED = Coordination(bytes_per_cycle=242.0, bytes_per_step=17_500.0)


@dataclass(frozen=True)
class CoordinatedStep:
    step_s: float
    prediction: StepPrediction  # the step's gradients at the rate the coordination leaves them
    coordination_bytes: float  # per step, per worker, remainder included
    cycles: float  # idle cycles a step


def with_coordination(plan: StepPlan, world_size: int, link: Link, config: HorovodConfig, coordination: Coordination,
                      iterations: int = 200, tolerance: float = 1e-6) -> CoordinatedStep:
    """``expected_step`` with ``coordination`` sharing the link (see the module's docstring)."""
    prediction = expected_step(plan, world_size, link, config)
    if world_size <= 1 or (coordination.bytes_per_cycle == 0 and coordination.bytes_per_step == 0):
        return CoordinatedStep(prediction.step_s, prediction, 0.0, 0.0)
    # a cycle lasts at least its own coordination on the wire
    cycle_s = max(config.cycle_time_s, coordination.bytes_per_cycle / link.bytes_per_s)
    rate = 0.0
    for _ in range(iterations):
        idle_s = max(0.0, prediction.step_s - prediction.busy_s)
        wanted = coordination.bytes_per_cycle * idle_s / (cycle_s * prediction.step_s) if cycle_s > 0 else 0.0
        wanted = min(wanted, 0.95 * link.bytes_per_s)
        if abs(wanted - rate) <= tolerance * link.bytes_per_s:
            break
        rate = (rate + wanted) / 2  # damped: the step shortens as the rate falls
        prediction = expected_step(plan, world_size, replace(link, bytes_per_s=link.bytes_per_s - rate), config)
    cycles = max(0.0, prediction.step_s - prediction.busy_s) / cycle_s if cycle_s > 0 else 0.0
    step = prediction.step_s + coordination.bytes_per_step / link.bytes_per_s
    return CoordinatedStep(step, prediction, coordination.bytes_per_cycle * cycles + coordination.bytes_per_step, cycles)
