"""The library's import graph: what only examples and benchmarks use stays out of it."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "pactrain_hvd"
LIBRARY = ("core", "torch", "tensorflow")
OUTSIDE = ("example_support", "benchmarks")


def imported_modules(path: Path) -> set[str]:
    modules = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules.add(node.module)
            modules.update(f"{node.module}.{alias.name}" for alias in node.names)
    return modules


@pytest.mark.parametrize("part", LIBRARY)
def test_the_library_never_imports_example_support_or_the_benchmarks(part):
    files = sorted((PACKAGE / part).rglob("*.py"))
    assert files, f"no modules under pactrain_hvd/{part}"
    for path in files:
        leaks = {m for m in imported_modules(path) if m.startswith(OUTSIDE)}
        assert not leaks, f"{path.relative_to(PACKAGE.parent)} imports {sorted(leaks)}"


def test_the_check_sees_an_import_of_example_support(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("from example_support.data import load_fashion_mnist\nimport benchmarks\n")
    assert imported_modules(module) >= {"example_support.data", "benchmarks"}


def test_the_package_holds_no_lab_and_never_imports_it():
    lab = [path for folder in ("bench", "benchmarks", "example_support") for path in (PACKAGE / folder).rglob("*.py")]
    assert not lab, f"lab modules inside the package: {lab}"
    for path in sorted(PACKAGE.rglob("*.py")):
        leaks = {m for m in imported_modules(path) if m.split(".")[0] in OUTSIDE}
        assert not leaks, f"{path.relative_to(PACKAGE.parent)} imports {sorted(leaks)}"
