"""Horovod's Gloo rendezvous server for one job, run by the harness inside the bridge namespace.

    ip netns exec <prefix>br python -m benchmarks.runner.rendezvous --size 2

This is what ``horovodrun --gloo`` does in-process (``horovod/runner/gloo_run.py``:
``RendezvousServer().start()`` then ``.init(host_alloc_plan)``), moved into the namespace that
every rank can reach. Each rank is its own host (``rank<r>``, one slot), so every byte between
ranks crosses an emulated NIC. Prints ``{"port": N}`` once serving; stops when stdin closes.
"""

from __future__ import annotations

import argparse
import json
import sys

from horovod.runner.common.util.hosts import SlotInfo
from horovod.runner.http.http_server import RendezvousServer


def hostname(rank: int) -> str:
    """``HOROVOD_HOSTNAME`` of a rank: one host per rank."""
    return f"rank{rank}"


def slot_plan(size: int) -> list[SlotInfo]:
    """What ``get_host_assignments`` returns for ``size`` hosts of one slot each."""
    return [SlotInfo(hostname=hostname(rank), rank=rank, local_rank=0, cross_rank=rank,
                     size=size, local_size=1, cross_size=size) for rank in range(size)]


def slot_env(slot: SlotInfo) -> dict[str, str]:
    """The per-rank variables ``gloo_run.create_slot_env_vars`` sets."""
    return {"HOROVOD_HOSTNAME": slot.hostname, "HOROVOD_RANK": str(slot.rank), "HOROVOD_SIZE": str(slot.size),
            "HOROVOD_LOCAL_RANK": str(slot.local_rank), "HOROVOD_LOCAL_SIZE": str(slot.local_size),
            "HOROVOD_CROSS_RANK": str(slot.cross_rank), "HOROVOD_CROSS_SIZE": str(slot.cross_size)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, required=True)
    args = parser.parse_args(argv)
    server = RendezvousServer()
    port = server.start()
    server.init(slot_plan(args.size))
    print(json.dumps({"port": port}), flush=True)
    sys.stdin.read()  # the harness closes stdin (or dies) when the job is over
    server.stop()


if __name__ == "__main__":
    main()
