"""Masks of the prunable parameters: computed by magnitude, proven equal on every rank, enforced."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import horovod.torch as hvd
import numpy as np
import torch

from pactrain_hvd.core import PacTrainConfig, PolynomialSchedule, mask_fingerprint, select_prunable_names
from pactrain_hvd.core.cycle import PruningCycle
from pactrain_hvd.core.pruner import HostPruner

Prunable = Callable[[str, torch.Tensor], bool] | Iterable[str] | None


def default_prunable(name: str, param: torch.Tensor) -> bool:
    """Conv, linear and embedding weights (>= 2-D); biases and norm scales stay dense.

    Args:
        name: the parameter's name (unused: the rule goes by shape).
        param: the parameter.

    Returns:
        True where ``param`` has two or more dimensions.
    """
    return param.dim() >= 2


def select_prunable(named_parameters: Mapping[str, torch.Tensor], prunable: Prunable) -> list[str]:
    """Names to prune: by predicate ``(name, param) -> bool`` or by glob patterns on names."""
    return select_prunable_names(named_parameters, prunable, default_prunable, lambda param: param.requires_grad)


@dataclass(frozen=True)
class TableExchange:
    """How the Mask Tracker moves fingerprint tables: the communicator, apart from what it checks.

    ``allgather``: this rank's int64 table -> every rank's, concatenated along dim 0 (any lengths);
    ``size``: the number of ranks; ``hint``: how a user of this frontend shares masks.
    """

    allgather: Callable[[torch.Tensor], torch.Tensor]
    size: Callable[[], int]
    hint: str


def horovod_exchange(process_set: hvd.ProcessSet) -> TableExchange:
    return TableExchange(
        allgather=lambda table: hvd.allgather(table, name="pactrain.mask_fingerprints", process_set=process_set),
        size=process_set.size,
        hint="After loading a checkpoint on one rank, call hvd.broadcast_optimizer_state(optimizer, root_rank=0) "
             "(it carries masks and schedule position) or pt.broadcast_masks(optimizer).")


class Pruner(HostPruner):
    """What persists between steps for pruning: the masks on the parameters' devices, and the Mask Tracker
    check (``core.pruner.HostPruner``: ``rank``, ``validate``, ``verify``, ``sparsity``), moved by
    ``exchange`` (Horovod's allgather by default; the DDP hook passes ``torch.distributed``'s).

    Args:
        named_parameters: the parameters by name.
        prunable_names: names of the parameters to prune (keys of ``named_parameters``).
        schedule: the sparsity schedule that masks are ranked to.
        ranking: how the target sparsity is spread over tensors: ``"layer"``, ``"erk"`` or ``"global"``.
        process_set: the Horovod process set whose ranks must hold equal masks (used by the default ``exchange``).
        exchange: how fingerprint tables move; None: Horovod's allgather on ``process_set``.
        settings: settings the Mask Tracker proves equal on every rank along with the masks.
    """

    framework, kind = "torch", "parameters"

    def __init__(
        self,
        named_parameters: Mapping[str, torch.Tensor],
        prunable_names: list[str],
        schedule: PolynomialSchedule,
        ranking: str = "layer",
        process_set: hvd.ProcessSet = hvd.global_process_set,
        exchange: TableExchange | None = None,
        settings: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(prunable_names, schedule, ranking, settings)
        self.parameters = dict(named_parameters)
        self.process_set = process_set
        self.exchange = exchange or horovod_exchange(process_set)
        self.hint = self.exchange.hint
        self.masks: dict[str, torch.Tensor] = {}
        self.pruned: dict[str, torch.Tensor] = {}  # ~mask, kept so that steps do not allocate it
        self._fingerprints: dict[str, tuple[torch.Tensor, int, tuple[int, int]]] = {}  # mask, its version, hash

    def update(self, step: int, verify: bool = True, zero_weights: bool = True) -> None:
        """``rank`` then ``install``: new masks for ``step``, in place (``zero_weights`` as in ``install``)."""
        self.install(self.rank(step, verify), zero_weights)

    def install(self, masks: Mapping[str, np.ndarray], zero_weights: bool = True) -> None:
        """Replace all masks with validated host masks (local only); a mask that keeps everything is no mask.

        ``zero_weights``: zero the pruned weights now (not while autograd may still read them).
        """
        self.masks = {
            name: torch.from_numpy(np.ascontiguousarray(mask)).to(self.parameters[name].device)
            for name, mask in masks.items() if not mask.all()
        }
        self.pruned = {name: ~mask for name, mask in self.masks.items()}
        if zero_weights:
            self.apply_to_weights()

    # -- the tensor operations HostPruner asks for ---------------------------------------------------
    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.parameters[name].shape)

    def host_weights(self) -> dict[str, np.ndarray]:
        # float32 on the host: numpy has no bfloat16, and magnitudes rank the same in float32.
        return {name: self.parameters[name].detach().float().cpu().numpy() for name in self.prunable_names}

    def host_masks(self) -> dict[str, np.ndarray]:
        return {name: mask.cpu().numpy() for name, mask in self.masks.items()}

    def weight_sums(self, weights: Mapping[str, np.ndarray] | None) -> dict[str, float]:
        """Of the parameters now (on their device: one transfer), whatever ``weights`` says."""
        parameters = [self.parameters[name] for name in self.prunable_names]
        device = parameters[0].device if parameters else None
        sums = torch.stack([p.detach().double().sum().to(device) for p in parameters]).tolist() if parameters else []
        return dict(zip(self.prunable_names, sums))

    def fingerprint(self, mask: np.ndarray) -> tuple[int, int]:
        """Through this module's ``mask_fingerprint``, as the held masks' cache hashes (one place to count)."""
        return mask_fingerprint(mask)

    def held_fingerprints(self) -> dict[str, tuple[int, int]]:
        """Hashed once per mask tensor (a new tensor or an in-place change hashes again), not at every check."""
        return {name: self._held_fingerprint(name) for name in self.masks}

    def allgather(self, table: np.ndarray) -> tuple[np.ndarray, int]:
        return self.exchange.allgather(torch.from_numpy(table)).numpy(), self.exchange.size()

    def _held_fingerprint(self, name: str) -> tuple[int, int]:
        mask = self.masks[name]
        cached = self._fingerprints.get(name)
        if cached is None or cached[0] is not mask or cached[1] != mask._version:
            cached = self._fingerprints[name] = (mask, mask._version, self.fingerprint(mask.cpu().numpy()))
        return cached[2]

    @torch.no_grad()
    def rescale_survivors(self) -> None:
        """Each masked tensor's survivors take its whole norm (``survivor_scales``); before ``apply_to_weights``."""
        for name, scale in self.survivor_scales().items():
            self.parameters[name].mul_(scale)

    @torch.no_grad()
    def apply_to_weights(self) -> None:
        """Pruned weights become exactly 0 (+0.0), whatever the optimizer did."""
        for name, pruned in self.pruned.items():
            self.parameters[name].masked_fill_(pruned, 0)

    @torch.no_grad()
    def mask_gradients(self) -> None:
        for name, pruned in self.pruned.items():
            param = self.parameters[name]
            if param.grad is not None and param.grad.is_sparse:
                param.grad = param.grad.to_dense()  # pruned tensors have dense gradients from now on
            if param.grad is not None:
                param.grad.masked_fill_(pruned, 0)

    @torch.no_grad()
    def clear_optimizer_state(self, state: Mapping[torch.Tensor, dict]) -> None:
        """Zero momentum / Adam moments at pruned coordinates so nothing revives them."""
        for name, pruned in self.pruned.items():
            for value in state.get(self.parameters[name], {}).values():
                if torch.is_tensor(value) and value.shape == pruned.shape:
                    value.masked_fill_(pruned, 0)


