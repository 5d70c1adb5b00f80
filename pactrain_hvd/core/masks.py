"""Unstructured magnitude masks, computed on host arrays so both frontends get identical masks."""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from pactrain_hvd.core.errors import NonFiniteWeightsError

RANKINGS = ("layer", "erk", "global")  # how a target sparsity is spread over tensors
# ERK keeps small tensors (first convolutions, heads) denser; on FashionVGG at 0.9 it costs 0.08 pp of top-1
# against per-layer's 0.70 (reports/accuracy).
DEFAULT_RANKING = "erk"


def num_to_keep(numel: int, sparsity: float) -> int:
    """Surviving coordinates of a tensor at ``sparsity``.

    Args:
        numel: number of coordinates of the tensor.
        sparsity: fraction of coordinates to prune, 0 <= s < 1.

    Returns:
        ``round(numel * (1 - sparsity))``, at least 1; 0 for an empty tensor.
    """
    if numel == 0:
        return 0
    return max(1, int(round(numel * (1.0 - sparsity))))


def _scores(weight: np.ndarray, previous: np.ndarray | None) -> np.ndarray:
    """|w|, with coordinates pruned before ranked below everything: masks only shrink."""
    scores = np.abs(weight.astype(np.float64, copy=False)).ravel()
    if previous is not None:
        scores = np.where(previous.ravel(), scores, -1.0)
    return scores


def _keep(scores: np.ndarray, sparsity: float) -> int:
    """``num_to_keep``, but never more than survive already: a lower target revives nothing."""
    return min(num_to_keep(scores.size, sparsity), int((scores >= 0).sum()))


def _top_mask(scores: np.ndarray, keep: int) -> np.ndarray:
    mask = np.zeros(scores.shape, dtype=bool)
    if keep >= scores.size:
        mask[:] = True
    elif keep > 0:
        mask[np.argpartition(-scores, keep - 1, kind="introselect")[:keep]] = True
    return mask


def erk_sparsities(shapes: Mapping[str, tuple[int, ...]], sparsity: float) -> dict[str, float]:
    """Per-tensor sparsities of the Erdős-Rényi-Kernel rule (Evci et al. 2020, RigL).

    Density is proportional to ``sum(shape) / prod(shape)``, scaled so that the tensors together reach
    ``sparsity``; a tensor whose density would pass 1 stays dense and the rest make up for it.

    Args:
        shapes: name -> tensor shape.
        sparsity: overall fraction of coordinates to prune, 0 <= s < 1.

    Returns:
        name -> that tensor's sparsity (0.0 for tensors kept dense and for empty ones).
    """
    sizes = {name: int(np.prod(shape)) for name, shape in shapes.items()}
    weights = {name: sum(shape) / sizes[name] for name, shape in shapes.items() if sizes[name]}
    dense: set[str] = set()
    while True:
        budget = (1.0 - sparsity) * sum(sizes.values()) - sum(sizes[name] for name in dense)
        rest = {name: w for name, w in weights.items() if name not in dense}
        scale = budget / sum(w * sizes[name] for name, w in rest.items()) if rest else 0.0
        overflow = {name for name, w in rest.items() if scale * w >= 1.0}
        if not overflow:
            break
        dense |= overflow
    return {name: 0.0 if name in dense or not sizes[name] else 1.0 - scale * weights[name] for name in shapes}


def not_finite(weights: Mapping[str, Any]) -> list[str]:
    """Names of the tensors holding NaN or inf: magnitudes cannot rank them.

    Args:
        weights: name -> weight array (anything ``np.asarray`` takes).

    Returns:
        The names whose weights are not all finite, in ``weights``' order.
    """
    return [name for name, w in weights.items() if not np.isfinite(np.asarray(w)).all()]


