"""channels_last models: gradients keep their parameters' memory format through pruning and the all-reduce."""

import horovod.torch as hvd
import pytest
import torch
from conftest import assert_same_on_all_ranks, loss_of, make_model

import pactrain_hvd.torch as pt

OPTIMIZERS = {
    "sgd-momentum": lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9),
    "sgd-foreach": lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9, foreach=True),
    "sgd-fused": lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9, fused=True),
}
LAYOUTS = {
    "contiguous": lambda rank: torch.contiguous_format,
    "channels_last": lambda rank: torch.channels_last,
    "mixed": lambda rank: torch.channels_last if rank == 0 else torch.contiguous_format,  # packed values agree
}


def run(make_optimizer, memory_format, steps=4):
    model = make_model(seed=0)
    # Horovod broadcasts contiguous tensors only: before the conversion (and no momentum yet to broadcast)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    model.to(memory_format=memory_format)
    opt = pt.DistributedOptimizer(make_optimizer(model.parameters()), named_parameters=model.named_parameters(),
                                  sparsity=0.8, ranking="layer", begin_step=0, end_step=0)
    convs = {n: p for n, p in model.named_parameters() if p.dim() == 4}
    for step in range(steps):
        opt.zero_grad()
        loss_of(model, step).backward()
        storage = {n: p.grad.data_ptr() for n, p in convs.items()}
        opt.step()
        for name, p in convs.items():
            assert p.is_contiguous(memory_format=memory_format), f"{name} at step {step}"
            assert p.grad.is_contiguous(memory_format=memory_format), f"{name}.grad at step {step}"
            assert p.grad.data_ptr() == storage[name], f"{name}.grad was replaced at step {step}"
        assert_same_on_all_ranks(dict(model.named_parameters()))
    plan = {n: t["packed"] for n, t in opt.stats()["tensors"].items()}
    assert plan["conv2.weight"] and not plan["conv1.weight"], plan  # a packed and a dense-plan conv
    parameters = dict(model.named_parameters())
    for name, mask in opt.masks().items():
        assert torch.all(parameters[name][~mask] == 0), name
        assert torch.all(parameters[name].grad[~mask] == 0), f"{name}.grad"
    return model, opt


@pytest.mark.parametrize("layout", ["channels_last", "mixed"])
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_channels_last_training_matches_a_contiguous_run(optimizer, layout):
    model, opt = run(OPTIMIZERS[optimizer], LAYOUTS[layout](hvd.rank()))
    reference_model, reference = run(OPTIMIZERS[optimizer], torch.contiguous_format)
    assert sorted(opt.masks()) == sorted(reference.masks()) == ["conv1.weight", "conv2.weight", "fc.weight"]
    for name, mask in reference.masks().items():
        assert torch.equal(opt.masks()[name], mask), f"mask of {name}"
    for (name, p), q in zip(model.named_parameters(), reference_model.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-6, msg=lambda m, name=name: f"{name}: {m}")
        torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=1e-6, msg=lambda m, name=name: f"{name}.grad: {m}")
