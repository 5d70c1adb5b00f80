"""Verdicts computed from a protocol's record alone: targets, each family's chosen setting, each cell's winner.

Pure functions of (protocol, record): a reader recomputes every number of the report with them, and
``tests/unit/test_protocol_verdicts.py`` recomputes the committed verdicts from the committed record.
"""

from __future__ import annotations

import math
import statistics

from benchmarks.protocol.spec import Protocol

CLOCKS = ("train", "wall")  # training seconds; wall seconds with start-up and evaluations
NEVER = math.inf


def loopback_cell(workload: str) -> str:
    """Where the reference runs with no link, to set a workload's target."""
    return f"loopback/{workload}"


def runs_of(record: dict, **match) -> list[dict]:
    return [run for run in record["runs"] if all(run.get(key) == value for key, value in match.items())]


def reaches(value: float, target: float, higher_is_better: bool) -> bool:
    return value >= target if higher_is_better else value <= target


def median(values: list[float]) -> float:
    """The median, with a never-reached value (``inf``) ordered last."""
    return statistics.median(values) if values else NEVER


def startup_s(run: dict) -> float:
    """Launch to the worker's first line of training code: processes, imports, rendezvous."""
    return max(0.0, run["wall_s"] - run["elapsed_s"])


def time_to_target(run: dict, target: float, higher_is_better: bool, loopback: dict | None = None) -> dict[str, float]:
    """Seconds to the first evaluation that meets ``target``, on both clocks (``inf``: never).

    A reference run on a link (``loopback`` given) ran under a budget to time its steps: its curve is the
    loopback curve of the same seed, so its time is the loopback's steps to target at its own median step
    time, plus, on the wall clock, its start-up, its set-up before the first step and one evaluation's
    median cost per evaluation passed.
    """
    curve = loopback["curve"] if loopback is not None else run["curve"]
    index = next((i for i, point in enumerate(curve) if reaches(point[2], target, higher_is_better)), None)
    if index is None:
        return {"train": NEVER, "wall": NEVER}
    if loopback is None:
        return {"train": curve[index][0], "wall": startup_s(run) + run["eval_elapsed_s"][index]}
    train = curve[index][1] * run["step_s_median"]
    setup = run["eval_elapsed_s"][0] - run["curve"][0][0] - run["eval_s"][0]
    return {"train": train, "wall": startup_s(run) + setup + train + (index + 1) * statistics.median(run["eval_s"])}


def target(protocol: Protocol, record: dict, workload: str, seeds: tuple[int, ...]) -> float | None:
    """The workload's target over ``seeds`` (None until every seed's loopback reference run is in)."""
    finals = []
    for seed in seeds:
        found = runs_of(record, cell=loopback_cell(workload), seed=seed)
        if not found:
            return None
        finals.append(found[0]["curve"][-1][2])
    return protocol.target(workload, finals)


def seed_times(protocol: Protocol, record: dict, cell: str, method: str, seeds: tuple[int, ...],
               goal: float) -> dict[int, dict[str, float]]:
    """Per seed with a run: the method's time to ``goal`` on both clocks."""
    workload = protocol.workloads[protocol.cells[cell].workload]
    reference = protocol.reference.candidates[0]
    times = {}
    for seed in seeds:
        found = runs_of(record, cell=cell, method=method, seed=seed)
        if not found:
            continue
        loopback = None
        if method == reference:
            matches = runs_of(record, cell=loopback_cell(workload.name), seed=seed)
            if not matches:
                continue
            loopback = matches[0]
        times[seed] = time_to_target(found[0], goal, workload.higher_is_better, loopback)
    return times


def selection(protocol: Protocol, record: dict) -> dict:
    """Each runnable family's candidates in the selection cell and the one that goes on to the final runs.

    The chosen candidate has the shortest median training time to the target over the selection seeds; when
    none reaches it, the best median final metric. ``complete`` is False until every candidate has run.
    """
    cell = protocol.cells[protocol.selection_cell]
    workload = protocol.workloads[cell.workload]
    goal = target(protocol, record, cell.workload, protocol.selection_seeds)
    families, complete = {}, goal is not None
    for family in protocol.runnable():
        rows = {}
        for method in family.candidates:
            found = [run for seed in protocol.selection_seeds
                     for run in runs_of(record, stage="selection", cell=cell.name, method=method, seed=seed)]
            if len(found) < len(protocol.selection_seeds) or goal is None:
                complete = False
                continue
            times = seed_times(protocol, record, cell.name, method, protocol.selection_seeds, goal)
            if family.role == "reference":  # its link runs stop at a budget: its final is its loopback run's
                found = [run for seed in protocol.selection_seeds
                         for run in runs_of(record, cell=loopback_cell(cell.workload), seed=seed)]
            finals = [run["curve"][-1][2] for run in found]
            rows[method] = {"train_s": median([t["train"] for t in times.values()]), "final": median(finals)}
        chosen = None
        if rows and len(rows) == len(family.candidates):
            sign = 1 if workload.higher_is_better else -1
            chosen = min(rows, key=lambda m: (rows[m]["train_s"], -sign * rows[m]["final"]))
        families[family.name] = {"candidates": rows, "chosen": chosen}
    return {"cell": cell.name, "target": goal, "complete": complete, "families": families}


