"""The command line every throughput worker takes (torch's ``worker.py`` and TensorFlow's ``tf_worker.py``):
the harness starts both alike."""

from __future__ import annotations

import argparse
import os


def worker_arguments(description: str, default_method: str, argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--method", default=default_method)
    parser.add_argument("--compute-only", action="store_true", help="no Horovod: the compute bound")
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default=os.environ.get("HOROVOD_GLOO_IFACE", ""),
                        help="NIC whose counters to read (default: HOROVOD_GLOO_IFACE)")
    parser.add_argument("--out", required=True)
    return parser.parse_args(argv)
