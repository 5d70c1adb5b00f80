"""``DistributedOptimizer``: hvd.DistributedOptimizer with pruning and mask-indexed packing.

A façade: it wraps the user's optimizer (composition: no generated subclass) and runs Horovod's own
torch engine (``engine.py``: a hook per parameter starts an asynchronous all-reduce as soon as its
gradient is accumulated, ``synchronize()`` waits, ``step()`` updates). What persists between steps
(schedule, masks, plan, accounting) is its ``PacTrainState`` (``state.py``); the checkpoint format
is ``checkpoint.py``'s.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any

import horovod.torch as hvd
import torch
from horovod.torch.compression import Compression, Compressor

from pactrain_hvd.core import PacTrainConfig
from pactrain_hvd.core.facade import StateReadings
from pactrain_hvd.core.keywords import documents_keywords, pactrain_keywords
from pactrain_hvd.torch import checkpoint
from pactrain_hvd.torch.arguments import checked_arguments, checked_parameters
from pactrain_hvd.torch.engine import HorovodEngine
from pactrain_hvd.torch.state import PacTrainState


def _shared(attribute: str) -> property:
    """The wrapped optimizer's ``attribute``, read and written through (what ``torch.optim.Optimizer`` exposes)."""
    return property(lambda self: getattr(self._optimizer, attribute),
                    lambda self, value: setattr(self._optimizer, attribute, value))


