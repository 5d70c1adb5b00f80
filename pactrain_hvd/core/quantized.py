"""The quantized send (ternary, int3), once: its order, its noise and its scale rule, with numpy's reference.

One packed tensor's send on one rank, in every frontend (torch's optimizer, the DDP hook, TensorFlow) and in
the planner's virtual workers:

1. its survivors plus their error memory, and this rank's proposal for the tensor's scale (``local_scale``;
   inf where a value is not finite, as Horovod's MAX may drop a NaN);
2. a MAX all-reduce of the proposals;
3. stochastic codes at the scale every rank holds (the previous step's MAX; this step's where none is held),
   drawn with this rank's noise for the tensor and step (``noise_key``); what rounding left out stays in the
   error memory;
4. a SUM all-reduce of the codes, lane-packed into int32 words (``core.lanes``);
5. the summed digits decoded into the average; NaN on every rank where the MAX was not finite (so a loss
   scaler skips the step everywhere), and the held scale then stays as it was (``next_scale``).

The frontends write these steps in their own tensor library around their own collectives (torch's
``QuantizedReduction`` starts the SUM from the gradient hook; TensorFlow's runs in the traced step; the DDP
hook holds no scale and waits for its bucket's MAX); ``QuantizedSender`` is the same in numpy, for one rank.
"""

from __future__ import annotations

import zlib

import numpy as np

from pactrain_hvd.core.lanes import NOISE_SEED, local_scale, stochastic_codes


def noise_key(rank: int, name: str) -> int:
    """The first half of a tensor's rounding-noise seed on ``rank`` (31 bits); the step is the second half.

    The noise a step draws is a function of (rank, tensor, step) alone: ranks draw independently, a resumed run
    draws what the uninterrupted run drew whatever order the tensors are quantized in, and no generator state is
    saved.
    """
    return zlib.crc32(f"{NOISE_SEED}:{rank}:{name}".encode()) & 0x7FFFFFFF


def noise_seed(rank: int, name: str, step: int) -> int:
    """``noise_key`` and ``step`` as one 32-bit seed, for generators seeded with one integer (torch's CPU
    generator keeps only 32 bits of its seed; numpy's)."""
    return zlib.crc32(int(step).to_bytes(8, "little", signed=True), noise_key(rank, name))


def uniform_noise(rank: int, name: str, step: int, count: int) -> np.ndarray:
    """numpy's draw of ``count`` uniform [0, 1) float32 values for (rank, tensor, step)."""
    return np.random.default_rng(noise_seed(rank, name, step)).random(count, dtype=np.float32)


def next_scale(step_max: float, held: float | None) -> float:
    """The scale the next step rounds at: this step's MAX, or where it is not finite the one held (0: none)."""
    return step_max if np.isfinite(step_max) else (held if held is not None else 0.0)


class QuantizedSender:
    """One rank's side of the quantized send in numpy: error memory per tensor, and the rounding.

    Args:
        rank: the rank (its noise).
        levels: code levels each side of 0 (1: ternary, 3: int3).
        memory: the error memory by tensor name to keep (default: a new one).
    """

    def __init__(self, rank: int, levels: int, memory: dict[str, np.ndarray] | None = None) -> None:
        self.rank = rank
        self.levels = levels
        self.memory = {} if memory is None else memory

    def propose(self, name: str, survivors: np.ndarray) -> tuple[np.ndarray, np.float32]:
        """Step 1: the survivors plus their error memory (float32), and this rank's proposal for the scale."""
        values = np.asarray(survivors, np.float32) + self.memory.get(name, np.float32(0))
        local = local_scale(values, self.levels)
        return values, (local if np.isfinite(local) else np.float32(np.inf))

    def round(self, name: str, values: np.ndarray, scale: float, noise: np.ndarray) -> np.ndarray:
        """Step 3: codes in [-levels, levels] at ``scale``; the rounding error becomes the tensor's memory."""
        codes = stochastic_codes(values, scale, noise, self.levels)
        error = values - codes.astype(np.float32) * (np.float32(scale) / np.float32(self.levels))
        self.memory[name] = np.where(np.isfinite(error), error, self.memory.get(name, np.float32(0)))
        return codes
