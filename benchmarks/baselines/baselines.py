"""The baselines PacTrain is measured against, over the same Horovod: Top-k and PowerSGD.

Both follow GRACE's split (Xu et al., "GRACE: A Compressed Communication Framework for
Distributed Machine Learning", ICDCS 2021): **what to send** (a compressor), **what to
remember** (error-feedback memory), **how to move it** (a communicator). Both are written to be
competitive: one vectorised pass per tensor, no per-element Python, Horovod's tensor fusion
as configured for every method, in-place buffers.

- ``TopKDistributedOptimizer``: each gradient (plus its residual) keeps its ``k = density *
  numel`` largest magnitudes (DGC, Lin et al. 2018; GRACE ``topk``). Ranks keep different
  coordinates, so values and int32 indices are **allgathered**, started from the gradient hook
  as soon as the gradient exists (overlapping backward, as Horovod does for all-reduce).
- ``PowerSGDDistributedOptimizer``: rank-r power iteration with warm start and error feedback
  (Vogels et al., NeurIPS 2019; torch's ``powerSGD_hook``). Every matrix's P travels in one
  fused all-reduce, then every Q in another; small tensors go dense in a third, started first.

Tensors under ``min_compress_numel`` (biases, norms) travel dense for both, as in DGC, and
with PacTrain's default plan threshold, so all methods treat small tensors alike.

- ``DGCDistributedOptimizer``: Top-k with Deep Gradient Compression's corrections (``dgc.py``).
- ``RandomKDistributedOptimizer``: a random index set every rank shares, all-reduced (``randomk.py``).

One module per part: ``topk.py``, ``dgc.py``, ``randomk.py`` and ``powersgd.py`` (each its optimizer), ``memory.py``,
``communicator.py``, ``optimizer.py`` (what the optimizers share); this module names them all.
"""

from benchmarks.baselines.communicator import AllgatherCommunicator, FusedAllreduceCommunicator
from benchmarks.baselines.dgc import DGCDistributedOptimizer
from benchmarks.baselines.memory import ResidualMemory
from benchmarks.baselines.powersgd import PowerSGDCompressor, PowerSGDDistributedOptimizer, PowerSGDState
from benchmarks.baselines.randomk import RandomKDistributedOptimizer
from benchmarks.baselines.topk import TopKCompressor, TopKDistributedOptimizer

__all__ = ["AllgatherCommunicator", "DGCDistributedOptimizer", "FusedAllreduceCommunicator", "PowerSGDCompressor",
           "PowerSGDDistributedOptimizer", "PowerSGDState", "RandomKDistributedOptimizer", "ResidualMemory",
           "TopKCompressor", "TopKDistributedOptimizer"]
