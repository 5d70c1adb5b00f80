"""The PacTrain flags the torch examples share, and the schedule they ask for."""

from __future__ import annotations

import argparse

from pactrain_hvd.core.masks import DEFAULT_RANKING, RANKINGS
from pactrain_hvd.core.schedule import schedule_steps, short_ramp


def add_pactrain_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--packed-values", choices=("inherit", "fp16", "ternary", "int3"), default="inherit",
                        help="how PacTrain sends packed (surviving) values; inherit leaves them to --fp16")
    parser.add_argument("--sparsity", type=float, default=0.9, help="final PacTrain sparsity; 0 is plain Horovod")
    parser.add_argument("--ranking", choices=RANKINGS, default=DEFAULT_RANKING,
                        help="how sparsity is spread: per tensor, Erdős-Rényi-Kernel shares, or one global threshold")
    parser.add_argument("--prune-begin", type=int, default=None, help="first pruning step (default: 10%% of the run)")
    parser.add_argument("--prune-end", type=int, default=None, help="last pruning step (default: 60%% of the run)")
    parser.add_argument("--prune-window", type=float, nargs=2, default=None, metavar=("BEGIN", "END"),
                        help="first and last pruning step as fractions of the run (instead of --prune-begin/-end)")
    parser.add_argument("--prune-frequency", type=int, default=None,
                        help="steps between mask updates (default: ten updates between begin and end)")
    parser.add_argument("--prune-updates", type=int, default=None,
                        help="mask updates between begin and end (instead of --prune-frequency)")
    parser.add_argument("--prune-ramp", type=int, default=None, metavar="STEPS",
                        help="packed from the first step: sparsity 0.5 at step 0 rising to --sparsity at step STEPS, "
                             "masks re-ranked at every step (instead of the other --prune-* flags)")
    parser.add_argument("--rescale-survivors", action="store_true",
                        help="pruned at step 0 (--prune-window 0 0, --prune-ramp): the survivors of the first masks "
                             "take their tensor's norm, as suits a freshly initialised model")


def schedule_arguments(args: argparse.Namespace, total_steps: int) -> dict[str, int | bool | None]:
    """``pt.DistributedOptimizer``'s schedule arguments for a run of ``total_steps`` optimizer steps."""
    rescale = {"rescale_survivors": True} if args.rescale_survivors else {}
    begin, end = args.prune_begin, args.prune_end
    if args.prune_ramp is not None:
        if any(value is not None for value in (begin, end, args.prune_window, args.prune_frequency, args.prune_updates)):
            raise SystemExit("--prune-ramp replaces the other --prune-* flags: give it alone")
        if args.prune_ramp < 0:
            raise SystemExit(f"--prune-ramp must be >= 0 steps, got {args.prune_ramp}")
        return {"schedule": short_ramp(args.sparsity, args.prune_ramp), **rescale}
    if args.prune_window is not None:
        if begin is not None or end is not None:
            raise SystemExit("--prune-window replaces --prune-begin and --prune-end: give one or the other")
        first, last = args.prune_window
        if not 0 <= first <= last <= 1:
            raise SystemExit(f"--prune-window needs 0 <= BEGIN <= END <= 1, got {first} {last}")
        begin, end = int(first * total_steps), int(last * total_steps)
    frequency = args.prune_frequency
    if args.prune_updates is not None:
        if frequency is not None:
            raise SystemExit("--prune-updates replaces --prune-frequency: give one or the other")
        if args.prune_updates <= 0:
            raise SystemExit(f"--prune-updates must be > 0, got {args.prune_updates}")
        first_step, last_step, _ = schedule_steps(total_steps, begin, end)
        frequency = max(1, (last_step - first_step) // args.prune_updates)
    return {"total_steps": total_steps, "begin_step": begin, "end_step": end, "frequency": frequency, **rescale}
