"""TensorFlow's start-up without the CUDA probe's error lines on machines that have no GPU.

TensorFlow probes for CUDA when it starts and, where a CUDA library is installed but no GPU driver
answers, logs ``failed call to cuInit: ... CUDA error`` at ERROR level, which ``TF_CPP_MIN_LOG_LEVEL=2``
still shows (3 would hide every C++ error). The probe's lines say only that TF runs on the CPU, as it
then does. ``import_tensorflow`` imports TF and lists its devices (the probe) with standard error
captured, then writes back every captured line except the probe's: nothing is configured, so devices
and numerics are TF's own, and on a GPU machine the probe succeeds and nothing is dropped.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from typing import Any

# The probe's lines: the failed driver call, TF's note that it will not use a GPU, and the factory
# registrations TF and PyTorch both attempt (a harmless duplicate when both are loaded).
_PROBE = re.compile(r"failed call to cuInit|Could not find cuda drivers|Unable to register cu(FFT|DNN|BLAS) factory")
_HEADER = "All log messages before absl::InitializeLog() is called are written to STDERR"


def probe_lines_dropped(text: str) -> str:
    """``text`` without the CUDA probe's lines (and absl's header line if nothing else is left)."""
    kept = [line for line in text.splitlines(keepends=True) if not _PROBE.search(line)]
    if all(_HEADER in line or not line.strip() for line in kept):
        return ""
    return "".join(kept)


def import_tensorflow() -> Any:
    """``import tensorflow`` and its device probe, without the probe's lines (``TF_CPP_MIN_LOG_LEVEL`` 2
    unless set). Call it before anything else imports TensorFlow; returns the module."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            import tensorflow as tf

            tf.config.list_physical_devices()
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            sys.stderr.write(probe_lines_dropped(captured.read().decode(errors="replace")))
            sys.stderr.flush()
    return tf
