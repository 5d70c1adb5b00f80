"""What both elastic workers share: arguments, the event log, the kill-and-rejoin timeline, the final file.

Timeline with the defaults: masks change at steps 2, 5, 8, 11, 14, 17, 20; commits after steps
4, 8, 12, ...; in its first life rank 1 stops before step 10 and waits for SIGKILL, so the survivor
loses uncommitted steps 8 and 9 (and the mask change at 8), rolls back to the commit at 8, trains
alone, waits at the commit at 12 for the killed worker's host to come back, and both finish.

Files in ``--out``: one JSON line per event in ``log.<pid>.jsonl``, the victim's PID in
``victim.pid``, final weights and masks in ``final.rank<r>.npz``.
"""

import argparse
import hashlib
import json
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--commit-every", type=int, default=4)
    parser.add_argument("--kill-at", type=int, default=10)
    parser.add_argument("--rejoin-by", type=int, default=12, help="alone from this commit on, wait for the second worker")
    parser.add_argument("--rejoin-timeout", type=float, default=90.0)
    parser.add_argument("--packed-values", default="inherit", help="ternary: the digits per word follow the world size")
    return parser.parse_args()


def fingerprint(masks: dict[str, np.ndarray]) -> str:
    digest = hashlib.sha256()
    for name, mask in sorted(masks.items()):
        digest.update(name.encode())
        digest.update(np.asarray(mask).tobytes())
    return digest.hexdigest()[:16]


class Timeline:
    """The instrumented training loop. ``hvd``: the framework's Horovod module; ``describe()``: the
    optimizer's ``opt_step``, mask ``fingerprint`` and ternary ``lanes`` for the log."""

    def __init__(self, args: argparse.Namespace, hvd: Any, describe: Callable[[], dict]) -> None:
        self.args, self.hvd, self.describe = args, hvd, describe
        self.log_path = os.path.join(args.out, f"log.{os.getpid()}.jsonl")
        self.victim_path = os.path.join(args.out, "victim.pid")

    def log(self, event: str, **fields) -> None:
        with open(self.log_path, "a") as f:
            f.write(json.dumps(dict(event=event, pid=os.getpid(), time=time.time(), **fields)) + "\n")

    def snapshot(self, state, event: str) -> None:
        self.log(event, rank=self.hvd.rank(), size=self.hvd.size(), step=state.step, **self.describe())

    def run(self, state, train_step: Callable[[int], None]) -> None:
        """Horovod's elastic pattern: ``@hvd.elastic.run``, ``state.commit()`` every few steps."""
        state.register_reset_callbacks([lambda: self.snapshot(state, "reset")])
        self.hvd.elastic.run(self._train)(state, train_step)
        self.snapshot(state, "done")

    def _train(self, state, train_step: Callable[[int], None]) -> None:
        args = self.args
        self.snapshot(state, "enter")
        while state.step < args.steps:
            step = state.step
            if step == args.kill_at and self.hvd.rank() == 1 and not os.path.exists(self.victim_path):
                self._wait_to_be_killed()
            train_step(step)
            state.step = step + 1
            self.snapshot(state, "step")
            if state.step % args.commit_every == 0:
                state.commit()
                self.snapshot(state, "commit")
                if self.hvd.size() < 2 and args.rejoin_by <= state.step < args.steps:
                    self._wait_for_rejoin(state)

    def _wait_to_be_killed(self) -> None:
        with open(self.victim_path + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(self.victim_path + ".tmp", self.victim_path)
        time.sleep(600)
        raise SystemExit("the test never killed this worker")

    def _wait_for_rejoin(self, state) -> None:
        deadline = time.time() + self.args.rejoin_timeout
        while time.time() < deadline:
            time.sleep(0.5)
            state.check_host_updates()  # raises HostsUpdatedInterrupt once the host is back
        raise RuntimeError(f"no second worker joined within {self.args.rejoin_timeout} s")

    def save_final(self, state, weights: dict[str, np.ndarray], masks: dict[str, np.ndarray], opt_step: int) -> None:
        np.savez(os.path.join(self.args.out, f"final.rank{self.hvd.rank()}.npz"), rank=self.hvd.rank(),
                 size=self.hvd.size(), step=state.step, opt_step=opt_step,
                 **{f"weight|{k}": v for k, v in weights.items()}, **{f"mask|{k}": v for k, v in masks.items()})
