"""One rank of a 2-process DDP job over Gloo whose rank 1 is SIGKILLed at step 5 (``test_faults.py`` starts both).

``MODE`` is ``plain`` (DDP's own all-reduce) or a ``packed_values`` of the PacTrain hook. The surviving rank
prints ``PEER-LOST <error>`` and exits 1.
"""

import datetime
import os
import signal
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import pactrain_hvd.torch as pt

rank, mode, port = int(sys.argv[1]), sys.argv[2], sys.argv[3]
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=30))
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)),
                                bucket_cap_mb=0.2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
if mode != "plain":
    state = pt.ddp.PacTrainHookState(model, optimizer, sparsity=0.9, begin_step=0, end_step=0, pack_min_numel=0,
                                     packed_values=mode)
    model.register_comm_hook(state, pt.ddp.pactrain_hook)
try:
    for step in range(1000):
        if rank == 1 and step == 5:
            os.kill(os.getpid(), signal.SIGKILL)
        inputs, labels = torch.randn(32, 256), torch.randint(0, 10, (32,))
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(inputs), labels).backward()
        optimizer.step()
except Exception as error:  # noqa: BLE001 - what the surviving rank sees is the point
    print(f"PEER-LOST {type(error).__name__}: {error}", flush=True)
    sys.exit(1)
print("NO-ERROR", flush=True)
