"""MiniGPT: a small decoder-only transformer, in the spirit of nanoGPT's ``model.py``.

Shapes in the comments: B = batch, T = sequence length (<= block_size), C = n_embd,
H = n_head, D = C / H (the size of one head), V = vocab_size.

Two choices matter for the rest of the course:

* **No bias in the attention projections.** A bias on the keys adds the same number to every
  score of a query, and softmax ignores such a shift, so its true gradient is exactly zero. In
  floating point it is tiny rounding noise instead, and Adam divides by the square root of that
  noise's own square: noise becomes a full-size step. Two runs that sum in different orders
  (one process against two) then drift apart for no good reason. Without the bias there is
  nothing to amplify. (The MLP keeps its biases: their gradients are real.)
* **Tied embeddings.** The output layer reuses the token embedding matrix, so one parameter is
  used by two modules; Lab 01's DDP must synchronise it once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F


@dataclass
class GPTConfig:
    vocab_size: int = 609  # minigpt.grammar.VOCAB_SIZE
    block_size: int = 32  # longest sequence the model reads
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 96
    dropout: float = 0.0
    bias: bool = True  # biases in the MLP and LayerNorms; attention projections never have one


def causal_mask(size: int) -> torch.Tensor:
    """A (size, size) bool matrix, True where query ``i`` may attend to key ``j`` (``j <= i``)."""
    return torch.ones(size, size, dtype=torch.bool).tril()


def masked_loss(logits: torch.Tensor, targets: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Cross-entropy counted only where ``loss_mask`` is True, averaged per sentence.

    Each row's loss is the mean over its masked tokens; the batch loss is the mean over rows.
    Averaging per sentence (not per token) makes the loss of a batch exactly the mean of the
    losses of equal slices of it, which is what data parallelism computes when N ranks each
    average their slice and then average across ranks.
    logits (B, T, V), targets (B, T), loss_mask (B, T) -> scalar.
    """
    per_token = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none")
    per_token = per_token.view_as(targets)
    mask = loss_mask.to(per_token.dtype)
    per_row = (per_token * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)
    return per_row.mean()


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.n_head = config.n_head
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd, bias=False)  # no bias: see above
        self.proj = nn.Linear(config.n_embd, config.n_embd, bias=False)
        self.dropout = nn.Dropout(config.dropout)
        self.register_buffer("mask", causal_mask(config.block_size), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)  # each (B, T, C)
        # (B, T, C) -> (B, H, T, D): every head attends on its own D-sized slice
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))  # (B, H, T, T)
        scores = scores.masked_fill(~self.mask[:T, :T], float("-inf"))
        weights = self.dropout(F.softmax(scores, dim=-1))
        y = weights @ v  # (B, H, T, D)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # heads side by side again
        return self.proj(y)


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    """Pre-norm transformer block: x + attention(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class MiniGPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)  # token embeddings (V, C)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)  # position embeddings (T, C)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied: one (V, C) matrix, used twice
        self.apply(self._init_weights)
        # GPT-2's scaled init for the projections that add into the residual stream
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def num_params(self) -> int:
        """Distinct parameters (the tied matrix counted once)."""
        return sum(p.numel() for p in self.parameters())

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, loss_mask: torch.Tensor | None = None):
        """idx (B, T) token ids -> logits (B, T, V), and the masked loss if targets are given."""
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"sequence of {T} tokens is longer than block_size {self.config.block_size}")
        pos = torch.arange(T, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))  # (B, T, V)
        if targets is None:
            return logits, None
        if loss_mask is None:
            loss_mask = torch.ones_like(targets, dtype=torch.bool)
        return logits, masked_loss(logits, targets, loss_mask)

    @torch.no_grad()
    def generate(
        self, prompts: list[list[int]], eos_id: int, max_new_tokens: int | None = None, pad_id: int = 0
    ) -> list[list[int]]:
        """Greedy decoding for a batch of prompts of different lengths.

        Each prompt is written left-aligned into a (B, block_size) buffer; at every step the
        whole buffer goes through the model (cheap at this size, and right-padding cannot
        affect earlier positions under the causal mask) and each unfinished row appends the
        argmax of the logits at its last position. Returns each row's new tokens, up to and
        including ``eos_id``.
        """
        T = self.config.block_size
        device = self.wte.weight.device
        lengths = torch.tensor([len(p) for p in prompts], device=device)
        if int(lengths.max()) >= T:
            raise ValueError(f"a prompt of {int(lengths.max())} tokens leaves no room in block_size {T}")
        buf = torch.full((len(prompts), T), pad_id, dtype=torch.long, device=device)
        for i, p in enumerate(prompts):
            buf[i, : len(p)] = torch.tensor(p, dtype=torch.long)
        start = lengths.clone()
        done = torch.zeros(len(prompts), dtype=torch.bool, device=device)
        limit = T - int(lengths.min()) if max_new_tokens is None else max_new_tokens
        rows = torch.arange(len(prompts), device=device)
        for _ in range(limit):
            active = ~done & (lengths < T)
            if not active.any():
                break
            top = int(lengths[active].max())
            logits, _ = self(buf[:, :top])
            next_tok = logits[rows, (lengths - 1).clamp(max=top - 1)].argmax(-1)
            buf[rows[active], lengths[active]] = next_tok[active]
            done |= active & (next_tok == eos_id)
            lengths = lengths + active.long()
        return [buf[i, int(start[i]) : int(lengths[i])].tolist() for i in range(len(prompts))]
