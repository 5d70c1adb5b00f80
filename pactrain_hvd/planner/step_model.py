"""Step time on paper: alpha-beta collectives, Horovod's cycle and fusion, overlap with backward.

Pure math (no torch, no Horovod). The planner (``pactrain_hvd.planner``) feeds it a model's tensors and a
user's link; the repository's ``benchmarks/model/step_time_model.py`` feeds it what was measured (per-tensor
gradient-ready times from a real backward, per-method CPU costs, probed links) and checks it against the
throughput benchmark.

One worker's step, as the benchmark's methods run it::

    forward | backward (hooks start transfers) | stages after backward | finish | update

- **Collectives** on a per-worker full-duplex link of ``bytes_per_s`` with ``latency_s`` per
  message hop: ring all-reduce of B bytes on n workers costs ``2 (n-1) alpha + 2 (n-1)/n B / beta``;
  ring allgather of b bytes from every worker ``(n-1) alpha + (n-1) b / beta``. Both also pass
  the buffer through host memory (fusion-buffer copy in and out) at ``copy_bytes_per_s``.
- **Horovod's background loop** (one per worker, serial): a cycle starts at least
  ``cycle_time_s`` after the previous one; it takes every transfer submitted by then, fuses
  those of the same collective, dtype and reduction (``Transfer.dtype`` names both, e.g.
  ``"float32-max"``) into buffers of at most ``fusion_threshold_bytes``
  (a larger tensor goes alone), negotiates (``2 ceil(log2 n)`` latencies) and runs the buffers
  one after the other. The next cycle starts when they are done or one cycle time after this
  one started, whichever is later. So a gradient waits for the next cycle, and transfers
  overlap the rest of backward only as far as the link keeps up.
- **Synchronous**: a collective starts when every worker has submitted; a persistently slower
  worker (``straggler_s``) delays every one of them, and the others wait for it.
- **Stages** after backward (PowerSGD's P then Q) are blocking:
  CPU work, then transfers that must finish before the next stage's CPU work starts.

Example::

    >>> link = Link(bytes_per_s=1.25e9, latency_s=10e-6)
    >>> round(ring_allreduce_s(4_000_000, 8, link), 5)  # 4 MB over 8 workers at 10 Gbit/s
    0.00574
    >>> plan = StepPlan(forward_s=0.02, backward_s=0.04, hooked=[Transfer(1.0, 4_000_000)])
    >>> round(predict_step(plan, 8, link, HorovodConfig()).step_s, 4)  # last gradient: no overlap
    0.0658
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

ALLREDUCE = "allreduce"
ALLGATHER = "allgather"
HOROVOD_DEFAULT_FUSION_BYTES = 128 * 1024 * 1024  # Horovod >= 0.21 (was 64 MB); 0.28.1 is ours
BENCH_CYCLE_TIME_S = 0.005  # what the throughput benchmark sets (HOROVOD_CYCLE_TIME=5)
HOROVOD_DEFAULT_CYCLE_TIME_S = 0.001  # Horovod >= 0.21 (HOROVOD_CYCLE_TIME unset): what a user's job runs at


@dataclass(frozen=True)
class Link:
    """One worker's full-duplex link to the others.

    Attributes:
        bytes_per_s: bandwidth each way, in bytes per second (> 0).
        latency_s: latency per message hop, in seconds (>= 0).
        copy_bytes_per_s: host-memory copy rate for the fusion buffer, in bytes per second (inf: free).
    """

    bytes_per_s: float
    latency_s: float = 0.0
    copy_bytes_per_s: float = math.inf

    def __post_init__(self) -> None:
        if not self.bytes_per_s > 0:
            raise ValueError(f"Link.bytes_per_s must be > 0, got {self.bytes_per_s}")
        if self.latency_s < 0 or not self.copy_bytes_per_s > 0:
            raise ValueError(f"Link.latency_s must be >= 0 and copy_bytes_per_s > 0, got {self.latency_s}, "
                             f"{self.copy_bytes_per_s}")

    @classmethod
    def gbit(cls, gbit_per_s: float, latency_s: float = 0.0, copy_bytes_per_s: float = math.inf) -> Link:
        """A link of ``gbit_per_s`` Gbit/s each way (other arguments as the fields)."""
        return cls(gbit_per_s * 1e9 / 8, latency_s, copy_bytes_per_s)


@dataclass(frozen=True)
class HorovodConfig:
    """Horovod's background-loop settings.

    Attributes:
        cycle_time_s: seconds between cycles (``HOROVOD_CYCLE_TIME``); the default is the benchmark's 5 ms.
        fusion_threshold_bytes: largest fused buffer (``HOROVOD_FUSION_THRESHOLD``), in bytes; default 128 MiB.
    """

    cycle_time_s: float = BENCH_CYCLE_TIME_S
    fusion_threshold_bytes: int = HOROVOD_DEFAULT_FUSION_BYTES


def _nothing_to_send(nbytes: float, world_size: int) -> bool:
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    return world_size == 1 or nbytes <= 0


def ring_allreduce_s(nbytes: float, world_size: int, link: Link) -> float:
    """Time of a ring all-reduce of an ``nbytes`` buffer: reduce-scatter then allgather, ``2 (n-1)`` steps.

    Args:
        nbytes: size of the buffer each worker contributes, in bytes.
        world_size: workers in the ring (>= 1).
        link: each worker's link.

    Returns:
        Seconds, latency and host copies included; 0.0 for one worker or an empty buffer.
    """
    if _nothing_to_send(nbytes, world_size):
        return 0.0
    n = world_size
    return (2 * (n - 1) * link.latency_s + 2 * (n - 1) / n * nbytes / link.bytes_per_s
            + 2 * nbytes / link.copy_bytes_per_s)


def ring_allgather_s(nbytes_per_worker: float, world_size: int, link: Link) -> float:
    """Time of a ring allgather: every worker ends with all ``n`` contributions of ``nbytes_per_worker``.

    Args:
        nbytes_per_worker: bytes each worker contributes.
        world_size: workers in the ring (>= 1).
        link: each worker's link.

    Returns:
        Seconds, latency and host copies included; 0.0 for one worker or an empty contribution.
    """
    if _nothing_to_send(nbytes_per_worker, world_size):
        return 0.0
    n = world_size
    return (n - 1) * link.latency_s + (n - 1) * nbytes_per_worker / link.bytes_per_s \
        + (1 + n) * nbytes_per_worker / link.copy_bytes_per_s


def negotiation_s(world_size: int, link: Link) -> float:
    """Horovod's per-cycle coordination (a tree gather + broadcast of the ready lists)."""
    return 0.0 if world_size <= 1 else 2 * math.ceil(math.log2(world_size)) * link.latency_s


