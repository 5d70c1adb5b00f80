"""One Lightning run of ``test_lightning.py``: 2 CPU processes, DDP, the PacTrain callback, int3 values.

    python lightning_worker.py OUT STEPS [CHECKPOINT_TO_SAVE | --resume CHECKPOINT]

Each rank writes its weights, masks and error memory to ``OUT/rank<r>.pt``, and its error memory as training
starts (after a resume: as loaded) to ``OUT/start<r>.pt``; Lightning re-runs this file for rank 1.
"""

import sys
from pathlib import Path

import lightning.pytorch as pl
import torch

from pactrain_hvd.lightning import PacTrain

SAMPLES = 128  # 2 ranks x 8 batches of 8: 4 optimizer steps an epoch with accumulate_grad_batches=2


class MemoryAtStart(pl.Callback):
    """What each rank's error memory holds when training starts (after the PacTrain callback built its state)."""

    def __init__(self, pactrain: PacTrain, out: str) -> None:
        self.pactrain, self.out = pactrain, out

    def on_train_start(self, trainer, pl_module) -> None:
        torch.save(self.pactrain.state.memory.state_dict(), Path(self.out) / f"start{trainer.global_rank}.pt")


class Classifier(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))

    def training_step(self, batch, _):
        inputs, labels = batch
        return torch.nn.functional.cross_entropy(self.net(inputs), labels)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)

    def train_dataloader(self):
        generator = torch.Generator().manual_seed(0)
        data = torch.utils.data.TensorDataset(torch.randn(SAMPLES, 32, generator=generator),
                                              torch.randint(0, 4, (SAMPLES,), generator=generator))
        return torch.utils.data.DataLoader(data, batch_size=8, shuffle=False)


def main(out: str, steps: int, checkpoint: str | None, resume: str | None) -> None:
    pl.seed_everything(0, workers=True)
    model = Classifier()
    callback = PacTrain(sparsity=0.9, ranking="layer", begin_step=0, end_step=4, frequency=2, pack_min_numel=0,
                        packed_values="int3")
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=steps, accumulate_grad_batches=2,
                         gradient_clip_val=1.0, deterministic=True, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[callback, MemoryAtStart(callback, out)])
    trainer.fit(model, ckpt_path=resume)
    if checkpoint:
        trainer.save_checkpoint(checkpoint)
    masks = callback.state.masks()
    torch.save({"weights": {n: p.detach().clone() for n, p in model.named_parameters()}, "masks": masks,
                "memory": callback.state.memory.state_dict(),
                "step": callback.state.step_count, "sent_bytes": callback.state.stats()["sent_bytes"]},
               Path(out) / f"rank{trainer.global_rank}.pt")


if __name__ == "__main__":
    arguments = sys.argv[1:]
    resume = arguments[arguments.index("--resume") + 1] if "--resume" in arguments else None
    save = arguments[2] if len(arguments) > 2 and arguments[2] != "--resume" else None
    main(arguments[0], int(arguments[1]), save, resume)
