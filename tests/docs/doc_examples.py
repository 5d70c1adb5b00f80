"""The Python code blocks of README.md and docs/*.md, with the marker that says how each one runs.

Every ```python block is preceded (blank lines aside) by an HTML comment, invisible on GitHub and in
the built site:

    <!-- example: torch -->             run under horovodrun -np 2 (horovod.torch)
    <!-- example: tensorflow keras -->  run under horovodrun -np 2 (horovod.tensorflow) after the setup "keras"
    <!-- example: ddp -->               run under torchrun --nproc-per-node 2 (torch.distributed, Gloo)
    <!-- example: partial REASON -->    not run: a deliberately partial snippet, reported as skipped

The word after the kind names a setup of ``run_examples.py`` (the tiny model, data and optimizer
the snippet refers to without defining them).
"""

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.parts)]
KINDS = ("torch", "tensorflow", "ddp", "partial")
MARKER = re.compile(r"^<!--\s*example:\s*(\S+)\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^(`{3,})(\S*)")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int          # 1-based line of the opening fence
    language: str
    code: str
    kind: str | None   # None: no marker
    setup: str = ""    # the setup to run first (or, for "partial", the reason)

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    lines = page.read_text(encoding="utf-8").splitlines()
    found, i = [], 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        fence, language = match.groups()
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith(fence) and not lines[j].strip("`")), len(lines))
        previous = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = MARKER.match(previous)
        kind, setup = (marker.group(1), marker.group(2)) if marker else (None, "")
        found.append(Block(page, i + 1, language, "\n".join(lines[i + 1:end]) + "\n", kind, setup))
        i = end + 1
    return found


def python_blocks() -> list[Block]:
    return [b for page in PAGES for b in blocks(page) if b.language == "python"]


def runnable(kind: str) -> list[Block]:
    return [b for b in python_blocks() if b.kind == kind]
