"""Sphinx configuration for the pactrain_hvd documentation.

Sphinx with MyST Markdown pages, as Horovod and PyTorch document themselves: the API reference comes
from the docstrings through autodoc, and the pages stay Markdown like the rest of the repository.
"""

import os
import sys

sys.path.insert(0, os.path.abspath(".."))
sys.path.insert(0, os.path.abspath("../examples"))
# TensorFlow's start-up notices say nothing about the pages: oneDNN's (its numerics do not matter to a docs
# build) is turned off, and the CUDA probe's lines on a machine without a GPU are dropped.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"

from example_support.quiet_start import import_tensorflow  # noqa: E402

import_tensorflow()

import pactrain_hvd  # noqa: E402

project = "pactrain_hvd"
author = "pactrain_hvd authors"
copyright = f"2026, pactrain_hvd authors · version {pactrain_hvd.__version__}"
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
html_static_path = ["_static"]
html_css_files = ["wide.css"]
