"""Sphinx configuration for the pactrain_hvd documentation.

Sphinx with MyST Markdown pages, as Horovod and PyTorch document themselves: the API reference comes
from the docstrings through autodoc, and the pages stay Markdown like the rest of the repository.
"""

import os
import sys

sys.path.insert(0, os.path.abspath(".."))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import pactrain_hvd  # noqa: E402

project = "pactrain_hvd"
author = "pactrain_hvd authors"
copyright = "2026, pactrain_hvd authors"
release = pactrain_hvd.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
]

source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "README.md"]

# Markdown: heading anchors for in-page links, $...$ left alone, ::: fences for notes.
myst_enable_extensions = ["colon_fence"]
myst_heading_anchors = 3

# API reference: Google-style docstrings, members in source order, signatures with their type hints.
napoleon_google_docstring = True
napoleon_numpy_docstring = False
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"members": True}

try:  # furo from PyPI (the dev extras); Sphinx's own alabaster where it is missing
    import furo  # noqa: F401

    html_theme = "furo"
except ImportError:
    html_theme = "alabaster"
html_title = f"pactrain_hvd {release}"
html_static_path = []
