"""The protocol's report, built from its record by ``verdicts.py``: verdicts.json, results.md, one picture per cell."""

from __future__ import annotations

import json
import math
from pathlib import Path

from benchmarks.protocol.spec import Protocol
from benchmarks.protocol.verdicts import NEVER, median, seed_times, verdicts

ACCURACY_WORDS = {"loss": "it never reaches the target; peers do"}  # a verdict that accuracy alone decides
TARGET_STEPS = 9  # the picture's targets: fp16's final less 0 to 2 pp (accuracy), or times 1.00 to 1.08 (perplexity)


def seconds(value: float | None) -> str:
    return "never" if value is None or value == NEVER else f"{value:.0f} s"


def ratio_text(value: float | None) -> str:
    if value is None:
        return "neither reaches it"
    if value == 0.0:
        return "0 (PacTrain never)"
    return "∞ (peer never)" if value == NEVER else f"{value:.2f}x"


def speed_caveat(result: dict, ratio: float | None, words: str) -> str:
    """``words`` with the machine's spread where it could have decided the ratio: both reach the target and the
    cell's runs were made on machines of different speed."""
    machine = result.get("machine") or {}
    decided_by_clocks = ratio is not None and 0.0 < ratio < NEVER
    return words.format(machine["spread"]) if machine.get("varied") and decided_by_clocks else ""


def selection_markdown(protocol: Protocol, chosen: dict) -> list[str]:
    goal = chosen["target"]
    lines = [f"## Selection: `{chosen['cell']}`, seed {', '.join(map(str, protocol.selection_seeds))}", "",
             f"Target {goal:.4f}." if goal is not None else "Target: pending (the reference's loopback run).", "",
             "| family | candidate | training time to target | final metric | chosen |", "|---|---|---:|---:|---|"]
    for name, row in chosen["families"].items():
        family = protocol.families[name]
        for method in family.candidates:
            result = row["candidates"].get(method)
            cells = (seconds(result["train_s"]), f"{result['final']:.4f}") if result else ("pending", "")
            lines.append(f"| {name} | `{method}` | {cells[0]} | {cells[1]} | {'yes' if method == row['chosen'] else ''} |")
    waiting = [f.name for f in protocol.families.values() if not f.available]
    if waiting:
        lines += ["", f"Preregistered, not yet runnable: {', '.join(waiting)}."]
    return lines


def machine_words(machine: dict) -> str:
    """The machine's speed over a cell's runs, and what a spread means for the verdict."""
    words = (f"Machine: the compute bound measured with the runs was {machine['fastest_s']:.3f} to "
             f"{machine['slowest_s']:.3f} s a step ({machine['spread']:.2f}x).")
    if machine["varied"]:
        words += (" The runs were made on machines of different speed: a ratio between families under "
                  f"{machine['spread']:.2f}x may be the machine's, not the method's.")
    return words


def cell_markdown(protocol: Protocol, result: dict) -> list[str]:
    cell = protocol.cells[result["cell"]]
    lines = [f"## `{cell.name}`: {cell.workload}, {cell.link}, {cell.rtt_ms:g} ms round trip, "
             f"{protocol.workers} workers, {cell.cycle_ms:g} ms cycle", "", f"Regime: {result['regime']}."]
    if result["target"] is not None:
        lines += ["", f"Target {result['target']:.4f}."]
    if result.get("machine"):
        lines += ["", machine_words(result["machine"])]
    if result.get("pending"):
        lines += ["", f"Pending: {result['pending']}."]
    for family, outcome in result.get("by_accuracy", {}).items():
        lines += ["", f"Decided by accuracy for {family}: **{outcome}** ({ACCURACY_WORDS[outcome]}, from the final runs "
                  "of this workload in any cell), whatever the clocks of the runs still to come."]
    seeds = protocol.final_seeds
    lines += ["", "| family | method | " + " | ".join(f"seed {s} train / wall" for s in seeds) + " | median train | median wall |",
              "|---|---|" + "---:|" * (len(seeds) + 2)]
    for name, row in result["families"].items():
        per_seed = [f"{seconds(row['seeds'][s]['train'])} / {seconds(row['seeds'][s]['wall'])}" if s in row["seeds"]
                    else "pending" for s in seeds]
        complete = len(row["seeds"]) == len(seeds)  # a median of the seeds run so far would mislead
        medians = [seconds(row[f"median_{clock}_s"]) if complete else "pending" for clock in ("train", "wall")]
        lines.append(f"| {name} | `{row['method']}` | {' | '.join(per_seed)} | {' | '.join(medians)} |")
    return lines


