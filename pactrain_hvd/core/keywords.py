"""PacTrain's keyword arguments, declared once for every façade: each one's default and what it means.

``pactrain_keywords`` puts them into a façade's signature (``help``, ``inspect.signature``, IDEs) and
``documents_keywords`` into its docstring, where a line ``{pactrain_keywords}`` stands in its ``Args:`` section.
"""

from __future__ import annotations

import functools
import inspect
import re
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pactrain_hvd.core.masks import DEFAULT_RANKING

# Re-proving masks costs one small allgather plus a hash of the surviving positions; every
# 100 steps it stays far below 1 % of training time (docs/performance.md, "The Mask Tracker's cost").
DEFAULT_VERIFY_EVERY = 100


@dataclass(frozen=True)
class Keyword:
    """One keyword: its default (None defers to ``PacTrainConfig.from_arguments``) and its meaning."""

    default: Any
    help: str


DECLARED: dict[str, Keyword] = {
    "sparsity": Keyword(None, "Final fraction of pruned coordinates in each prunable tensor, ``0 <= s < 1`` (0.9 if "
                              "left out); 0 behaves exactly like Horovod's own wrapper."),
    "begin_step": Keyword(None, "First step of the cubic schedule (masks are recomputed at the start of its steps)."),
    "end_step": Keyword(None, "Last step of the schedule; masks stay fixed after it. ``begin_step=0, end_step=0``: "
                              "prune once, before step 0's first all-reduce."),
    "frequency": Keyword(None, "Steps between two mask updates of the schedule."),
    "total_steps": Keyword(None, "The run's steps: schedule steps not given follow it (prune from 10 % to 60 % of the "
                                 "run in ten updates). Without it: steps 0 to 1000, every 100."),
    "schedule": Keyword(None, "A schedule object instead of ``sparsity`` and the steps: ``ConstantSparsity(0.95)`` "
                              "(sparse from the first step, ranked on the weights as broadcast), ``PolynomialDecay`` "
                              "(gradual, tfmot's) or ``short_ramp(0.95, steps=50)``."),
    "prunable": Keyword(None, "Predicate ``(name, tensor) -> bool`` or glob patterns of names; default: weights of "
                              "two or more dimensions."),
    "ranking": Keyword(DEFAULT_RANKING, "``\"layer\"`` (each tensor to the target), ``\"erk\"`` (Erdős-Rényi-Kernel "
                                        "shares: large tensors pruned more) or ``\"global\"`` (one threshold)."),
    "pack_min_numel": Keyword(None, "The adaptive plan: a tensor is packed only from this many elements."),
    "pack_max_density": Keyword(None, "The adaptive plan: a tensor is packed only up to this fraction of survivors."),
    "verify_every": Keyword(DEFAULT_VERIFY_EVERY, "Also prove the masks agree every N steps (0: only at the first "
                                                  "step and after mask changes)."),
    "packed_values": Keyword("inherit", "How packed values travel: ``\"inherit\"`` (as ``compression`` says), "
                                        "``\"fp16\"``, ``\"ternary\"`` (shared-scale stochastic codes in {-1, 0, 1} "
                                        "with error feedback in int32 lanes; fp16 beyond 644 ranks) or ``\"int3\"`` "
                                        "(codes in [-3, 3]; fp16 beyond 214 ranks). Codes need op Average or Sum."),
    "masks": Keyword(None, "Bring your own masks: ``{name: bool mask}`` or a model pruned with "
                           "``torch.nn.utils.prune`` / tfmot's ``prune_low_magnitude``; fixed unless "
                           "``continue_pruning``."),
    "continue_pruning": Keyword(False, "With ``masks``: the schedule goes on pruning from them."),
    "resume_changed_settings": Keyword(False, "Restore a checkpoint saved with another ``sparsity``, schedule, "
                                              "``ranking`` or ``packed_values`` with a warning instead of "
                                              "``CheckpointError``."),
    "values": Keyword(None, "The deprecated name of ``packed_values`` (``\"fp32\"`` there is ``\"inherit\"``)."),
    "rescale_survivors": Keyword(False, "With a schedule that prunes at step 0: scale each pruned tensor's "
                                        "survivors once so it keeps its norm (for training from scratch)."),
    "sync_every": Keyword(1, "Local steps: 1 reduces every step's gradients; H > 1 steps each rank on its own and "
                             "every H steps takes one outer step from the anchor on the ranks' packed average "
                             "progress (DiLoCo's). Needs op Average."),
    "outer_lr": Keyword(0.7, "The outer step's learning rate (1.0 with ``outer_momentum=0``: model averaging)."),
    "outer_momentum": Keyword(0.9, "The outer step's Nesterov momentum, ``0 <= m < 1``."),
}
KEYWORDS: dict[str, Any] = {name: keyword.default for name, keyword in DECLARED.items()}
CONFIG_KEYWORDS = ("sparsity", "begin_step", "end_step", "frequency", "total_steps", "schedule", "ranking",
                   "pack_min_numel", "pack_max_density", "verify_every", "resume_changed_settings", "rescale_survivors",
                   "sync_every", "outer_lr", "outer_momentum")