@documents_keywords()
class DistributedOptimizer(HorovodEngine, StateReadings, torch.optim.Optimizer):
    """Drop-in replacement for ``hvd.DistributedOptimizer`` that prunes and packs.

    Takes every argument of ``hvd.DistributedOptimizer`` with the same defaults, plus PacTrain's keywords.
    Every rank must pass the same settings: the first step proves it (``SettingsMismatchError`` on every
    rank, naming the setting and each rank's value, instead of a hang). Local steps (``sync_every``):
    docs/local-steps.md; the encodings of ``packed_values``: ``pactrain_hvd.core.encodings``.

    Args:
        optimizer: the ``torch.optim.Optimizer`` to wrap (not one already wrapped).
        named_parameters: ``model.named_parameters()``, whose names key masks, checkpoints and messages.
        compression: Horovod's compressor for tensors that travel dense (and packed values that inherit it).
        backward_passes_per_step: as Horovod: backward passes accumulated locally per reduction.
        op: ``hvd.Average`` (default) or ``hvd.Sum``, ``hvd.Min``, ``hvd.Max``; not Adasum (survivors reduce alone).
        gradient_predivide_factor: as Horovod: divide before the sum and multiply after.
        num_groups: deprecated, as Horovod: use ``groups``.
        groups: as Horovod: a number of groups, or lists of parameters all-reduced together.
        sparse_as_dense: as Horovod: densify sparse gradients (a pruned tensor's always is, with a warning).
        process_set: as Horovod: the ranks this optimizer reduces with.
        {pactrain_keywords}

    Example::

        >>> opt = pt.DistributedOptimizer(opt, named_parameters=model.named_parameters(), sparsity=0.9,
        ...                               total_steps=epochs * len(train_loader))
        >>> hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        >>> loss.backward(); opt.step()   # the loop is unchanged
    """

    @pactrain_keywords()
    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None,
        compression: type[Compressor] = Compression.none,
        backward_passes_per_step: int = 1,
        op: int = hvd.Average,
        gradient_predivide_factor: float = 1.0,
        num_groups: int = 0,
        groups: int | list[list[torch.Tensor]] | None = None,
        sparse_as_dense: bool = False,
        process_set: hvd.ProcessSet = hvd.global_process_set,
        **pactrain: Any,
    ) -> None:
        # Everything is validated before the first collective call.
        if (not isinstance(optimizer, torch.optim.Optimizer) or isinstance(optimizer, DistributedOptimizer)
                or type(optimizer).__module__ == hvd.DistributedOptimizer.__module__):
            raise TypeError(f"optimizer must be a plain torch.optim.Optimizer, not one already wrapped in a "
                            f"DistributedOptimizer (Horovod's or ours), got {type(optimizer).__name__}")
        if num_groups != 0:
            warnings.warn("num_groups has been replaced by groups (as in Horovod)", DeprecationWarning, stacklevel=3)
            groups = num_groups if groups is None else groups
        parameters = checked_parameters(optimizer, named_parameters)
        # stacklevel: values= warns at the caller (checked_arguments, this frame, the keyword wrapper's, the caller's)
        settings = checked_arguments(pactrain, compression=compression, stacklevel=4, op=op,
                                     gradient_predivide_factor=gradient_predivide_factor, groups=groups,
                                     process_set=process_set, backward_passes_per_step=backward_passes_per_step)
        self._optimizer = optimizer
        self.backward_passes_per_step = settings.backward_passes_per_step
        self.op = settings.op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self.process_set = process_set
        self.packed_values = settings.packed_values
        state = PacTrainState(parameters, optimizer, settings.config, prunable=pactrain["prunable"],
                              masks=pactrain["masks"], compression=compression, packed_values=settings.packed_values,
                              process_set=process_set, settings=settings.agreed(compression))
        self._start_engine(state, settings.groups)

    # -- what a torch.optim.Optimizer exposes, shared with the wrapped optimizer ----------------
    param_groups = _shared("param_groups")
    state = _shared("state")
    defaults = _shared("defaults")

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self._optimizer

    def register_step_pre_hook(self, hook):
        """Runs before the wrapped optimizer's update, after the gradients are reduced (``hook(inner, args, kwargs)``)."""
        return self._optimizer.register_step_pre_hook(hook)

    def register_step_post_hook(self, hook):
        """Runs after the wrapped optimizer's update, before pruned weights are re-zeroed (``hook(inner, args, kwargs)``)."""
        return self._optimizer.register_step_post_hook(hook)

    def add_param_group(self, param_group: dict) -> None:
        raise NotImplementedError("add parameter groups to the optimizer before wrapping it in DistributedOptimizer")

    def __repr__(self) -> str:
        return f"pactrain_hvd.torch.DistributedOptimizer(sparsity={self.config.sparsity}, optimizer={self._optimizer!r})"

    def __getstate__(self) -> dict:
        raise TypeError("DistributedOptimizer holds live Horovod handles: pickle its state_dict() instead")

    # -- PacTrain state: the PacTrainState's ------------------------------------------------------
    @property
    def pactrain_state(self) -> PacTrainState:
        """Schedule position, masks, plan and accounting (``pactrain_hvd.torch.PacTrainState``)."""
        return self._pactrain

    @property
    def config(self) -> PacTrainConfig:
        return self._pactrain.config

    # -- the step -------------------------------------------------------------------------------
    def step(self, closure=None):
        self._check_attached()
        if self._is_state_initialisation():
            self._initialise_state()
            return None
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() context after "
                              "optimizer.synchronize(). This can cause training slowdown.", stacklevel=2)
            self.synchronize()
        self._synchronized = False
        remask = self._pactrain.before_update()
        loss = self._optimizer.step(closure)
        if self._pactrain.after_update(remask):
            self._outer_sync()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._check_nothing_in_flight()
        self._optimizer.zero_grad(set_to_none=set_to_none)

    # -- hvd.broadcast_optimizer_state's state initialisation -----------------------------------
    def _is_state_initialisation(self) -> bool:
        """``hvd.broadcast_optimizer_state`` on a rank whose optimizer has no state sets every gradient to
        zeros and calls ``step()`` with no backward pass; Horovod makes that step local for its own wrapper
        (other ranks never join it), so ours recognises it."""
        return (not self._optimizer.state and not self._handles and not self._synchronized
                and all(p.grad is not None and not p.grad.is_sparse and not p.grad.any()
                        for group in self.param_groups for p in group["params"] if p.requires_grad))

    @torch.no_grad()
    def _initialise_state(self) -> None:
        """The wrapped optimizer's step on zero gradients, locally: it creates the state (momentum, moments)
        Horovod then overwrites with the root's. Weights are put back (Horovod's own wrapper lets weight decay
        shrink them, on the resuming ranks only); the schedule does not move."""
        parameters = [p for group in self.param_groups for p in group["params"]]
        weights = [p.detach().clone() for p in parameters]
        if isinstance(self._optimizer, torch.optim.SparseAdam):  # Horovod's special case, for its own class
            for p in parameters:
                if p.grad is not None:
                    p.grad = p.grad.to_sparse()
        self._optimizer.step()
        for p, weight in zip(parameters, weights):
            p.copy_(weight)
            if self._pactrain.tracking:  # an entry for every parameter, so that the masks travel (see state_dict)
                self._optimizer.state[p]  # noqa: B018

    # -- checkpoints (format: checkpoint.py) ------------------------------------------------------
    def state_dict(self) -> dict:
        """The wrapped optimizer's state dict plus ``"pactrain"``: schedule position and masks, and with
        ``packed_values="ternary"`` this rank's error memory and the held scales. Where
        the wrapped optimizer has state, its entries also carry masks, schedule position and scales, so
        that ``hvd.broadcast_optimizer_state`` (Horovod's resume idiom) broadcasts them. Where nothing is
        pruned (``sparsity=0``, no ``masks=``), ``"state"`` is the wrapped optimizer's, exactly as with Horovod.
        """
        optimized = [p for group in self.param_groups for p in group["params"]]
        return checkpoint.with_pactrain(self._pactrain, self._optimizer.state_dict(), optimized)

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore optimizer state, masks and schedule position; validated before anything changes.

        Local (no communication), so it may run on one rank: then call ``broadcast_masks``.
        Quantized values' error memory is per rank: it is restored only on the rank that
        saved them (for an exact resume every rank saves and loads its own checkpoint).
        """
        inner, pactrain = checkpoint.without_pactrain(state_dict)
        saved = checkpoint.validated(self._pactrain, pactrain) if pactrain is not None else None
        self._reset_engine()
        self._optimizer.load_state_dict(inner)
        if saved is not None:
            checkpoint.restore(self._pactrain, saved)
