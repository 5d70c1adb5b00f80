"""The command line of a time-to-accuracy worker, torch's (``tta_worker.py``) and TensorFlow's
(``tf_tta_worker.py``): the harness starts either with the same flags."""

from __future__ import annotations

import argparse
import os


def parse_args(argv: list[str] | None, prog: str = "python -m benchmarks.tta.tta_worker",
               doc: str | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=prog, description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=("image", "language"), required=True)
    parser.add_argument("--method", default="dense")
    parser.add_argument("--steps", type=int, required=True, help="optimizer steps (the schedules follow them)")
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--eval-samples", type=int, default=10000, help="image: test images per evaluation")
    parser.add_argument("--eval-batches", type=int, default=20, help="language: validation batches per worker")
    parser.add_argument("--batch-size", type=int, default=None, help="per worker (image 64, language 16)")
    parser.add_argument("--budget-s", type=float, default=0.0,
                        help="stop at the first evaluation after this many training seconds (0: run every step)")
    parser.add_argument("--seed", type=int, default=1, help="model initialisation (and the language batches)")
    parser.add_argument("--data-seed", type=int, default=0, help="image: the order of the training batches")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--compute-only", action="store_true", help="no Horovod: the compute bound")
    parser.add_argument("--device", default=os.environ.get("HOROVOD_GLOO_IFACE", ""), help="NIC to count")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if args.steps < 1 or args.eval_every < 1:
        parser.error("--steps and --eval-every must be >= 1")
    return args
