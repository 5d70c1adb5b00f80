"""What a user installs: the wheel holds the library (``pactrain_hvd/``) and nothing of the lab beside it."""

import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# Records, environments and build outputs: not read by the build, left out of the copy it runs in.
NOT_COPIED_AT_TOP = {".git", ".venv", ".venv-compat", "bench", "reports", "runs", "build", "dist"}
NOT_COPIED = shutil.ignore_patterns("*.egg-info", "__pycache__", ".pytest_cache", ".ruff_cache", ".hypothesis")


def not_copied(folder: str, names: list[str]) -> set[str]:
    top = {name for name in names if name in NOT_COPIED_AT_TOP} if Path(folder) == REPO else set()
    return top | NOT_COPIED(folder, names)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Iterator[zipfile.ZipFile]:
    """The wheel ``pip wheel --no-deps .`` builds from a copy of the repository."""
    source = tmp_path_factory.mktemp("source") / "repo"
    shutil.copytree(REPO, source, ignore=not_copied)
    out = tmp_path_factory.mktemp("wheel")
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                            "-q", "-w", str(out), str(source)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, f"pip wheel failed:\n{build.stdout}{build.stderr}"
    wheels = list(out.glob("pactrain_hvd-*.whl"))
    assert len(wheels) == 1, f"expected one wheel, found {[w.name for w in out.iterdir()]}"
    with zipfile.ZipFile(wheels[0]) as archive:
        yield archive


@pytest.fixture(scope="module")
def wheel_names(wheel) -> list[str]:
    return wheel.namelist()


def test_the_wheel_holds_only_the_library(wheel, wheel_names):
    outside = [name for name in wheel_names
               if not name.startswith("pactrain_hvd/") and not (name.startswith("pactrain_hvd-") and ".dist-info/" in name)]
    assert not outside, f"the wheel holds files outside pactrain_hvd/: {outside}"
    lab = [name for name in wheel_names
           if any(part in {"bench", "benchmarks", "example_support", "examples", "tests", "scripts"}
                  for part in Path(name).parts)]
    assert not lab, f"the wheel holds lab files: {lab}"
    top_level = [name for name in wheel_names if name.endswith(".dist-info/top_level.txt")]
    assert [wheel.read(name).decode().split() for name in top_level] == [["pactrain_hvd"]]


def test_the_wheel_holds_every_library_module(wheel_names):
    modules = {path.relative_to(REPO).as_posix() for path in (REPO / "pactrain_hvd").rglob("*.py")
               if "__pycache__" not in path.parts}
    assert modules, "no modules under pactrain_hvd/"
    missing = modules - set(wheel_names)
    assert not missing, f"library modules missing from the wheel: {sorted(missing)}"