def magnitude_masks(
    weights: Mapping[str, np.ndarray],
    sparsity: float,
    previous: Mapping[str, np.ndarray] | None = None,
    ranking: str = "layer",
) -> dict[str, np.ndarray]:
    """Boolean masks keeping the largest-magnitude weights.

    Args:
        weights: name -> weight array.
        sparsity: target fraction of coordinates to prune, 0 <= s < 1.
        previous: name -> earlier mask; a coordinate pruned there stays pruned.
        ranking: ``"layer"`` keeps ``num_to_keep`` per tensor; ``"erk"`` the same at each tensor's
            ``erk_sparsities`` share; ``"global"`` ranks all tensors together (each still keeps at least
            one coordinate).

    Returns:
        name -> bool mask of the weight's shape, True where a weight survives.

    Raises:
        ValueError: ``ranking`` is not one of ``"layer"``, ``"erk"``, ``"global"``.
        NonFiniteWeightsError: weights hold NaN or inf (the message names them).
    """
    if ranking not in RANKINGS:
        raise ValueError(f"ranking must be one of {', '.join(map(repr, RANKINGS))}, got {ranking!r}")
    broken = not_finite(weights)
    if broken:
        raise NonFiniteWeightsError(f"weights hold NaN or inf, so magnitudes cannot rank them: {', '.join(broken)}")
    previous = previous or {}
    scores = {name: _scores(np.asarray(w), previous.get(name)) for name, w in weights.items()}
    if ranking == "layer":
        flat = {name: _top_mask(s, _keep(s, sparsity)) for name, s in scores.items()}
    elif ranking == "erk":
        shares = erk_sparsities({name: np.shape(w) for name, w in weights.items()}, sparsity)
        flat = {name: _top_mask(s, _keep(s, shares[name])) for name, s in scores.items()}
    else:
        names = list(scores)
        joined = np.concatenate([scores[n] for n in names]) if names else np.zeros(0)
        joined_mask = _top_mask(joined, _keep(joined, sparsity))
        flat, offset = {}, 0
        for name in names:
            part = joined_mask[offset : offset + scores[name].size]
            if not part.any() and part.size:  # never silence a whole layer: keep its largest survivor
                part = _top_mask(scores[name], 1) & (scores[name] >= 0)
            flat[name] = part
            offset += scores[name].size
    return {name: flat[name].reshape(np.shape(weights[name])) for name in weights}


def survivor_scales(weights: Mapping[str, np.ndarray], masks: Mapping[str, np.ndarray]) -> dict[str, float]:
    """Per masked tensor, the factor that gives its survivors the tensor's whole norm.

    Applied once to a freshly initialised model pruned before its first update, it keeps each layer's output
    at the scale its initialiser chose: the largest 5 % of a uniform initialisation hold about 14 % of its
    squared norm, so at sparsity 0.95 a pruned layer's outputs would start 2.6x smaller.

    Args:
        weights: name -> weight array (at least every name of ``masks``).
        masks: name -> bool mask of that weight's shape.

    Returns:
        name of each mask -> ``sqrt(sum(w**2) / sum((w * mask)**2))`` (1.0 where nothing is pruned or no
        survivor is nonzero).
    """
    scales = {}
    for name, mask in masks.items():
        weight = np.asarray(weights[name], dtype=np.float64)
        whole = float(np.square(weight).sum())
        kept = float(np.square(weight[np.asarray(mask, dtype=bool)]).sum())
        scales[name] = math.sqrt(whole / kept) if kept > 0 and whole > kept else 1.0
    return scales


