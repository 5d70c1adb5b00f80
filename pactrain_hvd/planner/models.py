"""A model's trainable parameter shapes, without allocating it: built on torch's ``meta`` device.

``--model`` takes ``package.module:callable`` or ``path/to/file.py:callable`` (a function or class that
returns a ``torch.nn.Module`` when called with no arguments), or a name that torchvision
(``torchvision.models.get_model``) or timm (``timm.create_model``) knows, where that package is installed.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from pathlib import Path
from typing import Any

from pactrain_hvd.planner.payload import Tensor


def _torch():
    try:
        import torch
    except ImportError:
        raise ValueError("--model needs torch to build the model (pip install torch)") from None
    return torch


def _load_callable(spec: str):
    where, _, attribute = spec.rpartition(":")
    if where.endswith(".py"):
        path = Path(where)
        if not path.is_file():
            raise ValueError(f"--model {spec!r}: no such file {where}")
        name = f"_pactrain_plan_{path.stem}"
        folder = str(path.resolve().parent)
        if folder not in sys.path:  # as ``python file.py`` does: the file's own imports resolve beside it
            sys.path.insert(0, folder)
        module_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        try:
            module_spec.loader.exec_module(module)
        except Exception as error:  # the user's file: any failure is theirs to read, in one line
            del sys.modules[name]
            raise ValueError(f"--model {spec!r}: importing {where} failed ({one_line(error)})") from None
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as error:
            raise ValueError(f"--model {spec!r}: cannot import {where!r} ({error})") from None
        except Exception as error:
            raise ValueError(f"--model {spec!r}: importing {where!r} failed ({one_line(error)})") from None
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise ValueError(f"--model {spec!r}: {where} has no attribute {attribute!r}") from None


def one_line(error: BaseException) -> str:
    """``TypeError: the first line of its message``."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


def _needs_arguments(builder: Any) -> list[str]:
    """The parameters ``builder`` cannot be called without (empty where its signature cannot be read)."""
    try:
        signature = inspect.signature(builder)
    except (TypeError, ValueError):
        return []
    return [name for name, parameter in signature.parameters.items()
            if parameter.default is inspect.Parameter.empty
            and parameter.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]


def _build(spec: str, device: str) -> Any:
    """Call the builder ``spec`` names on ``device``; its failures become one line naming ``--model``."""
    builder = _load_callable(spec)
    if not callable(builder):
        raise ValueError(f"--model {spec!r}: {spec.rpartition(':')[2]} is a {type(builder).__name__}, not a function "
                         "or class that builds the model")
    missing = _needs_arguments(builder)
    if missing:
        raise ValueError(f"--model {spec!r}: {spec.rpartition(':')[2]} needs arguments ({', '.join(missing)}); name a "
                         "function that builds the model without arguments, e.g. def make(): return Net(...)")
    try:
        return builder()
    except Exception as error:  # the user's code: one line, not its traceback
        if device == "meta":
            raise ValueError(f"--model {spec!r}: building the model on torch's meta device failed ({one_line(error)}): "
                             "that device holds shapes, not values, so code that reads a tensor's value while building "
                             "(such as .item()) fails there; --profile builds the model on the CPU") from None
        raise ValueError(f"--model {spec!r}: building the model failed ({one_line(error)})") from None


def _from_zoo(name: str) -> Any:
    errors = []
    try:
        import torchvision
        return torchvision.models.get_model(name)
    except ImportError:
        errors.append("torchvision is not installed")
    except ValueError as error:
        errors.append(f"torchvision: {error}")
    try:
        import timm
        return timm.create_model(name, pretrained=False)
    except ImportError:
        errors.append("timm is not installed")
    except RuntimeError as error:
        errors.append(f"timm: {error}")
    raise ValueError(f"--model {name!r}: not MODULE:CALLABLE and not a model name torchvision or timm knows "
                     f"({'; '.join(errors)})")


def build_model(spec: str, device: str = "meta") -> Any:
    """The ``torch.nn.Module`` that ``spec`` names, its parameters on ``device`` (``meta``: shapes only)."""
    torch = _torch()
    if not spec:
        raise ValueError("--model is empty: give MODULE:CALLABLE, FILE.py:CALLABLE or a torchvision/timm name")
    with torch.device(device):
        model = _build(spec, device) if ":" in spec else _from_zoo(spec)
    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"--model {spec!r} returned {type(model).__name__}, not a torch.nn.Module")
    return model


def sparse_gradient_names(model: Any) -> list[str]:
    """Parameters whose gradient is sparse: the weights of ``nn.Embedding`` / ``nn.EmbeddingBag`` with ``sparse=True``."""
    torch = _torch()
    names = []
    for prefix, module in model.named_modules():
        if isinstance(module, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and module.sparse:
            if module.weight.requires_grad:
                names.append(f"{prefix}.weight" if prefix else "weight")
    return names


def model_tensors(model: Any) -> list[Tensor]:
    """The trainable parameters of ``model`` in registration order (backward reaches them in reverse)."""
    tensors = [Tensor(name, tuple(int(d) for d in p.shape)) for name, p in model.named_parameters() if p.requires_grad]
    if not tensors:
        raise ValueError("--model has no trainable parameters")
    return tensors
