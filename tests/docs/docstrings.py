"""What a Google-style docstring of a public name must hold, as ``sphinx.ext.napoleon`` and IDEs read it.

- every public name has a docstring;
- a function or a class whose constructor takes named parameters documents each under ``Args:``
  (a class may use ``Attributes:`` for its fields, as dataclasses do); ``*args`` / ``**kwargs`` are exempt;
- a function with a return annotation other than ``None`` says what it returns under ``Returns:``
  (``Yields:`` for a generator).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
from typing import Any

SECTION = re.compile(r"^(\w[\w ]*):\s*$", re.MULTILINE)


def sections(doc: str) -> dict[str, str]:
    """``{"Args": body, ...}`` of a cleaned docstring (section headers at the left margin)."""
    found = list(SECTION.finditer(doc))
    return {match.group(1): doc[match.end():found[i + 1].start() if i + 1 < len(found) else len(doc)]
            for i, match in enumerate(found)}


def named_parameters(function: Any) -> list[str]:
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return []
    skipped = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return [p.name for p in signature.parameters.values() if p.name not in ("self", "cls") and p.kind not in skipped]


def returns_something(function: Any) -> bool:
    annotation = inspect.signature(function).return_annotation
    return annotation not in (inspect.Signature.empty, None, "None")


def problems(name: str, obj: Any) -> list[str]:
    """What ``obj``'s docstring misses; [] when it is complete."""
    doc = inspect.getdoc(obj)
    if not doc or (inspect.isclass(obj) and doc == inspect.getdoc(obj.__mro__[1])):
        return [f"{name}: no docstring"]
    if inspect.isclass(obj) and issubclass(obj, (Exception, Warning)):
        return []
    found = sections(doc)
    issues = []
    if inspect.isclass(obj):
        parameters = [f.name for f in dataclasses.fields(obj)] if dataclasses.is_dataclass(obj) else \
            named_parameters(obj)
        listed = found.get("Args", "") + found.get("Attributes", "")
    else:
        parameters, listed = named_parameters(obj), found.get("Args", "")
    missing = [p for p in parameters if not re.search(rf"^\s*\**{re.escape(p)}\b.*:", listed, re.MULTILINE)]
    if missing:
        issues.append(f"{name}: Args/Attributes lack {', '.join(missing)}")
    if inspect.isfunction(obj) and returns_something(obj):
        if "Returns" not in found and "Yields" not in found:
            issues.append(f"{name}: no Returns section")
    return issues


def public_names(module: str) -> dict[str, Any]:
    """``module``'s public names (its ``__all__``) that are the library's own, not Horovod's re-exports."""
    imported = importlib.import_module(module)
    names = getattr(imported, "__all__", None) or [n for n in vars(imported) if not n.startswith("_")]
    objects = {name: getattr(imported, name) for name in names}
    return {f"{module}.{name}": obj for name, obj in objects.items()
            if not inspect.ismodule(obj) and getattr(obj, "__module__", "pactrain_hvd").startswith("pactrain_hvd")
            and (callable(obj) or inspect.isclass(obj))}
