"""PacTrain for ``torch.nn.parallel.DistributedDataParallel``: a comm hook beside torch's PowerSGD.

Example::

    >>> import pactrain_hvd.torch as pt
    >>> state = pt.ddp.PacTrainHookState(ddp_model, optimizer, sparsity=0.9, end_step=1000)
    >>> ddp_model.register_comm_hook(state, pt.ddp.pactrain_hook)   # the loop is unchanged

DDP hands the hook one ``GradBucket`` at a time: a flat buffer holding several parameters' gradients
back to back. The hook sends the bucket's surviving coordinates (the concatenated masks of its
parameters; cached per mask change and per bucket, so DDP's rebuild of buckets after the first
iteration is a new plan) through one asynchronous ``dist.all_reduce`` and scatters the result
back, divided by the world size as DDP's default hook does. A bucket the plan keeps dense travels
whole, with pruned coordinates zeroed; a bucket with nothing pruned is DDP's default all-reduce.
Dense buckets travel in the bucket's dtype: for fp16 there too (as ``hvd.Compression.fp16`` does for the
Horovod frontend's dense tensors), wrap the hook as torch wraps its own:
``register_comm_hook(state, fp16_compress_wrapper(pactrain_hook))``.

Pruning, the Mask Tracker and enforcement are the Horovod frontend's (``Pruner``), moved by
``torch.distributed``. DDP does not wrap the optimizer, so the state registers step hooks on it:
before a step, the schedule's mask update (verified across ranks, state cleared at newly pruned
coordinates, this step's gradients masked); after it, pruned weights back to 0 where the optimizer
could have moved them, and the schedule advances. A step a loss scaler skips is not a step.
"""

from pactrain_hvd.torch.ddp.hook import pactrain_hook
from pactrain_hvd.torch.ddp.state import PacTrainHookState

__all__ = ["PacTrainHookState", "pactrain_hook"]