def collective_s(kind: str, nbytes: float, world_size: int, link: Link) -> float:
    if kind == ALLREDUCE:
        return ring_allreduce_s(nbytes, world_size, link)
    if kind == ALLGATHER:
        return ring_allgather_s(nbytes, world_size, link)
    raise ValueError(f"unknown collective {kind!r}: use {ALLREDUCE!r} or {ALLGATHER!r}")


@dataclass(frozen=True)
class Transfer:
    """One tensor handed to Horovod: ``ready_fraction`` of backward done when its hook fires."""

    ready_fraction: float
    nbytes: int
    kind: str = ALLREDUCE
    dtype: str = "float32"


@dataclass(frozen=True)
class Submitted:
    ready_s: float
    nbytes: int
    kind: str
    dtype: str


def fuse(batch: list[Submitted], threshold_bytes: int) -> list[list[Submitted]]:
    """Horovod's fusion of one cycle's tensors: same collective and dtype, buffers <= threshold."""
    by_key: dict[tuple[str, str], list[Submitted]] = {}
    for item in batch:
        by_key.setdefault((item.kind, item.dtype), []).append(item)
    buffers: list[list[Submitted]] = []
    for items in by_key.values():
        current: list[Submitted] = []
        size = 0
        for item in items:
            if current and size + item.nbytes > threshold_bytes:
                buffers.append(current)
                current, size = [], 0
            current.append(item)
            size += item.nbytes
        if current:
            buffers.append(current)
    return buffers


