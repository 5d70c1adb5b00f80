"""The documentation: README.md as a landing page, the Sphinx site under docs/, and the API reference.

Links stay inside the repository and point at files that exist; the README's Python snippets compile;
every public name of the documented modules appears in the API reference; the site builds with
warnings as errors (skipped where Sphinx is not installed).
"""

import ast
import importlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from docstrings import problems, public_names

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.parts)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
INCLUDE = re.compile(r"^```\{(?:include|literalinclude)\}\s+(\S+)", re.M)
API_MODULES = ("pactrain_hvd.torch", "pactrain_hvd.torch.ddp", "pactrain_hvd.tensorflow",
               "pactrain_hvd.tensorflow.keras", "pactrain_hvd.core")
README_MAX_LINES = 200
DDP_PUBLIC = ("PacTrainHookState", "pactrain_hook")


def links(page: Path) -> list[str]:
    return LINK.findall(FENCE.sub("", page.read_text(encoding="utf-8")))


@pytest.mark.parametrize("page", [ROOT / "README.md", *PAGES], ids=lambda p: str(p.relative_to(ROOT)))
def test_links_stay_inside_the_repository_and_exist(page):
    for target in links(page):
        assert "://" not in target and not target.startswith("mailto:"), f"{page.name}: link outside the repository: {target}"
        path = target.split("#", 1)[0]
        if not path:
            continue  # an anchor on the same page: Sphinx checks it
        resolved = (page.parent / path).resolve()
        assert resolved.is_relative_to(ROOT), f"{page.name}: {target} points outside the repository"
        assert resolved.exists(), f"{page.name}: {target} does not exist"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_included_records_exist_inside_the_repository(page):
    for target in INCLUDE.findall(page.read_text(encoding="utf-8")):
        resolved = (page.parent / target).resolve()
        assert resolved.is_relative_to(ROOT) and resolved.is_file(), f"{page.name}: include {target}"


def test_readme_is_a_landing_page():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_MAX_LINES
    for word in (r"\bissue \d+", r"\bI\b", r"\bmy\b", r"\bwe\b", r"\bour\b", "shared/"):
        assert not re.search(word, text, re.I if word != r"\bI\b" else 0), f"README.md: {word!r}"


def test_readme_python_snippets_compile():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    snippets = re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)
    assert len(snippets) >= 4, "PyTorch, TF2 tape, Keras and DDP snippets"
    for snippet in snippets:
        ast.parse(snippet)


def test_setup_takes_the_landing_page_as_long_description():
    setup = (ROOT / "setup.py").read_text(encoding="utf-8")
    assert 'open("README.md"' in setup


@pytest.mark.parametrize("module", API_MODULES)
def test_every_public_name_is_in_the_api_reference(module):
    pytest.importorskip("horovod")
    mod = importlib.import_module(module)
    names = getattr(mod, "__all__", None) or DDP_PUBLIC  # torch.ddp has no __all__: its hook and its state
    reference = "\n".join(p.read_text(encoding="utf-8") for p in sorted((DOCS / "api").glob("*.md")))
    missing = [n for n in names if n != "Compression" and not re.search(rf"[.`~]{re.escape(n)}\b", reference)]
    assert not missing, f"{module}: not in docs/api: {missing}"


@pytest.mark.parametrize("module", (*API_MODULES, "pactrain_hvd.planner"))
def test_every_public_name_has_a_google_style_docstring(module):
    """What an IDE shows and the API reference renders: each argument under Args, what comes back under Returns."""
    pytest.importorskip("horovod")
    missing = [problem for name, obj in public_names(module).items() for problem in problems(name, obj)]
    assert missing == []


def test_the_docstring_check_names_what_is_missing():
    def documented(rate: float, steps: int) -> float:
        """Summary.

        Args:
            rate: a rate.
        """
        return rate * steps

    assert problems("documented", documented) == ["documented: Args/Attributes lack steps",
                                                  "documented: no Returns section"]


def test_the_site_builds_with_warnings_as_errors(tmp_path):
    pytest.importorskip("sphinx")
    pytest.importorskip("myst_parser")
    sphinx_build = Path(sys.executable).with_name("sphinx-build")
    command = [str(sphinx_build)] if sphinx_build.exists() else [shutil.which("sphinx-build") or "sphinx-build"]
    result = subprocess.run([*command, "-W", "--keep-going", "-q", "-b", "html", str(DOCS), str(tmp_path / "html")],
                            cwd=ROOT, capture_output=True, text=True, timeout=600)
    warnings = [line for line in result.stderr.splitlines() if "WARNING" in line and "absl::InitializeLog" not in line]
    assert result.returncode == 0 and not warnings, "\n".join(warnings) or result.stderr[-4000:]
    assert (tmp_path / "html" / "api" / "torch.html").is_file()


def test_setup_says_what_an_index_page_shows():
    result = subprocess.run([sys.executable, "setup.py", "-q", "--classifiers", "--license"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    classifiers = result.stdout.splitlines()
    assert "License :: OSI Approved :: Apache Software License" in classifiers and "Apache-2.0" in classifiers
    assert any(c.startswith("Programming Language :: Python :: 3.") for c in classifiers)
    setup_py = (ROOT / "setup.py").read_text(encoding="utf-8")
    assert "python_requires=" in setup_py and '"horovod>=0.28.1,<0.29"' in setup_py
    assert not re.search(r"example\.(com|org)|TODO|FIXME", setup_py), "a placeholder in setup.py"


def test_the_files_an_adopter_looks_for_exist_and_agree_on_the_version():
    import pactrain_hvd

    assert "Apache License" in (ROOT / "LICENSE").read_text() and "Version 2.0" in (ROOT / "LICENSE").read_text()
    assert f"## {pactrain_hvd.__version__}" in (ROOT / "CHANGELOG.md").read_text()
    assert f'version: "{pactrain_hvd.__version__}"' in (ROOT / "CITATION.cff").read_text()
    assert "arXiv:2505.18563" in (ROOT / "CITATION.cff").read_text()
    assert "docs/contributing.md" in (ROOT / "CONTRIBUTING.md").read_text()
    version = subprocess.run([sys.executable, "setup.py", "--version"], cwd=ROOT, capture_output=True, text=True)
    assert version.stdout.strip().splitlines()[-1] == pactrain_hvd.__version__
    assert 'html_title = f"pactrain_hvd {release}"' in (DOCS / "conf.py").read_text()