def validate_mask(name: str, mask: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Check a user- or checkpoint-supplied mask.

    Args:
        name: the tensor's name, for messages.
        mask: the mask to check (anything ``np.asarray`` takes).
        shape: the tensor's shape.

    Returns:
        The mask as a bool array, unchanged.

    Raises:
        TypeError: the mask's dtype is not bool.
        ValueError: its shape differs from ``shape``, or it prunes every coordinate of a non-empty tensor.
    """
    mask = np.asarray(mask)
    if mask.dtype != np.bool_:
        raise TypeError(f"mask for {name!r} must have dtype bool, got {mask.dtype}")
    if tuple(mask.shape) != tuple(shape):
        raise ValueError(f"mask for {name!r} has shape {tuple(mask.shape)}, parameter has shape {tuple(shape)}")
    if mask.size and not mask.any():
        raise ValueError(f"mask for {name!r} is all zeros: the layer would never be updated")
    return mask


def validate_masks(masks: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]], kind: str) -> dict[str, np.ndarray]:
    """Check given masks against the prunable tensors, each as ``validate_mask`` does (raising as it does).

    Args:
        masks: name -> mask, for some or all of the prunable tensors.
        shapes: name -> shape of every prunable tensor.
        kind: ``"parameters"`` or ``"variables"``, for the message.

    Returns:
        name -> the mask as a bool array, nothing changed.

    Raises:
        ValueError: a mask is given for a name not in ``shapes``.
    """
    unknown = sorted(set(masks) - set(shapes))
    if unknown:
        raise ValueError(f"masks given for {kind} that are not prunable here: {', '.join(unknown)}")
    return {name: validate_mask(name, np.asarray(mask), tuple(shapes[name])) for name, mask in masks.items()}


def overall_sparsity(numels: Mapping[str, int], kept: Mapping[str, int]) -> float:
    """Fraction of pruned coordinates over several tensors.

    Args:
        numels: name -> number of coordinates, for every tensor counted.
        kept: name -> surviving coordinates; a name missing here keeps all of its coordinates.

    Returns:
        ``1 - sum(kept) / sum(numels)``; 0.0 when the tensors hold no coordinates.
    """
    total = sum(numels.values())
    return 1.0 - sum(kept.get(name, numel) for name, numel in numels.items()) / total if total else 0.0


def prunable_predicate(prunable: Callable[[str, Any], bool] | Iterable[str] | None,
                       default: Callable[[str, Any], bool]) -> Callable[[str, Any], bool]:
    """``prunable`` as a predicate ``(name, tensor) -> bool``.

    Args:
        prunable: a predicate ``(name, tensor) -> bool``, glob patterns on names (not a single string), or None.
        default: the predicate to use when ``prunable`` is None.

    Returns:
        ``prunable`` itself when callable, a predicate matching names against its patterns, or ``default``.

    Raises:
        TypeError: ``prunable`` is a single string, not iterable, or holds a pattern that is not a string.
    """
    if prunable is None:
        return default
    if callable(prunable):
        return prunable
    patterns = prunable_patterns(prunable)
    return lambda name, _: any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


def prunable_patterns(prunable: Any) -> list[str]:
    """``prunable`` given as glob patterns, checked: a list (or other iterable) of strings."""
    if isinstance(prunable, str):
        raise TypeError("prunable must be a predicate or a list of name patterns, not a single string")
    try:
        patterns = list(prunable)
    except TypeError:
        raise TypeError(f"prunable must be a predicate (name, tensor) -> bool or a list of glob patterns on names, "
                        f"got {prunable!r} ({type(prunable).__name__})") from None
    wrong = [pattern for pattern in patterns if not isinstance(pattern, str)]
    if wrong:
        raise TypeError(f"prunable patterns must be strings, got {wrong[0]!r} ({type(wrong[0]).__name__})")
    return patterns


def select_prunable_names(named: Mapping[str, Any], prunable: Callable[[str, Any], bool] | Iterable[str] | None,
                          default: Callable[[str, Any], bool], trainable: Callable[[Any], bool]) -> list[str]:
    """The trainable names of ``named`` to prune, by predicate, glob patterns or ``default``.

    A pattern that matches no name is an error naming it: a misspelt pattern would otherwise prune nothing,
    silently.

    Args:
        named: name -> tensor, e.g. a model's named parameters.
        prunable: a predicate ``(name, tensor) -> bool``, glob patterns on names, or None for ``default``.
        default: the predicate used when ``prunable`` is None.
        trainable: ``tensor -> bool``; only tensors it accepts are pruned.

    Returns:
        The names to prune, in ``named``'s order.

    Raises:
        ValueError: a pattern matches no name of ``named``.
        TypeError: ``prunable`` is neither a predicate nor an iterable of string patterns.
    """
    if prunable is not None and not callable(prunable):
        prunable = prunable_patterns(prunable)  # read once: an iterator would be spent by the check below
        unmatched = [pattern for pattern in prunable
                     if not any(fnmatch.fnmatchcase(name, pattern) for name in named)]
        if unmatched:
            shown = ", ".join(sorted(named)[:5]) + (", ..." if len(named) > 5 else "")
            raise ValueError(f"prunable pattern {unmatched[0]!r} matches no parameter name (names look like: {shown})")
    predicate = prunable_predicate(prunable, default)
    return [name for name, tensor in named.items() if trainable(tensor) and predicate(name, tensor)]
