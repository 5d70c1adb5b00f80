"""``OuterSync``: the anchor weights and outer momentum of local steps (``pactrain_hvd.core.local_steps``)."""

from __future__ import annotations

import torch

from pactrain_hvd.core.local_steps import check_outer_entry, outer_update


class OuterSync:
    """Per trainable parameter, the weights every rank held at the interval's start (the anchor) and the outer
    momentum; the same on every rank. Its tensors are updated in place, so the ones a state dict holds are
    the ones ``hvd.broadcast_optimizer_state`` writes into."""

    def __init__(self, parameters: dict[str, torch.Tensor], lr: float, beta: float) -> None:
        self.parameters = {name: p for name, p in parameters.items() if p.requires_grad}
        self.lr = float(lr)
        self.beta = float(beta)
        self.anchor = {name: p.detach().clone() for name, p in self.parameters.items()}
        self.momentum = {name: torch.zeros_like(p) for name, p in self.parameters.items()}

    @torch.no_grad()
    def take_anchor(self) -> None:
        """The weights now are the interval's anchor."""
        for name, p in self.parameters.items():
            self.anchor[name].copy_(p)

    def restart(self) -> None:
        """The weights now are the anchor, with no outer momentum (a checkpoint that holds neither)."""
        self.take_anchor()
        for momentum in self.momentum.values():
            momentum.zero_()

    @torch.no_grad()
    def outer_gradients(self) -> dict[str, torch.Tensor]:
        """This rank's progress since the anchor, as a gradient: anchor minus weights."""
        return {name: self.anchor[name] - p for name, p in self.parameters.items()}

    @torch.no_grad()
    def step(self, averaged: dict[str, torch.Tensor]) -> None:
        """The outer step from the anchor on the ranks' averaged outer gradients; the weights become the new anchor."""
        for name, p in self.parameters.items():
            anchor, momentum = outer_update(self.anchor[name], self.momentum[name], averaged[name].to(p.dtype),
                                            self.lr, self.beta)
            self.anchor[name].copy_(anchor)
            self.momentum[name].copy_(momentum)
            p.copy_(anchor)

    @torch.no_grad()
    def mask(self, masks: dict[str, torch.Tensor]) -> None:
        """Pruned coordinates are 0 in the anchor and the momentum too."""
        for name, mask in masks.items():
            if name in self.anchor:
                self.anchor[name].mul_(mask)
                self.momentum[name].mul_(mask)

    def state_dict(self) -> dict[str, dict[str, torch.Tensor]]:
        return {"anchor": self.anchor, "momentum": self.momentum}

    @torch.no_grad()
    def load_state_dict(self, saved: dict) -> None:
        self.validate(saved)
        for part in ("anchor", "momentum"):
            for name, tensor in getattr(self, part).items():
                tensor.copy_(saved[part][name])

    def validate(self, saved: object) -> None:
        """``CheckpointError`` unless ``saved`` holds an anchor and a momentum of every trainable parameter's shape."""
        check_outer_entry(saved, {name: tuple(p.shape) for name, p in self.parameters.items()}, torch.Tensor)
