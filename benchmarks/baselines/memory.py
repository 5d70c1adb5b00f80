"""Error-feedback memory for the baselines (GRACE's "what to remember"): residuals by tensor name.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class ResidualMemory:
    """Error feedback: what a step did not send is added to the next step's gradient.

    ``compensate`` adds the gradient into the residual buffer in place and returns it; the
    caller then removes what it sent (``forget_at`` for Top-k, ``subtract`` for PowerSGD), so
    the buffer *becomes* the next residual with no copy.
    """

    residuals: dict[str, torch.Tensor] = field(default_factory=dict)

    def compensate(self, name: str, grad: torch.Tensor) -> torch.Tensor:
        residual = self.residuals.get(name)
        if residual is None:
            residual = self.residuals[name] = grad.detach().reshape(-1).clone()
        else:
            residual.add_(grad.reshape(-1))
        return residual

    def forget_at(self, name: str, indices: torch.Tensor) -> None:
        self.residuals[name].index_fill_(0, indices.long(), 0)

    def subtract(self, name: str, sent: torch.Tensor) -> None:
        self.residuals[name].sub_(sent.reshape(-1))