def verdict_rows(protocol: Protocol, result: dict) -> list[str]:
    rows = []
    for family, verdict in result.get("verdicts", {}).items():
        train, wall = verdict["train"], verdict["wall"]
        caveat = speed_caveat(result, train["ratio"], " (machine speed varied {:.2f}x)")
        rows.append(f"| `{result['cell']}` | {result['regime'].split(' (')[0]} | {family} | {train['best_peer']} | "
                    f"{ratio_text(train['ratio'])} | {train['sooner_seeds']} of {len(train['seeds'])} | "
                    f"**{train['outcome']}**{caveat} | {wall['outcome']} ({ratio_text(wall['ratio'])}) | "
                    f"{train['against_reference']['outcome']} ({ratio_text(train['against_reference']['ratio'])}) |")
    for family, outcome in result.get("by_accuracy", {}).items():
        rows.append(f"| `{result['cell']}` | {result['regime'].split(' (')[0]} | {family} | | | | "
                    f"**{outcome}** by accuracy ({ACCURACY_WORDS[outcome]}); clocks pending | | |")
    if not rows:
        rows.append(f"| `{result['cell']}` | {result['regime'].split(' (')[0]} | pending | | | | | | |")
    return rows


def plot_cell(protocol: Protocol, record: dict, result: dict, path: Path) -> None:
    """Median time to target (band: fastest to slowest seed) against the target, one line per family."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cell = protocol.cells[result["cell"]]
    workload = protocol.workloads[cell.workload]
    finals = [r["curve"][-1][2] for s in protocol.final_seeds
              for r in record["runs"] if r["cell"] == f"loopback/{cell.workload}" and r["seed"] == s]
    reference = median(finals)
    goals = ([reference - 0.0025 * i for i in range(TARGET_STEPS)] if workload.higher_is_better
             else [reference * (1 + 0.01 * i) for i in range(TARGET_STEPS)])
    figure, axis = plt.subplots(figsize=(7, 4.2))
    for name, row in result["families"].items():
        series = [[t["train"] for t in seed_times(protocol, record, cell.name, row["method"], protocol.final_seeds, g).values()]
                  for g in goals]
        mid = [median(s) for s in series]
        axis.plot(goals, [m if m < NEVER else math.nan for m in mid], marker="o", markersize=3, label=f"{name}: {row['method']}")
        axis.fill_between(goals, [min(s) if s and min(s) < NEVER else math.nan for s in series],
                          [max(s) if s and max(s) < NEVER else math.nan for s in series], alpha=0.15)
    axis.axvline(result["target"], color="grey", linestyle="--", linewidth=1, label="protocol target")
    axis.set_xlabel("target " + ("test accuracy" if workload.higher_is_better else "validation perplexity"))
    axis.set_ylabel("training seconds to target")
    if workload.higher_is_better:
        axis.invert_xaxis()
    axis.set_title(f"{cell.name}: median of {len(protocol.final_seeds)} seeds, band from fastest to slowest")
    axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


README_START, README_END = "<!-- verdicts: written by python -m benchmarks protocol report -->", "<!-- /verdicts -->"


def readme_table(protocol: Protocol, computed: dict) -> str:
    """The landing page's short table: per cell, each PacTrain family's verdict on the training clock and what it
    rests on."""
    lines = ["| cell | verdict | PacTrain against the best peer | seeds sooner |", "|---|---|---|---|"]
    for name, cell in protocol.cells.items():
        words = (f"{cell.workload}, {cell.link}" + (f", {cell.rtt_ms:g} ms round trip" if cell.rtt_ms else ""))
        result = computed["cells"].get(name, {})
        rows = []
        for family, verdict in result.get("verdicts", {}).items():
            train = verdict["train"]
            caveat = speed_caveat(result, train["ratio"], "; machine speed varied {:.2f}x")
            rows.append((f"**{train['outcome']}** ({family}{caveat})", f"{ratio_text(train['ratio'])} against "
                         f"{train['best_peer']}", f"{train['sooner_seeds']} of {len(train['seeds'])}"))
        for family, outcome in result.get("by_accuracy", {}).items():
            rows.append((f"**{outcome}** ({family}; by accuracy, clocks pending)", ACCURACY_WORDS[outcome], ""))
        columns = [" <br> ".join(column) for column in zip(*rows)] if rows else ["pending", "", ""]
        lines.append(f"| {words} | {' | '.join(columns)} |")
    return "\n".join([README_START, *lines, README_END])


def update_readme(readme: Path, protocol: Protocol, computed: dict) -> None:
    """Replace the table between the README's verdict markers."""
    text = readme.read_text()
    start, end = text.index(README_START), text.index(README_END) + len(README_END)
    readme.write_text(text[:start] + readme_table(protocol, computed) + text[end:])


