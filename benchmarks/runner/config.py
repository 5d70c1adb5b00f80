"""What a benchmark run measures (``BenchConfig``: models, methods, links, steps, repeats, cells to skip) and its log."""

from __future__ import annotations

import fnmatch
import sys
import time
from dataclasses import dataclass, field

from benchmarks.common.methods import parse_method
from benchmarks.links.links import LinkSpec
from example_support.progress import Progress

SKIPPED = "skipped by --skip"
BATCH_SIZES = {"resnet18": 16, "vgg16": 32, "gpt": 4,  # ~1 s per step on one thread of this 2-core CPU
               "fashion-vgg": 64}  # the time-to-accuracy image workload's model and batch


@dataclass
class BenchConfig:
    models: list[str]
    methods: list[str]
    links: list[LinkSpec]
    world_size: int = 2
    warmup: int = 3
    steps: int = 10
    batch_sizes: dict[str, int] = field(default_factory=lambda: dict(BATCH_SIZES))
    seed: int = 0
    threads: int = 1
    probe_seconds: float = 2.0
    cell_timeout_s: float = 900.0
    repeats: int = 1  # interleaved rounds per (link, model); each figure is the best round's
    # HOROVOD_CYCLE_TIME for every rank of every cell (None: Horovod's 1 ms). At 1 ms Horovod's
    # background loop alone takes ~11 % of a core per idle worker on this 2-core machine, 4-7 % at 5 ms.
    cycle_time_ms: float | None = 5.0
    skip: list[str] = field(default_factory=list)  # "model/link/method" cells not to run (glob patterns)
    log: bool = True

    def skipped(self, model: str, link: str, method: str) -> bool:
        return any(fnmatch.fnmatchcase(f"{model}/{link}/{method}", pattern) for pattern in self.skip)

    def validate(self) -> None:
        for method in self.methods:
            parse_method(method)  # a bad name fails here, not in a worker
        unknown = [m for m in self.models if m not in self.batch_sizes]
        if unknown:
            raise ValueError(f"no batch size for model(s) {', '.join(unknown)}: pass --batch-size MODEL=N")
        if self.world_size < 2:
            raise ValueError(f"world_size must be >= 2 for a communication benchmark, got {self.world_size}")
        if self.repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {self.repeats}")
        if self.steps < 1 or self.warmup < 0:
            raise ValueError(f"need steps >= 1 and warmup >= 0, got steps={self.steps} warmup={self.warmup}")


def say(config: BenchConfig, message: str, progress: Progress | None = None) -> None:
    """A log line on stderr (above the progress bar, if one is drawn there)."""
    if not config.log:
        return
    line = f"[bench {time.strftime('%H:%M:%S')}] {message}"
    if progress is not None:
        progress.write(line)
    else:
        print(line, file=sys.stderr, flush=True)


def job_count(config: BenchConfig) -> int:
    """Jobs the run will start or skip: per link and model not wholly skipped, a bound and every method, per round."""
    blocks = sum(1 for link in config.links for model in config.models
                 if not all(config.skipped(model, link.label, method) for method in config.methods))
    return blocks * config.repeats * (1 + len(config.methods))
