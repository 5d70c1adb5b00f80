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


# -- private names stay in their module --------------------------------------------------------------
def defined_names(tree: ast.AST) -> set[str]:
    """Names a module defines: functions, classes, assigned names and attributes, annotated fields, slots."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__slots__" for t in node.targets):
            names.update(c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant))
    return names


def private_uses(tree: ast.AST) -> set[tuple[str, int]]:
    """``_name`` read as an attribute or imported (not dunders)."""
    uses = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            uses.add((node.attr, node.lineno))
        elif isinstance(node, ast.ImportFrom):
            uses.update((alias.name, node.lineno) for alias in node.names)
    return {(name, line) for name, line in uses if name.startswith("_") and not name.startswith("__")}


def base_modules(tree: ast.AST) -> set[Path]:
    """The library modules of the classes this module's classes derive from (their protected names are shared)."""
    imported = {alias.asname or alias.name: node.module for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pactrain_hvd.")
                for alias in node.names}
    bases = {base.id for node in ast.walk(tree) if isinstance(node, ast.ClassDef)
             for base in node.bases if isinstance(base, ast.Name)}
    return {PACKAGE.parent / (imported[base].replace(".", "/") + ".py") for base in bases if base in imported}


def cross_module_privates(package: Path) -> list[str]:
    trees = {path: ast.parse(path.read_text(), str(path)) for path in sorted(package.rglob("*.py"))}
    defined = {path: defined_names(tree) for path, tree in trees.items()}
    found = []
    for path, tree in trees.items():
        own = defined[path].union(*(defined.get(base, set()) for base in base_modules(tree)))
        elsewhere = set().union(*(names for other, names in defined.items() if other != path))
        found += [f"{path.relative_to(package.parent)}:{line} uses {name}, defined in another module"
                  for name, line in sorted(private_uses(tree), key=lambda use: use[1])
                  if name not in own and name in elsewhere]
    return found


def test_no_module_of_the_library_uses_a_private_name_another_defines():
    """A module's private names are its own (a subclass may use its base's): what crosses modules is public."""
    assert cross_module_privates(PACKAGE) == []


def test_the_private_name_check_sees_a_mixin_reading_its_host(tmp_path):
    package = tmp_path / "pactrain_hvd"
    package.mkdir()
    (package / "host.py").write_text("class Host:\n    def __init__(self):\n        self._names = []\n")
    (package / "mixin.py").write_text("class Mixin:\n    def count(self):\n        return len(self._names)\n")
    (package / "owner.py").write_text("class Owner:\n    def __init__(self):\n        self._own = 1\n"
                                      "    def read(self):\n        return self._own + len(self.items._private)\n")
    assert cross_module_privates(package) == ["pactrain_hvd/mixin.py:3 uses _names, defined in another module"]


def test_no_module_of_the_library_is_over_300_lines():
    """One concept per module: a module that grows past 300 lines holds two."""
    long = {str(path.relative_to(PACKAGE.parent)): lines for path in sorted(PACKAGE.rglob("*.py"))
            if (lines := len(path.read_text().splitlines())) > 300}
    assert long == {}