def regime(protocol: Protocol, record: dict, cell: str) -> str:
    """In words, from the final runs' median step time over the cell's concurrent compute bound."""
    ratios = [run["step_s_median"] / run["bound"]["step_s"] for run in runs_of(record, stage="final", cell=cell)
              if run.get("bound") and run["family"] != protocol.reference.name]
    if not ratios:
        return "not measured"
    fastest = min(ratios)
    if fastest >= 1.5:
        return f"link-bound (every compressed method's step is at least {fastest:.1f}x the compute bound)"
    if max(ratios) <= 1.2:
        return "compute-bound (every compressed method steps within 1.2x of the compute bound)"
    return f"mixed (compressed methods step at {fastest:.1f}x to {max(ratios):.1f}x the compute bound)"


# Compute bounds of one cell's final runs further apart than this: the runs were made on machines of different
# speed (a shared host's), and a ratio between families under the spread may be the machine's, not the method's.
SPEED_SPREAD = 1.15


def machine_speed(record: dict, cell: str) -> dict | None:
    """The spread of the compute bound (a step of plain training on every worker at once, measured where each
    run was made) over the cell's final runs: ``{"fastest_s", "slowest_s", "spread", "varied"}``."""
    bounds = [run["bound"]["step_s"] for run in runs_of(record, stage="final", cell=cell) if run.get("bound")]
    if not bounds:
        return None
    spread = max(bounds) / min(bounds)
    return {"fastest_s": min(bounds), "slowest_s": max(bounds), "spread": spread, "varied": spread > SPEED_SPREAD}


def compare(protocol: Protocol, ours: dict[int, float], theirs: dict[int, float]) -> dict:
    """The verdict rule on one clock: per-seed times of a PacTrain family against another family's."""
    seeds = sorted(set(ours) & set(theirs))
    mine, other = median([ours[s] for s in seeds]), median([theirs[s] for s in seeds])
    sooner = sum(ours[s] < theirs[s] for s in seeds)
    later = sum(theirs[s] < ours[s] for s in seeds)
    if mine < NEVER and other >= protocol.ratio * mine and sooner >= protocol.seeds_to_win:
        outcome = "win"
    elif other < NEVER and mine >= protocol.ratio * other and later >= protocol.seeds_to_win:
        outcome = "loss"
    else:
        outcome = "tie"
    ratio = other / mine if mine < NEVER else (0.0 if other < NEVER else None)  # None: neither reaches the target
    return {"outcome": outcome, "ratio": ratio, "sooner_seeds": sooner, "later_seeds": later, "seeds": seeds}


def known_reach(record: dict, workload: str, method: str, seeds: tuple[int, ...], goal: float,
                higher_is_better: bool) -> dict[int, bool]:
    """Per seed, whether the method's final runs of ``workload`` in any cell (loopback included) reach ``goal``: a
    run that reached it says so, one that did all its steps without reaching it says it never does."""
    found = {}
    for run in record["runs"]:
        if (run["stage"], run.get("workload"), run["method"]) != ("final", workload, method) or run["seed"] not in seeds:
            continue
        hit = any(reaches(point[2], goal, higher_is_better) for point in run["curve"])
        if hit or run.get("steps") == run.get("planned_steps"):
            found[run["seed"]] = hit
    return found


