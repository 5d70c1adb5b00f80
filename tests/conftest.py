"""The examples' shared helpers (``examples/example_support``) imported by name, as the examples import them."""

import sys
from pathlib import Path

EXAMPLES = str(Path(__file__).resolve().parents[1] / "examples")
if EXAMPLES not in sys.path:
    sys.path.append(EXAMPLES)
