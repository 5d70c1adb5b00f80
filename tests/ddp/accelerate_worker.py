"""One rank of Accelerate's recipe (``test_accelerate.py`` runs two under torchrun): the hook state takes the
prepared optimizer, ``register_for_checkpointing`` carries it, and every value is checked on every rank."""

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from accelerate import Accelerator

import pactrain_hvd.torch as pt


def same_on_all_ranks(tensors: dict) -> None:
    for name, tensor in tensors.items():
        gathered = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, tensor.detach().contiguous())
        assert all(torch.equal(gathered[0], t) for t in gathered), f"{name} differs across ranks"


def train(model, optimizer, accelerator, steps: range) -> None:
    for step in steps:
        generator = torch.Generator().manual_seed(1000 * accelerator.process_index + step)
        inputs, labels = torch.randn(16, 32, generator=generator), torch.randint(0, 4, (16,), generator=generator)
        optimizer.zero_grad()
        accelerator.backward(torch.nn.functional.cross_entropy(model(inputs), labels))
        optimizer.step()


def main(workdir: str) -> None:
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, optimizer = accelerator.prepare(model, optimizer)
    state = pt.ddp.PacTrainHookState(model, optimizer, sparsity=0.75, ranking="layer", begin_step=0, end_step=0,
                                     pack_min_numel=0)  # the prepared optimizer, as Accelerate hands it back
    model.register_comm_hook(state, pt.ddp.pactrain_hook)
    accelerator.register_for_checkpointing(state)
    train(model, optimizer, accelerator, range(3))
    weights = dict(model.module.named_parameters())
    masks = state.masks()
    assert sorted(masks) == ["0.weight", "2.weight"] and state.step_count == 3
    for name, mask in masks.items():
        assert int(mask.sum()) == mask.numel() // 4, name
        assert not weights[name][~mask].any(), f"pruned weights of {name} are not 0"
    same_on_all_ranks(weights)
    kept = sum(int(mask.sum()) for mask in masks.values())
    assert state.stats()["sent_bytes"] == 4 * (kept + 64 + 4), state.stats()  # survivors and the biases, fp32
    accelerator.save_state(workdir)
    saved_masks, saved_step = {n: m.clone() for n, m in masks.items()}, state.step_count
    train(model, optimizer, accelerator, range(3, 5))
    accelerator.load_state(workdir)  # back to step 3: masks and schedule position come from the checkpoint
    assert state.step_count == saved_step
    assert all(torch.equal(state.masks()[n], m) for n, m in saved_masks.items())
    accelerator.wait_for_everyone()
    print(f"OK rank {accelerator.process_index}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else str(Path.cwd() / "accelerate-state"))