def by_accuracy(protocol: Protocol, record: dict, cell: str, chosen: dict[str, str], goal: float,
                across: dict[str, int]) -> dict[str, str]:
    """The PacTrain families whose loss in ``cell`` the runs made so far already fix, whatever its clocks: one that
    reaches the target on no final seed, in any cell (the arithmetic does not depend on the link,
    ``across``, ``curves_across_cells``'s count), while every peer that reaches it on a median seed does so on
    ``seeds_to_win`` seeds. (No win is ever fixed this way: the reference reaches its own target on a median seed.)"""
    if across["same"] < across["pairs"]:
        return {}  # some run's arithmetic did depend on where it ran: nothing carries over
    workload = protocol.workloads[protocol.cells[cell].workload]
    seeds = protocol.final_seeds
    reach = {name: known_reach(record, workload.name, method, seeds, goal, workload.higher_is_better)
             for name, method in chosen.items()}
    if any(len(known) < len(seeds) for known in reach.values()):
        return {}
    hits = {name: sum(known.values()) for name, known in reach.items()}
    reaching = [name for name, n in hits.items() if protocol.families[name].role != "pactrain"
                and median([1.0] * n + [NEVER] * (len(seeds) - n)) < NEVER]
    if not reaching or any(hits[name] < protocol.seeds_to_win for name in reaching):
        return {}
    return {name: "loss" for name, n in hits.items() if protocol.families[name].role == "pactrain" and n == 0}


def cell_verdict(protocol: Protocol, record: dict, cell: str, chosen: dict[str, str], unselected: list[str],
                 across: dict[str, int]) -> dict:
    """Per family its chosen method's per-seed times; per PacTrain family and clock, the rule's outcome against
    the best peer (the peer or reference family with the shortest median time) and against the reference.
    ``unselected``: runnable families with no chosen method yet (no verdict until they have one); ``across``:
    ``curves_across_cells(record)``, for ``by_accuracy``."""
    workload = protocol.cells[cell].workload
    seeds = protocol.final_seeds
    goal = target(protocol, record, workload, seeds)
    result = {"cell": cell, "target": goal, "regime": regime(protocol, record, cell),
              "machine": machine_speed(record, cell), "families": {}, "verdicts": {}}
    if goal is None:
        result["pending"] = "the reference's loopback runs are not all in"
        return result
    for name, method in chosen.items():
        times = seed_times(protocol, record, cell, method, seeds, goal)
        result["families"][name] = {"method": method, "seeds": times,
                                    **{f"median_{clock}_s": median([t[clock] for t in times.values()]) for clock in CLOCKS}}
    families = result["families"]
    missing = [name for name, row in families.items() if len(row["seeds"]) < len(seeds)]
    if unselected:
        result["pending"] = f"selection runs missing for {', '.join(unselected)}"
        return result
    if missing or len(families) < len(chosen):
        result["pending"] = f"final runs missing for {', '.join(missing) or 'some families'}"
        result["by_accuracy"] = by_accuracy(protocol, record, cell, chosen, goal, across)
        return result
    peers = [f.name for f in protocol.runnable() if f.role != "pactrain" and f.name in families]
    for family in (f.name for f in protocol.runnable() if f.role == "pactrain" and f.name in families):
        verdict = {}
        for clock in CLOCKS:
            best = min(peers, key=lambda name: families[name][f"median_{clock}_s"])
            per_seed = {name: {s: t[clock] for s, t in families[name]["seeds"].items()} for name in (family, best)}
            reference = {s: t[clock] for s, t in families[protocol.reference.name]["seeds"].items()}
            ours = per_seed[family]
            verdict[clock] = {"best_peer": best, **compare(protocol, ours, per_seed[best]),
                              "against_reference": compare(protocol, ours, reference)}
        result["verdicts"][family] = verdict
    return result


def curves_across_cells(record: dict) -> dict[str, int]:
    """Final method-seed pairs run to their last step in two or more cells on a link, and how many of them
    reached the same metric at every evaluation in each: the arithmetic is deterministic, so a link decides
    when a run reaches the target, not whether."""
    curves: dict[tuple, list] = {}
    for run in record["runs"]:
        if run["stage"] == "final" and not run["cell"].startswith("loopback/") and run.get("steps") == run.get("planned_steps"):
            curves.setdefault((run.get("workload"), run["method"], run["seed"]), []).append([p[1:3] for p in run["curve"]])
    shared = [runs for runs in curves.values() if len(runs) > 1]
    return {"pairs": len(shared), "same": sum(all(curve == runs[0] for curve in runs[1:]) for runs in shared)}


def verdicts(protocol: Protocol, record: dict) -> dict:
    """Everything the report says, from the record alone."""
    chosen = selection(protocol, record)
    picks = {name: row["chosen"] for name, row in chosen["families"].items() if row["chosen"]}
    unselected = [name for name, row in chosen["families"].items() if not row["chosen"]]
    across = curves_across_cells(record)
    cells = ({name: cell_verdict(protocol, record, name, picks, unselected, across) for name in protocol.cells}
             if picks else {})
    return {"protocol": protocol.name, "digest": protocol.digest, "selection": chosen, "cells": cells,
            "curves_across_cells": across}
