"""A cluster's proof that PacTrain works across its machines: dense Horovod, then PacTrain, measured on the NICs.

``make docker-test`` runs it on two containers, once under each launcher::

    horovodrun -np 2 -H c1:1,c2:1 python docker/cluster_check.py          # Gloo, ranks started over ssh
    mpirun -np 2 -H c1,c2 python docker/cluster_check.py                  # MPI

and it runs the same on any cluster of the image (one rank per host). Both phases train a fresh
copy of ``examples/pytorch_demo.py``'s CNN (1.6 M parameters, 6.5 MB of fp32 gradients a step)
for ``--steps`` steps on Fashion-MNIST: first with ``hvd.DistributedOptimizer`` (dense), then with
``pt.DistributedOptimizer`` pruned one-shot to ``--sparsity`` at step 0. Around each phase's
training steps every rank reads its machine's interfaces (``/sys/class/net/*/statistics``, loopback
left out), so the bytes are what crossed the wire, headers, Horovod's control traffic and all.

Every rank asserts, on every rank's figures (gathered first, so a failure fails all ranks, no hang):

- the weights are bitwise equal on all ranks after each phase;
- PacTrain's pruned coordinates are exactly 0, and its masks are equal on all ranks;
- on every machine, PacTrain's interface bytes are at most ``--max-bytes-ratio`` of dense's;
- with ``--expect-faster``: PacTrain's median step time is below dense's (a slow link).

Rank 0 prints one ``cluster_check:`` line per phase and a final ``cluster_check result:`` JSON line.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import socket
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import horovod.torch as hvd
import numpy as np
import torch
from torch import nn

import pactrain_hvd.torch as pt

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))  # the examples' shared helpers
from example_support.data import load_fashion_mnist  # noqa: E402

SYS_CLASS_NET = Path("/sys/class/net")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--steps", type=int, default=30, help="training steps per phase")
    parser.add_argument("--batch-size", type=int, default=64, help="per rank")
    parser.add_argument("--train-samples", type=int, default=12000, help="Fashion-MNIST images, split across ranks")
    parser.add_argument("--sparsity", type=float, default=0.9, help="PacTrain sparsity (global ranking, one shot)")
    parser.add_argument("--max-bytes-ratio", type=float, default=0.2,
                        help="PacTrain's interface bytes over dense's, on every machine, at most this")
    parser.add_argument("--expect-faster", action="store_true",
                        help="also require PacTrain's median step time below dense's")
    parser.add_argument("--result-json", type=Path, default=None, help="rank 0 writes the figures here")
    return parser.parse_args(argv)


@dataclass
class NicBytes:
    """Bytes sent and received on this machine's interfaces (loopback left out), since boot."""

    tx: int
    rx: int

    @classmethod
    def read(cls) -> NicBytes:
        tx = rx = 0
        for nic in sorted(SYS_CLASS_NET.iterdir()):
            if nic.name == "lo":
                continue
            tx += int((nic / "statistics" / "tx_bytes").read_text())
            rx += int((nic / "statistics" / "rx_bytes").read_text())
        return cls(tx, rx)

    def __sub__(self, earlier: NicBytes) -> NicBytes:
        return NicBytes(self.tx - earlier.tx, self.rx - earlier.rx)

    @property
    def total(self) -> int:
        return self.tx + self.rx


@dataclass
class PhaseResult:
    """One rank's figures for one phase."""

    rank: int
    host: str
    phase: str
    nic_tx_bytes: int
    nic_rx_bytes: int
    median_step_seconds: float
    weights_sha256: str
    masks_sha256: str = ""
    pruned_nonzero: int = 0
    pruned_count: int = 0
    masked_count: int = 0
    handed_bytes_per_step: float = 0.0  # what the optimizer handed to the all-reduce (stats()), last step


def build_model() -> nn.Module:
    """examples/pytorch_demo.py's CNN: most of its 1.6 M parameters in the first linear layer."""
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 7 * 7, 512), nn.ReLU(), nn.Linear(512, 10),
    )


def sha256_of(tensors: list[torch.Tensor]) -> str:
    digest = hashlib.sha256()
    for tensor in tensors:
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def train_phase(phase: str, args: argparse.Namespace, images: torch.Tensor, labels: torch.Tensor) -> PhaseResult:
    """Train a fresh model for ``args.steps`` steps, ``phase`` "dense" (Horovod) or "pactrain"."""
    torch.manual_seed(42)
    model = build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size(), momentum=0.9)
    if phase == "dense":
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    else:
        optimizer = pt.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                            sparsity=args.sparsity, begin_step=0, end_step=0, frequency=1,
                                            ranking="global")
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)

    hvd.barrier()
    before = NicBytes.read()
    step_seconds = []
    for step in range(args.steps):
        index = torch.arange(step * args.batch_size, (step + 1) * args.batch_size) % len(images)
        started = time.perf_counter()
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(images[index]), labels[index])
        loss.backward()
        optimizer.step()
        step_seconds.append(time.perf_counter() - started)
    hvd.barrier()
    wire = NicBytes.read() - before

    parameters = [p for _, p in sorted(model.named_parameters())]
    result = PhaseResult(rank=hvd.rank(), host=socket.gethostname(), phase=phase, nic_tx_bytes=wire.tx,
                         nic_rx_bytes=wire.rx, median_step_seconds=statistics.median(step_seconds),
                         weights_sha256=sha256_of(parameters))
    if phase == "pactrain":
        weights = dict(model.named_parameters())
        masks = dict(sorted(optimizer.masks().items()))
        result.masks_sha256 = sha256_of(list(masks.values()))
        result.pruned_count = sum(int((~mask).sum()) for mask in masks.values())
        result.masked_count = sum(mask.numel() for mask in masks.values())
        result.pruned_nonzero = sum(int((weights[name].detach()[~mask] != 0).sum()) for name, mask in masks.items())
        result.handed_bytes_per_step = float(optimizer.stats()["sent_bytes"])
    else:
        result.handed_bytes_per_step = float(sum(p.numel() * p.element_size() for p in parameters))
    return result


