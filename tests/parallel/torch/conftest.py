"""Multi-rank torch tests: run under ``horovodrun -np 2``; every assertion is reached by every rank."""

import horovod.torch as hvd
import pytest
import torch


@pytest.fixture(scope="session", autouse=True)
def horovod():
    hvd.init()
    torch.set_num_threads(1)
    assert hvd.size() >= 2, "run these tests under horovodrun -np 2"
    yield hvd


class SmallCNN(torch.nn.Module):
    """Conv + linear layers of packed and dense-plan sizes, a bias, and a norm scale."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.norm = torch.nn.BatchNorm2d(16)
        self.conv2 = torch.nn.Conv2d(16, 32, 3, padding=1)
        self.fc = torch.nn.Linear(32 * 4 * 4, 10)

    def forward(self, x):
        x = torch.nn.functional.max_pool2d(torch.relu(self.norm(self.conv1(x))), 2)
        x = torch.nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


def make_model(seed: int = 0) -> SmallCNN:
    torch.manual_seed(seed)
    return SmallCNN()


def named(model, prefix: str) -> list:
    """``model``'s named parameters with ``prefix`` before each name: the Horovod names of one test's tensors."""
    return [(f"{prefix}.{name}", p) for name, p in model.named_parameters()]


def batch(step: int, size: int = 8):
    """Different data on every rank and step."""
    generator = torch.Generator().manual_seed(1000 * hvd.rank() + step)
    return torch.randn(size, 3, 16, 16, generator=generator), torch.randint(0, 10, (size,), generator=generator)


def loss_of(model, step: int):
    inputs, labels = batch(step)
    return torch.nn.functional.cross_entropy(model(inputs), labels)


def assert_same_on_all_ranks(tensors: dict, what: str = "parameter") -> None:
    """Bitwise equality across ranks, proven by allgathering each tensor."""
    for name, tensor in tensors.items():
        gathered = hvd.allgather(tensor.detach().reshape(1, -1).contiguous(), name=f"check.{what}.{name}")
        for rank in range(1, hvd.size()):
            assert torch.equal(gathered[0], gathered[rank]), f"{what} {name} differs between rank 0 and rank {rank}"


def amp_step(model, opt, scaler, loss) -> bool:
    """One step of Horovod's AMP idiom (backward, synchronize, unscale, step outside synchronize); whether
    the scaler skipped it (no weight moved)."""
    scaler.scale(loss).backward()
    opt.synchronize()
    scaler.unscale_(opt)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with opt.skip_synchronize():
        scaler.step(opt)
    scaler.update()
    return all(torch.equal(p, before[n]) for n, p in model.named_parameters())