# Local steps with an outer sync (``core.local_steps``): left out where the façade does not make the update (a tape,
# a DDP comm hook).
LOCAL_STEP_KEYWORDS = ("sync_every", "outer_lr", "outer_momentum")
PLACEHOLDER = re.compile(r"^( *)\{pactrain_keywords\}$", re.MULTILINE)


def pactrain_keywords(*, without: tuple[str, ...] = ()) -> Callable[[Callable], Callable]:
    """Decorator for a façade whose last parameter is ``**pactrain``: it takes ``KEYWORDS`` (less ``without``) as
    keyword-only arguments with their defaults, and its signature says so.

    Any other keyword is a ``TypeError`` naming it, as for a plain signature; the function receives every
    one of them in ``pactrain``, defaults filled in.

    Args:
        without: keywords this façade does not take.

    Returns:
        The decorator.
    """
    names = [name for name in KEYWORDS if name not in without]

    def decorate(function: Callable) -> Callable:
        signature = inspect.signature(function)
        own = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
        declared = signature.replace(parameters=own + [
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=KEYWORDS[name]) for name in names])

        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            bound = declared.bind(*args, **kwargs)  # refuses unknown or doubled arguments, naming them
            pactrain = {name: bound.arguments.pop(name, KEYWORDS[name]) for name in names}
            return function(*bound.args, **bound.kwargs, **pactrain)

        wrapper.__signature__ = declared
        return wrapper

    return decorate


def keyword_docs(without: tuple[str, ...] = (), indent: str = "", meaning: dict[str, str] | None = None) -> str:
    """Google-style ``Args:`` entries of the keywords (less ``without``), each line prefixed with ``indent``.

    Args:
        without: keywords to leave out.
        indent: what each entry's first line starts with (continuation lines go 4 spaces further).
        meaning: a façade's own help for some keywords, by name, in place of the declared one.

    Returns:
        The entries, one keyword after another, without a trailing newline.
    """
    meaning = meaning or {}
    return "\n".join(textwrap.fill(f"{name}: {meaning.get(name, keyword.help)}", width=110, initial_indent=indent,
                                   subsequent_indent=indent + "    ")
                     for name, keyword in DECLARED.items() if name not in without)


def documents_keywords(*, without: tuple[str, ...] = (), meaning: dict[str, str] | None = None) -> Callable[[Any], Any]:
    """Decorator: the line ``{pactrain_keywords}`` of a class's or function's docstring becomes ``keyword_docs``.

    Args:
        without: keywords the façade does not take.
        meaning: the façade's own help for some keywords, by name (where it reads them otherwise).

    Returns:
        The decorator; it returns the class or function it is given.
    """
    def decorate(target: Any) -> Any:
        if target.__doc__:  # None under python -OO
            target.__doc__ = PLACEHOLDER.sub(lambda line: keyword_docs(without, line.group(1), meaning),
                                             target.__doc__)
        return target

    return decorate
