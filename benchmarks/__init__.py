"""The lab: benchmarks, emulated links, peer compressors, the step model, accuracy runs and the demo.

Not part of the installed package; run from the repository root (``python -m benchmarks ...``).
Worker processes it starts get the repository root on ``PYTHONPATH`` (``runner/processes.py``).
The examples' shared helpers (``examples/example_support``) are importable from here too.
"""

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = REPO_ROOT / "examples"
if str(EXAMPLES) not in sys.path:
    sys.path.append(str(EXAMPLES))
