"""The one model every strategy trains: a small GPT (Radford et al. 2019), pre-LN.

    x_0     = E[tokens] + P[0..T-1]                          token + learned position embeddings
    x_{l+1} = x_l' + MLP(LN(x_l')),  x_l' = x_l + Attn(LN(x_l))   N pre-LN blocks
    logits  = H(LN(x_N)),   loss = mean cross-entropy(logits, targets)

Attn is causal multi-head self-attention (``n_heads`` heads of ``d_model / n_heads``), MLP is
``Linear(d, 4d) -> GELU -> Linear(4d, d)``; the head H is untied from E.

Parameter count (Psi), with d = d_model, V = vocab, T = seq_len, L = n_layers::

    Psi = V d + T d                       embeddings
        + L (12 d^2 + 13 d)               per block: qkv 3d^2+3d, proj d^2+d, mlp 8d^2+5d, 2 LN 4d
        + 2d + d V + V                    final LN and head

``model.blocks`` is an ``nn.ModuleList`` so strategies split by block: pipeline stages take a
contiguous run of blocks, ZeRO-3 / FSDP make each block a unit. Initialisation draws from a
private generator seeded by ``seed``: the same seed gives bit-identical weights in every process.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from instrumented_runs.c10d import grad_of
from tracekit.strategies.model_shape import GPTConfig
from tracekit.strategies.options import PRECISIONS

__all__ = ["GPT", "GPTConfig"]


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        assert cfg.d_model % cfg.n_heads == 0, "d_model must divide by n_heads"
        self.n_heads = cfg.n_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        # (b, t, d) -> (b, heads, t, d/heads)
        q, k, v = (z.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, 4 * cfg.d_model)
        self.out = nn.Linear(4 * cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(F.gelu(self.fc(x)))


class Block(nn.Module):
    """Pre-LN transformer block: x + Attn(LN(x)), then + MLP(LN(.))."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig, seed: int = 0) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab)
        init_weights(self, seed)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        return self.tok_emb(tokens) + self.pos_emb(pos)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.ln_f(x))

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (b, t, V), or the mean cross-entropy loss when ``targets`` is given."""
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        logits = self.logits(x)
        return logits if targets is None else loss_fn(logits, targets)


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over every token of the batch (fp32 whatever the logits' dtype)."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


def init_weights(model: nn.Module, seed: int) -> None:
    """GPT-2 style: N(0, 0.02) for weights, residual projections scaled by 1/sqrt(2L), zero biases."""
    gen = torch.Generator().manual_seed(seed)
    n_layers = getattr(getattr(model, "cfg", None), "n_layers", 1)
    for name, p in model.named_parameters():
        with torch.no_grad():
            if name.endswith("bias"):
                p.zero_()
            elif ".ln" in name or name.startswith("ln"):
                p.fill_(1.0)
            else:
                std = (
                    0.02 / math.sqrt(2 * n_layers)
                    if name.endswith(("proj.weight", "out.weight"))
                    else 0.02
                )
                p.copy_(torch.randn(p.shape, generator=gen) * std)


LR = 3e-3


def make_optimizer(params: Iterable[torch.Tensor], lr: float = LR) -> torch.optim.Adam:
    """Adam as every strategy uses it: the single-threaded for-loop kernel, so all agree to the bit."""
    return torch.optim.Adam(params, lr=lr, betas=(0.9, 0.95), foreach=False, fused=False)


class MasterWeights:
    """bf16-mixed (ZeRO's K=12): bf16 parameters and gradients for compute and communication,
    an fp32 master copy that Adam updates (4 + 4 + 4 bytes per parameter of optimizer state).

        master.grad = fp32(param.grad);  Adam step on master;  param = bf16(master)
    """

    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float = LR) -> None:
        self.params = list(params)
        self.master = [nn.Parameter(p.detach().float().clone()) for p in self.params]
        self.optimizer = make_optimizer(self.master, lr)

    def step(self) -> None:
        for p, m in zip(self.params, self.master):
            m.grad = grad_of(p).float()
        self.optimizer.step()
        with torch.no_grad():
            for p, m in zip(self.params, self.master):
                p.copy_(m)
                m.grad = None


def setup_precision(
    model: nn.Module, precision: str
) -> tuple[torch.optim.Optimizer, MasterWeights | None]:
    """Cast the model and build the optimizer for ``precision``; (optimizer, master weights or None).

    fp32: Adam on the parameters themselves. bf16-mixed: the model becomes bf16 and Adam updates
    an fp32 master copy (call ``master.step()`` instead of ``optimizer.step()``).
    """
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}")
    if precision == "fp32":
        return make_optimizer(model.parameters()), None
    model.to(torch.bfloat16)
    master = MasterWeights(model.parameters())
    return master.optimizer, master


def memory_states(
    model: nn.Module, optimizer: torch.optim.Optimizer, master: MasterWeights | None
) -> dict[str, Any]:
    """What a replica holds as model states (tracekit.capture.model_states' arguments): the
    model's parameters and gradients, Adam's state, and the fp32 master copy under bf16-mixed."""
    return {
        "params": list(model.parameters()),
        "grads": [p.grad for p in model.parameters()],
        "optimizer": optimizer,
        "extra_optimizer": master.master if master else (),
    }
