"""A protocol file (TOML) read and checked: workloads, cells, method families and the rules of its verdicts.

Every setting a verdict depends on lives in the file, and the file's digest goes into every record it
writes, so a record names the rules its runs were taken under. A family preregistered with
``available = false`` (its candidates fixed before the method could run) is made runnable by flipping that
line to ``true``: the digest is taken over the file as preregistered, so the records already written stay
valid, and the family's runs follow the same rules.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import tomllib

from benchmarks.common.methods import parse_method
from benchmarks.links.links import parse_link

ROLES = ("reference", "pactrain", "peer")
WORKLOADS = ("image", "language")


class ProtocolError(ValueError):
    """A protocol file that cannot be run as written (the message names the file and the key)."""


@dataclass(frozen=True)
class Workload:
    name: str
    steps: int
    eval_every: int
    budget_s: float  # training seconds; a run stops at the first evaluation past it (0: none)
    reference_budget_s: float  # the reference method on a link: seconds to time its steps (0: every step)
    eval_samples: int = 10000
    eval_batches: int = 20

    @property
    def higher_is_better(self) -> bool:
        return self.name == "image"  # test accuracy; the language workload's metric is perplexity


@dataclass(frozen=True)
class Cell:
    name: str
    workload: str
    link: str
    rtt_ms: float
    cycle_ms: float


@dataclass(frozen=True)
class Family:
    name: str
    role: str  # reference | pactrain | peer
    candidates: tuple[str, ...]
    available: bool = True  # False: preregistered, not yet runnable


@dataclass(frozen=True)
class Protocol:
    name: str
    path: Path
    digest: str
    workers: int
    record: Path
    selection_cell: str
    selection_seeds: tuple[int, ...]
    final_seeds: tuple[int, ...]
    accuracy_margin: float
    perplexity_factor: float
    ratio: float
    seeds_to_win: int
    workloads: dict[str, Workload]
    cells: dict[str, Cell]
    families: dict[str, Family]

    @property
    def reference(self) -> Family:
        return next(f for f in self.families.values() if f.role == "reference")

    def runnable(self) -> list[Family]:
        return [f for f in self.families.values() if f.available]

    def target(self, workload: str, reference_finals: list[float]) -> float:
        """The target from the reference's final metrics on loopback (the median of the stage's seeds)."""
        ordered = sorted(reference_finals)
        middle = len(ordered) // 2
        median = ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
        if self.workloads[workload].higher_is_better:
            return median - self.accuracy_margin
        return median * self.perplexity_factor


def _require(table: dict, key: str, kind: type | tuple[type, ...], where: str):
    if key not in table:
        raise ProtocolError(f"{where}: missing {key!r}")
    value = table[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise ProtocolError(f"{where}: {key!r} must be {getattr(kind, '__name__', kind)}, got {value!r}")
    return value


def _seeds(table: dict, key: str, where: str) -> tuple[int, ...]:
    seeds = _require(table, key, list, where)
    if not seeds or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds) or len(set(seeds)) < len(seeds):
        raise ProtocolError(f"{where}: {key!r} must be distinct integers, got {seeds!r}")
    return tuple(seeds)


def load_protocol(path: Path) -> Protocol:
    """Read and check ``path``; a ``ProtocolError`` names what is wrong before anything runs."""
    path = Path(path)
    raw = path.read_bytes()
    try:
        data = tomllib.loads(raw.decode())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise ProtocolError(f"{path}: not TOML: {error}") from error
    where = str(path)
    number = (int, float)
    workloads = {}
    for name, table in _require(data, "workloads", dict, where).items():
        at = f"{where} [workloads.{name}]"
        if name not in WORKLOADS:
            raise ProtocolError(f"{at}: unknown workload; use one of {WORKLOADS}")
        workloads[name] = Workload(name, _require(table, "steps", int, at), _require(table, "eval_every", int, at),
                                   float(_require(table, "budget_s", number, at)),
                                   float(_require(table, "reference_budget_s", number, at)),
                                   table.get("eval_samples", 10000), table.get("eval_batches", 20))
        if workloads[name].steps < 1 or workloads[name].eval_every < 1:
            raise ProtocolError(f"{at}: steps and eval_every must be >= 1")
    cells = {}
    for name, table in _require(data, "cells", dict, where).items():
        at = f"{where} [cells.{name}]"
        workload = _require(table, "workload", str, at)
        if workload not in workloads:
            raise ProtocolError(f"{at}: workload {workload!r} has no [workloads.{workload}] table")
        link = _require(table, "link", str, at)
        try:
            parse_link(link)
        except ValueError as error:
            raise ProtocolError(f"{at}: {error}") from error
        cells[name] = Cell(name, workload, link, float(_require(table, "rtt_ms", number, at)),
                           float(_require(table, "cycle_ms", number, at)))
    families = {}
    for name, table in _require(data, "families", dict, where).items():
        at = f"{where} [families.{name}]"
        role = _require(table, "role", str, at)
        if role not in ROLES:
            raise ProtocolError(f"{at}: role {role!r}; use one of {ROLES}")
        candidates = tuple(_require(table, "candidates", list, at))
        available = table.get("available", True)
        if not candidates or len(set(candidates)) < len(candidates):
            raise ProtocolError(f"{at}: candidates must be distinct method names")
        if available:
            for method in candidates:
                try:
                    parse_method(method)
                except ValueError as error:
                    raise ProtocolError(f"{at}: {error}") from error
        families[name] = Family(name, role, candidates, available)
    if [f.role for f in families.values()].count("reference") != 1:
        raise ProtocolError(f"{where}: exactly one family must have role = \"reference\"")
    selection_cell = _require(data, "selection_cell", str, where)
    if selection_cell not in cells:
        raise ProtocolError(f"{where}: selection_cell {selection_cell!r} is not one of the cells {sorted(cells)}")
    selection_seeds, final_seeds = _seeds(data, "selection_seeds", where), _seeds(data, "final_seeds", where)
    if set(selection_seeds) & set(final_seeds):
        raise ProtocolError(f"{where}: final_seeds must differ from selection_seeds (a selection seed is spent)")
    return Protocol(
        name=_require(data, "name", str, where), path=path, digest=_digest(raw),
        workers=_require(data, "workers", int, where), record=Path(_require(data, "record", str, where)),
        selection_cell=selection_cell, selection_seeds=selection_seeds, final_seeds=final_seeds,
        accuracy_margin=float(_require(data, "accuracy_margin", number, where)),
        perplexity_factor=float(_require(data, "perplexity_factor", number, where)),
        ratio=float(_require(data, "ratio", number, where)), seeds_to_win=_require(data, "seeds_to_win", int, where),
        workloads=workloads, cells=cells, families=families)


_MADE_AVAILABLE = re.compile(rb"^available = true$", re.MULTILINE)


def _digest(raw: bytes) -> str:
    """The file's SHA-256, every ``available = true`` read as the ``available = false`` it was preregistered as."""
    return hashlib.sha256(_MADE_AVAILABLE.sub(b"available = false", raw)).hexdigest()