def check(phases: dict[str, list[PhaseResult]], args: argparse.Namespace) -> list[str]:
    """What is wrong with the gathered figures (empty: all good)."""
    problems = []
    for phase, ranks in phases.items():
        if len({r.weights_sha256 for r in ranks}) != 1:
            problems.append(f"{phase}: weights differ between ranks: {[r.weights_sha256[:12] for r in ranks]}")
    pactrain = phases["pactrain"]
    if len({r.masks_sha256 for r in pactrain}) != 1:
        problems.append(f"pactrain: masks differ between ranks: {[r.masks_sha256[:12] for r in pactrain]}")
    for r in pactrain:
        if r.pruned_nonzero:
            problems.append(f"pactrain: rank {r.rank} has {r.pruned_nonzero} nonzero pruned weights of {r.pruned_count}")
        if r.pruned_count < (args.sparsity - 0.01) * r.masked_count:
            problems.append(f"pactrain: rank {r.rank} pruned {r.pruned_count} of {r.masked_count} weights, "
                            f"not the sparsity {args.sparsity}")
    for dense, sparse in zip(phases["dense"], pactrain):
        ratio = sparse_ratio(dense, sparse)
        if ratio > args.max_bytes_ratio:
            problems.append(f"{dense.host}: PacTrain moved {ratio:.3f}x dense's interface bytes "
                            f"({sparse.nic_tx_bytes + sparse.nic_rx_bytes} vs {dense.nic_tx_bytes + dense.nic_rx_bytes}),"
                            f" more than {args.max_bytes_ratio}")
    if args.expect_faster:
        dense_step, pactrain_step = median_step(phases["dense"]), median_step(pactrain)
        if not pactrain_step < dense_step:
            problems.append(f"PacTrain's median step {pactrain_step * 1e3:.1f} ms is not below dense's "
                            f"{dense_step * 1e3:.1f} ms")
    return problems


def sparse_ratio(dense: PhaseResult, sparse: PhaseResult) -> float:
    return (sparse.nic_tx_bytes + sparse.nic_rx_bytes) / max(dense.nic_tx_bytes + dense.nic_rx_bytes, 1)


def median_step(ranks: list[PhaseResult]) -> float:
    """The slowest rank's median step: a synchronous step is as fast as its slowest rank."""
    return max(r.median_step_seconds for r in ranks)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    hvd.init()
    torch.set_num_threads(1)
    train_images, train_labels = load_fashion_mnist("train")
    images = torch.from_numpy(np.ascontiguousarray(train_images[: args.train_samples][hvd.rank():: hvd.size()]))
    images = images.float().div_(255).unsqueeze(1)
    labels = torch.from_numpy(train_labels[: args.train_samples][hvd.rank():: hvd.size()]).long()
    controller = "gloo" if hvd.gloo_enabled() else "mpi" if hvd.mpi_enabled() else "unknown"

    phases: dict[str, list[PhaseResult]] = {}
    for phase in ("dense", "pactrain"):
        mine = train_phase(phase, args, images, labels)
        phases[phase] = [PhaseResult(**fields) for fields in hvd.allgather_object(asdict(mine), name=f"check.{phase}")]
        if hvd.rank() == 0:
            for r in phases[phase]:
                print(f"cluster_check: {phase:8s} {controller} {r.host}: nic {r.nic_tx_bytes / 1e6:.2f} MB out "
                      f"{r.nic_rx_bytes / 1e6:.2f} MB in over {args.steps} steps, median step "
                      f"{r.median_step_seconds * 1e3:.1f} ms, weights {r.weights_sha256[:12]}"
                      + (f", pruned {r.pruned_count}/{r.masked_count}, nonzero among them {r.pruned_nonzero}" if phase == "pactrain" else ""),
                      flush=True)

    problems = check(phases, args)
    result = {
        "controller": controller, "world_size": hvd.size(), "steps": args.steps, "sparsity": args.sparsity,
        "bytes_ratio": {d.host: sparse_ratio(d, s) for d, s in zip(phases["dense"], phases["pactrain"])},
        "median_step_seconds": {phase: median_step(ranks) for phase, ranks in phases.items()},
        "phases": {phase: [asdict(r) for r in ranks] for phase, ranks in phases.items()},
        "problems": problems,
    }
    if hvd.rank() == 0:
        print("cluster_check result: " + json.dumps({k: v for k, v in result.items() if k != "phases"}), flush=True)
        if args.result_json:
            args.result_json.write_text(json.dumps(result, indent=1) + "\n")
    if problems:
        raise SystemExit("cluster_check FAILED:\n  " + "\n  ".join(problems))
    if hvd.rank() == 0:
        print("cluster_check: passed", flush=True)
    return result


if __name__ == "__main__":
    main()
