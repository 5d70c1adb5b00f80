"""Pack + unpack cost against a training step (PyTorch), one process, no communication.

    python -m benchmarks.micro.micro_pack --model resnet18 --batch-size 32 --sparsity 0.9
    python -m benchmarks.micro.micro_pack --plan-sweep --gbits 1

Default mode times, over the same repeats, a full step (forward, backward, SGD update) and
the packing PacTrain adds to it (gather of surviving values + scatter back, for every pruned
tensor), and prints medians and their ratio, beside the floor no packing can go below: one read and
one write pass over the packed gradients. ``--values ternary`` also times the ternary codec of every
packed tensor (``QuantizedReduction.gather`` and ``quantize``, then the decode and scatter of
``decompress``): all a rank computes for ternary values, without the two all-reduces.

``--plan-sweep`` backs the adaptive plan's defaults: for tensor sizes and densities it
prints pack+unpack time against the ideal 2-worker ring all-reduce time the packing saves
on a link of ``--gbits``; packing pays where the saving is larger.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from benchmarks.common.models import build, loss_fn, synthetic_batch
from pactrain_hvd.core import magnitude_masks, should_pack
from pactrain_hvd.torch.compression import PacTrainCompressor


def median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def plan_sweep(gbits: float, repeats: int) -> None:
    print(f"{'numel':>9} {'density':>7} {'pack_us':>9} {'saved_us':>9} pays")
    for numel in (256, 1024, 4096, 16384, 262144, 2359296):
        grad = torch.randn(numel)
        for density in (0.1, 0.5, 0.75, 0.9):
            mask = torch.rand(numel) < density
            compressor = PacTrainCompressor(mask)

            def pack_unpack(compressor=compressor, grad=grad) -> None:
                wire, ctx = compressor.compress(grad)
                compressor.decompress(wire, ctx)

            pack_s = median_seconds(pack_unpack, repeats)
            # ring all-reduce, 2 workers: each worker sends 2 (N-1)/N = 1 copy of the fp32 buffer
            saved_s = (numel - int(mask.sum())) * 4 * 8 / (gbits * 1e9)
            print(f"{numel:>9} {density:>7.2f} {pack_s * 1e6:>9.1f} {saved_s * 1e6:>9.1f} {'yes' if saved_s > pack_s else 'no'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--sparsity", type=float, default=0.9)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--values", choices=("inherit", "ternary"), default="inherit",
                        help="ternary: also time the ternary codec (initialises Horovod, one process)")
    parser.add_argument("--plan-sweep", action="store_true", help="time packing per tensor size and density instead")
    parser.add_argument("--gbits", type=float, default=1.0, help="link rate for --plan-sweep, Gbit/s")
    args = parser.parse_args()
    if args.plan_sweep:
        plan_sweep(args.gbits, max(args.repeats, 50))
        return

    torch.manual_seed(0)
    model = build(args.model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    inputs, targets = synthetic_batch(args.model, args.batch_size)
    prunable = {n: p for n, p in model.named_parameters() if p.dim() >= 2}
    masks = magnitude_masks({n: p.detach().numpy() for n, p in prunable.items()}, args.sparsity)
    compressors = [
        (p, PacTrainCompressor(torch.from_numpy(masks[n]), packed=should_pack(p.numel(), int(masks[n].sum()))))
        for n, p in prunable.items()
    ]

    def step() -> None:
        optimizer.zero_grad()
        loss_fn(args.model, model(inputs), targets).backward()
        optimizer.step()

    def pack_unpack() -> None:
        for p, compressor in compressors:
            wire, ctx = compressor.compress(p.grad)
            p.grad.set_(compressor.decompress(wire, ctx))

    def read_and_write() -> None:
        """The memory traffic packing cannot avoid: survivors lie in nearly every cache line of a packed
        gradient (one read pass), and every pruned coordinate is written (one write pass)."""
        for p, compressor in compressors:
            if compressor.packed:
                p.grad.sum()
                p.grad.zero_()

    step_s = median_seconds(step, args.repeats)
    pack_s = median_seconds(pack_unpack, args.repeats)
    floor_s = median_seconds(read_and_write, args.repeats)
    ternary_s = median_seconds(ternary_codec(prunable, compressors), args.repeats) if args.values == "ternary" else None
    packed = sum(c.packed for _, c in compressors)
    kept = sum(int(np.count_nonzero(masks[n])) for n in prunable)
    print(f"model={args.model} batch={args.batch_size} sparsity={args.sparsity} threads={torch.get_num_threads()} "
          f"packed_tensors={packed}/{len(compressors)} kept={kept}/{sum(p.numel() for p in prunable.values())}")
    print(f"step_median_ms={step_s * 1e3:.1f} pack_unpack_median_ms={pack_s * 1e3:.2f} overhead={pack_s / step_s:.2%} "
          f"read_write_floor_ms={floor_s * 1e3:.2f} floor_share={floor_s / step_s:.2%}")
    if ternary_s is not None:
        print(f"ternary_codec_median_ms={ternary_s * 1e3:.2f} ternary_share={ternary_s / step_s:.2%}")


def ternary_codec(prunable: dict, compressors: list) -> Callable[[], None]:
    """What a rank computes for ternary values of every packed tensor, at 2 ranks' lane width: survivors plus
    error memory, the scale proposal, noise, rounding, lane packing, the residual; then decoding and scattering
    (its own words stand in for the sum: the same work)."""
    import horovod.torch as hvd

    from pactrain_hvd.core.lanes import quantized_layout
    from pactrain_hvd.torch.quantized import QuantizedReduction, QuantizedSend

    hvd.init()
    reduction = QuantizedReduction(hvd.global_process_set)
    reduction.layout = quantized_layout(2)  # 2 ranks' lane width on this one process
    names = {p: n for n, p in prunable.items()}
    packed = [(names[p], p, c) for p, c in compressors if c.packed]
    for _, _, compressor in packed:
        compressor.lanes = reduction.layout

    def run() -> None:
        for name, p, compressor in packed:
            values, local = reduction.gather(name, p.grad, compressor)
            send = QuantizedSend(name, p.grad, compressor, values, 2.0, max_handle=None)
            reduction.quantize(send, local)
            p.grad.set_(compressor.decompress(send.words, send.ctx))
        reduction.memory.commit()

    return run


if __name__ == "__main__":
    main()