def write(protocol: Protocol, record: dict, out: Path) -> str:
    """Write verdicts.json, results.md and the pictures into ``out``; returns the Markdown."""
    out.mkdir(parents=True, exist_ok=True)
    computed = verdicts(protocol, record)
    (out / "verdicts.json").write_text(json.dumps(computed, indent=1, sort_keys=True) + "\n")
    lines = [f"# Protocol `{protocol.name}`: verdicts", "",
             f"Built by `python -m benchmarks protocol report {protocol.path}` from `record.json` alone "
             f"(protocol digest `{protocol.digest[:12]}`). Rules: a family's time is the median over seeds "
             f"{', '.join(map(str, protocol.final_seeds))}; PacTrain wins a cell when it reaches the target at least "
             f"{protocol.ratio:g}x sooner than the best peer's median and sooner on at least {protocol.seeds_to_win} "
             "seeds, loses when the best peer does the same, and ties otherwise.", "",
             "| cell | regime | PacTrain family | best peer (training clock) | ratio | sooner on | verdict | "
             f"wall clock | against `{protocol.reference.candidates[0]}` |", "|---|---|---|---|---:|---|---|---|---|"]
    for name in protocol.cells:
        result = computed["cells"].get(name, {"cell": name, "regime": "pending"})
        lines += verdict_rows(protocol, result)
    across = computed["curves_across_cells"]
    if across["pairs"]:
        lines += ["", f"Of the {across['pairs']} method-seed pairs run to the end in two or more cells, {across['same']} "
                  "reached the same metric at every evaluation in each (the arithmetic does not depend on the link): "
                  "whether a method reaches the target on a seed is known from the first cell it ran in; a link "
                  "decides how soon."]
    lines += [""] + selection_markdown(protocol, computed["selection"])
    for name, result in computed["cells"].items():
        lines += [""] + cell_markdown(protocol, result)
        if not result.get("pending"):
            plot_cell(protocol, record, result, out / f"{name}.png")
            lines += ["", f"![{name}]({name}.png)"]
    if record.get("set_aside"):
        lines += ["", "## Runs set aside", "", "Each was repeated; its accuracy stands, its clocks are not the method's.",
                  "", "| cell | method | seed | why |", "|---|---|---:|---|"]
        lines += [f"| `{a['run']['cell']}` | `{a['run']['method']}` | {a['run']['seed']} | {a['reason']} |"
                  for a in record["set_aside"]]
    markdown = "\n".join(lines) + "\n"
    (out / "results.md").write_text(markdown)
    return markdown
