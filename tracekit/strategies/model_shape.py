"""The shape of the one model every reference strategy trains (torch-free), so that a layout
check (how many pipeline stages fit) needs no torch. The model itself, its formula for the
parameter count Psi and its initialisation are the run side's ``model`` module."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class GPTConfig:
    """A small pre-LN GPT: vocabulary, width, blocks, heads, sequence length."""

    vocab: int = 256
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    seq_len: int = 64

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def n_params(self) -> int:
        """Psi = V d + T d + L (12 d^2 + 13 d) + 2 d + d V + V (the model module's docstring)."""
        d, v, t, n = self.d_model, self.vocab, self.seq_len, self.n_layers
        return v * d + t * d + n * (12 * d * d + 13 * d) + 2 * d + d * v + v