@dataclass
class BackgroundLoop:
    """Horovod's background thread on one worker: cycles, fusion, serial execution."""

    world_size: int
    link: Link
    config: HorovodConfig
    next_cycle_s: float = 0.0  # when the loop next looks for work (the cycle grid when idle)
    busy_s: float = 0.0  # total time spent running collectives

    def run(self, items: list[Submitted]) -> list[float]:
        """Completion time of each item (submitted at its ``ready_s``), advancing the loop."""
        done = [math.nan] * len(items)
        pending = sorted(range(len(items)), key=lambda i: items[i].ready_s)
        period = self.config.cycle_time_s
        while pending:
            start = self.next_cycle_s
            earliest = items[pending[0]].ready_s
            if earliest > start:  # idle: cycles tick on the grid until something is ready
                start += math.ceil((earliest - start) / period - 1e-12) * period if period > 0 else earliest - start
            batch = [i for i in pending if items[i].ready_s <= start + 1e-12]
            pending = [i for i in pending if i not in set(batch)]
            t = start + negotiation_s(self.world_size, self.link)
            index = {id(items[i]): i for i in batch}
            for buffer in fuse([items[i] for i in batch], self.config.fusion_threshold_bytes):
                cost = collective_s(buffer[0].kind, sum(b.nbytes for b in buffer), self.world_size, self.link)
                t += cost
                self.busy_s += cost
                for member in buffer:
                    done[index[id(member)]] = t
            self.next_cycle_s = max(start + period, t)
        return done


@dataclass(frozen=True)
class Stage:
    """After backward: ``cpu_s`` of compression, then ``transfers`` that block until done."""

    cpu_s: float
    transfers: tuple[tuple[int, str, str], ...] = ()  # (nbytes, kind, dtype)


@dataclass(frozen=True)
class StepPlan:
    """What one worker does in a step (seconds are this worker's own, measured or scaled)."""

    forward_s: float
    backward_s: float
    hooked: list[Transfer] = field(default_factory=list)
    hook_cpu_s: float = 0.0  # compression run inside gradient hooks: it delays the rest of backward
    stages: list[Stage] = field(default_factory=list)
    finish_s: float = 0.0  # decompression after the last transfer
    update_s: float = 0.0
    # how much later the slowest worker's backward ends than this one's: every collective waits for
    # it (from the compute-only bound's per-worker medians on the benchmark's shared CPUs; 0 on a cluster)
    straggler_s: float = 0.0


@dataclass(frozen=True)
class StepPrediction:
    step_s: float
    compute_s: float  # forward + backward (without hook compression)
    compress_s: float
    comm_wait_s: float  # time past backward (and its compression) spent waiting for the network
    update_s: float
    busy_s: float  # time the background loop spent in collectives


def predict_step(plan: StepPlan, world_size: int, link: Link, config: HorovodConfig, phase_s: float = 0.0) -> StepPrediction:
    """One step of ``plan`` on ``world_size`` workers; ``phase_s``: where the cycle grid sits at step start."""
    loop = BackgroundLoop(world_size, link, config, next_cycle_s=phase_s)
    backward_start = plan.forward_s
    hook_scale = plan.backward_s + plan.hook_cpu_s + plan.straggler_s
    submitted = [Submitted(backward_start + t.ready_fraction * hook_scale, t.nbytes, t.kind, t.dtype) for t in plan.hooked]
    hooked_done = loop.run(submitted)
    backward_done = backward_start + hook_scale
    t = backward_done
    stage_cpu = 0.0
    for stage in plan.stages:
        t += stage.cpu_s
        stage_cpu += stage.cpu_s
        if stage.transfers:
            done = loop.run([Submitted(t, nbytes, kind, dtype) for nbytes, kind, dtype in stage.transfers])
            t = max(done)
    synchronized = max([t, *hooked_done])
    step = synchronized + plan.finish_s + plan.update_s
    compress = plan.hook_cpu_s + stage_cpu + plan.finish_s
    compute = plan.forward_s + plan.backward_s
    return StepPrediction(step_s=step, compute_s=compute, compress_s=compress,
                          comm_wait_s=step - compute - compress - plan.update_s, update_s=plan.update_s,
                          busy_s=loop.busy_s)


def expected_step(plan: StepPlan, world_size: int, link: Link, config: HorovodConfig, phases: int = 8) -> StepPrediction:
    """``predict_step`` averaged over ``phases`` evenly spaced positions of the cycle grid (which
    runs independently of the training loop, so its phase at step start is uniform)."""
    predictions = [predict_step(plan, world_size, link, config, phase_s=k * config.cycle_time_s / phases)
                   for k in range(phases)]

    def mean(attribute: str) -> float:
        return sum(getattr(p, attribute) for p in predictions) / len(predictions)

    return StepPrediction(**{name: mean(name) for name in StepPrediction.__dataclass_fields__})
