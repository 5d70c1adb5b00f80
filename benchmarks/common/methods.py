"""Method names of the benchmark and what they mean (no Horovod import: the harness parses them too).

``dense``, ``fp16``, ``topk`` (1 %; ``topk-0.001``: 0.1 %, DGC's ratio; error feedback), ``dgc-0.001`` (Top-k with
DGC's corrections, fp16 values, narrow indices: ``baselines/dgc.py``), ``randomk-0.1`` (a random index set every rank
shares, all-reduced with no indices: ``baselines/randomk.py``), ``powersgd`` (rank 4;
``powersgd-r8``: rank 8; error feedback and warm start, compressing from the first step),
``pactrain-0.9`` (fp32 values), ``pactrain-0.9-fp16``, ``pactrain-0.9-ternary`` (shared-scale ternary
codes in int32 lanes, ``packed_values="ternary"``), ``pactrain-0.9-int3`` (codes in [-3, 3], ``"int3"``). A PacTrain name may end in a pruning window as fractions of
the run (``pactrain-0.9-fp16-w0-0.3``: from step 0 to 30 % of ``total_steps``); without one the
product's default window applies. ``-w0-0`` is sparse from the first step: the masks are ranked once, before
step 0's all-reduce, so no step sends a prunable tensor dense (``pt.ConstantSparsity``). ``-ramp50`` in its place
is a short ramp, packed from step 0 as well: 0.5 at step 0 to the sparsity at step 50, masks re-ranked at every
step (``pt.short_ramp``). A name pruned at step 0 may end in ``-rescale``: the survivors of step 0's masks take
their tensor's norm (``rescale_survivors=True``), and in ``-syncH``: local steps, the ranks' progress averaged and an
outer step taken every H steps (``sync_every=H``). ``diloco-h25-fp16`` is the same with nothing pruned (DiLoCo on
Horovod; ``-fp32``: outer values in fp32), and ``ddp-average-h25`` torch's ``PeriodicModelAverager`` on DDP (no
gradient communication; parameters averaged every 25 steps). ``ddp``-prefixed names are the same methods on torch
DistributedDataParallel with its comm hooks (``bench/ddp_methods.py``): ``ddp`` (DDP's own all-reduce),
``ddp-fp16`` (``fp16_compress_hook``), ``ddp-powersgd`` (torch's ``powerSGD_hook``), ``ddp-pactrain-0.9-fp16``
(``pt.ddp.pactrain_hook``). ``tf-``-prefixed names run in TensorFlow, a ``tf.function`` tape loop
(``tf-dense``: ``hvd.DistributedGradientTape``; ``tf-fp16``: with ``hvd.Compression.fp16``;
``tf-pactrain-0.9-fp16``, ``tf-pactrain-0.9-ternary``: ``pt.DistributedGradientTape``), ``keras-``-prefixed
names in Keras ``model.fit`` with ``ptk.DistributedOptimizer`` (``throughput/tf_worker.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from pactrain_hvd.core.encodings import ENCODINGS
from pactrain_hvd.core.schedule import short_ramp
from pactrain_hvd.planner.methods import DEFAULT_POWERSGD_RANK, DEFAULT_TOPK_DENSITY, read_name, sync_interval

DEFAULT_METHODS = ("dense", "fp16", "topk", "powersgd", "pactrain-0.8", "pactrain-0.8-fp16", "pactrain-0.9",
                   "pactrain-0.9-fp16", "pactrain-0.95", "pactrain-0.95-fp16",
                   "ddp", "ddp-fp16", "ddp-powersgd", "ddp-pactrain-0.9-fp16")
QUICK_METHODS = ("dense", "topk", "powersgd", "pactrain-0.9-fp16")
TF_FRONTENDS = ("tf", "keras")
TF_METHODS = ("tf-dense", "tf-fp16", "tf-pactrain-0.9-fp16", "tf-pactrain-0.9-ternary",
              "keras-dense", "keras-fp16", "keras-pactrain-0.9-fp16", "keras-pactrain-0.9-ternary")


@dataclass(frozen=True)
class MethodSpec:
    name: str
    kind: str  # dense | fp16 | topk | dgc | randomk | powersgd | pactrain | diloco | average
    sparsity: float = 0.0
    fp16_values: bool = False
    packed_values: str = "inherit"  # PacTrain: the packed_values= argument
    density: float = DEFAULT_TOPK_DENSITY
    rank: int = DEFAULT_POWERSGD_RANK
    window: tuple[float, float] | None = None  # PacTrain: (begin, end) as fractions of the run
    ramp: int | None = None  # PacTrain: a short ramp of this many steps from step 0 (``pt.short_ramp``)
    local_steps: int = 0  # PacTrain: steps every rank trains alike on the same batches, uncommunicated, before masks
    rescale_survivors: bool = False  # PacTrain: ``rescale_survivors=True`` (a name ending in ``-rescale``)
    sync_every: int = 1  # PacTrain, DiLoCo, model averaging: steps between syncs of the ranks' weights
    frontend: str = "horovod"  # horovod | ddp | tf (a tape loop) | keras (model.fit)

    @property
    def levels(self) -> int:
        """Code levels each side of 0 of PacTrain's quantized values (``core.encodings``); 0: not quantized."""
        return ENCODINGS[self.packed_values].levels

    @property
    def quantized_values(self) -> bool:
        """PacTrain with lane-packed codes (ternary, int3); whole tensors then travel fp16."""
        return self.levels > 0

    @property
    def framework(self) -> str:
        return "tensorflow" if self.frontend in TF_FRONTENDS else "torch"