# Optimizers whose update leaves a coordinate at exactly 0 when its weight, gradient and state are 0 (every
# term of their update is a multiple of one of those). Pruned coordinates have zero gradients (packing) and
# zero state (cleared at each mask change), so with these, re-zeroing pruned weights after every step is a
# no-op pass over every prunable weight. Exact types: a subclass may change the update.
_ZERO_STAYS_ZERO = frozenset({
    torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, torch.optim.Adamax, torch.optim.NAdam, torch.optim.RAdam,
    torch.optim.RMSprop, torch.optim.Adagrad, torch.optim.Adadelta, torch.optim.ASGD, torch.optim.Rprop,
    torch.optim.SparseAdam,
})


def zero_stays_zero(optimizer: torch.optim.Optimizer) -> bool:
    """Whether re-zeroing pruned weights after ``optimizer``'s step can be skipped (see above)."""
    return type(optimizer) in _ZERO_STAYS_ZERO


def host_masks(masks: dict[str, Any], flags: bool = False) -> dict[str, np.ndarray]:
    """Masks as host arrays; anything that is not a readable tensor or array is refused by name.

    ``flags``: uint8 0/1 masks (as ``state_dict()`` writes them) become bool."""
    if not isinstance(masks, dict):
        raise TypeError(f"masks must be a dict of parameter name -> bool tensor, got {type(masks).__name__}")
    host = {}
    for name, mask in masks.items():
        try:
            host[name] = torch.as_tensor(mask).cpu().numpy()
        except (TypeError, ValueError, RuntimeError, NotImplementedError) as error:
            raise TypeError(f"mask for {name!r} must be a bool tensor or array with data, got {type(mask).__name__}: "
                            f"{error}") from error
        if flags and host[name].dtype == np.uint8:
            if host[name].max(initial=0) > 1:
                raise ValueError(f"mask for {name!r} must hold 0/1 flags, got values up to {host[name].max()}")
            host[name] = host[name].astype(np.bool_)
    return host


class PruningReadout:
    """What a user reads of a torch pruning state (``PacTrainState``, ``PacTrainHookState``): it holds a
    ``core.cycle.PruningCycle`` as ``cycle`` and a ``Pruner`` as ``pruner``."""

    cycle: PruningCycle
    pruner: Pruner

    @property
    def step_count(self) -> int:
        """Optimizer steps taken: the schedule position."""
        return self.cycle.step

    def masks(self) -> dict[str, torch.Tensor]:
        """``{parameter name: bool mask}`` for every pruned parameter (copies)."""
        return {name: mask.clone() for name, mask in self.pruner.masks.items()}

    @property
    def prunable_names(self) -> list[str]:
        """The names of the parameters the schedule may prune, in name order."""
        return list(self.pruner.prunable_names)


class SharedMaskOperations:
    """The ``core.lifecycle.MaskOperations`` both torch states carry out alike, on their ``Pruner`` (``pruner``);
    each state adds ``rank_masks``, ``needs_remask``, ``commit_codec_memory``, ``adopt_broadcast`` and
    ``begin_interval``, which differ."""

    config: PacTrainConfig
    weights_unmasked: bool
    pruner: Pruner

    def holds_masks(self) -> bool:
        return bool(self.pruner.masks)

    def verify_masks(self, position: int) -> None:
        self.pruner.verify(position)

    def finish_early_pruning(self) -> None:
        if self.config.rescale_survivors:
            self.pruner.rescale_survivors()
        self.zero_pruned_weights()
        self.pruner.mask_gradients()

    def mask_gradients(self) -> None:
        self.pruner.mask_gradients()

    def zero_pruned_weights(self) -> None:
        self.pruner.apply_to_weights()
        self.weights_unmasked = False