def parse_method(name: str) -> MethodSpec:
    """``"pactrain-0.9-fp16"`` -> ``MethodSpec(kind="pactrain", sparsity=0.9, fp16_values=True)``: the planner's
    grammar (``pactrain_hvd.planner.methods.read_name``) behind a frontend prefix (``ddp-``, ``tf-``, ``keras-``)."""
    if name == "ddp" or name.startswith("ddp-"):
        if match := re.fullmatch(r"ddp-average-h(\d+)", name):
            return MethodSpec(name, "average", sync_every=sync_interval(name, match.group(1)), frontend="ddp")
        spec = parse_method(name[4:] if name != "ddp" else "dense")
        if spec.kind in ("topk", "dgc", "randomk", "diloco") or spec.frontend == "ddp" or spec.sync_every > 1:
            raise ValueError(f"method {name!r}: DDP runs dense, fp16, powersgd, average-hH and per-step pactrain "
                             "methods")
        return replace(spec, name=name, frontend="ddp")
    frontend, _, rest = name.partition("-")
    if frontend in TF_FRONTENDS and rest:
        spec = parse_method(rest)
        if spec.kind not in ("dense", "fp16", "pactrain") or spec.frontend != "horovod" or spec.sync_every > 1:
            raise ValueError(f"method {name!r}: TensorFlow runs dense, fp16 and pactrain methods")
        return replace(spec, name=name, frontend=frontend)
    parts = read_name(name, "dense, fp16, topk[-DENSITY], dgc-DENSITY, randomk-DENSITY, powersgd[-rRANK], "
                            "diloco-hH-fp16|fp32, pactrain-SPARSITY[-fp16|-bf16|-ternary|-int3][-wBEGIN-END|-rampSTEPS]"
                            "[-localSTEPS][-rescale][-syncH], each also as ddp-NAME (ddp alone: dense; ddp-average-hH: "
                            "PeriodicModelAverager); dense, fp16 and pactrain also as tf-NAME (tape loop) and keras-NAME "
                            "(model.fit)")
    fp16_values = parts.values == "fp16" or parts.kind == "fp16"  # packed values inherit Compression.fp16
    return MethodSpec(name, parts.kind, sparsity=parts.sparsity, fp16_values=fp16_values,
                      packed_values="inherit" if parts.values in ("fp32", "fp16") else parts.values,
                      density=parts.density, rank=parts.rank, window=parts.window, ramp=parts.ramp,
                      local_steps=parts.local_steps, rescale_survivors=parts.rescale_survivors,
                      sync_every=parts.sync_every)


def worker_module(spec: MethodSpec) -> str:
    """The throughput worker that runs ``spec``: torch's, or TensorFlow's for ``tf-`` and ``keras-`` methods."""
    return "benchmarks.throughput.tf_worker" if spec.framework == "tensorflow" else "benchmarks.throughput.worker"


def pruning_schedule(spec: MethodSpec, total_steps: int | None) -> dict:
    """PacTrain's schedule arguments: a short ramp from step 0 (``spec.ramp``), or over ``total_steps`` (in
    ``spec.window`` if it has one), else prune at step 0."""
    rescale = {"rescale_survivors": True} if spec.rescale_survivors else {}
    if spec.ramp is not None:
        return {"schedule": short_ramp(spec.sparsity, spec.ramp), **rescale}
    if not total_steps:
        return {"begin_step": 0, "end_step": 0, **rescale}
    schedule = {"total_steps": total_steps, **rescale}
    if spec.window:
        schedule.update(begin_step=int(spec.window[0] * total_steps), end_step=int(spec.window[1] * total_steps))
    return schedule
