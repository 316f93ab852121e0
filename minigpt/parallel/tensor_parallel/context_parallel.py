"""Context parallelism on the whole model: MiniGPT trained with each sequence cut over ``cp`` ranks.

:func:`~minigpt.parallel.tensor_parallel.ring_attention` is one layer; this module trains MiniGPT
with it. Every rank of a context-parallel group holds the whole model (like DDP) and every row of
the batch, but only its slice of each row's tokens (``T / cp`` of them, contiguous or
load-balanced: :func:`~minigpt.parallel.tensor_parallel.split_sequence`). Everything in MiniGPT
works token by token (embeddings, layer norms, the MLP, the output layer, the loss of a token)
except attention, which needs every earlier key: there ring attention brings the other ranks'
keys and values round the group.

**The loss.** MiniGPT averages each row's masked token losses over the row's masked tokens, then
averages the rows (:func:`minigpt.model.masked_loss`). A rank holds only some of each row's
tokens, so it first learns each row's count over the group (one all-reduce of B integers), then
computes its share ``mean_b(sum of its masked losses in row b / count_b)``: the shares of the ranks
add up to the loss of one process.

**The gradients.** Each rank's backward gives the gradient of its share; the gradient of the loss
is their sum, so one all-reduce (SUM, not mean) over the group makes every rank's gradient the
whole one, exactly as data parallelism averages. The weights then stay bit-identical on every rank.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from minigpt.model import MiniGPT
from minigpt.parallel.ring import ByteCounter
from minigpt.parallel.tensor_parallel.comm import Group
from minigpt.parallel.tensor_parallel.kit import Kit, reference_kit
from minigpt.parallel.tensor_parallel.ring_attention import positions, ring_attention, ring_attention_bytes


class CPMiniGPT(nn.Module):
    """A whole MiniGPT (its own parameters, the same names) run on this rank's tokens of every row."""

    def __init__(
        self,
        model: MiniGPT,
        group: Group = None,
        load_balanced: bool = True,
        counter: ByteCounter | None = None,
        kit: Kit | None = None,
    ):
        super().__init__()
        self.model, self.group, self.load_balanced = model, group, load_balanced
        self.cp, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.counter = ByteCounter() if counter is None else counter
        self.kit = reference_kit() if kit is None else kit

    def positions(self, seq_len: int) -> torch.Tensor:
        """The global positions of this rank's tokens of a row of ``seq_len`` tokens."""
        return positions(seq_len, self.cp, self.rank, self.load_balanced)

    def local(self, t: torch.Tensor) -> torch.Tensor:
        """This rank's tokens of a ``(B, T, ...)`` tensor."""
        return t.index_select(1, self.positions(t.shape[1]).to(t.device))

    def _attention(self, attn: nn.Module, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape  # T: this rank's tokens
        q, k, v = attn.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, attn.n_head, C // attn.n_head).transpose(1, 2) for t in (q, k, v))
        y = ring_attention(q, k, v, self.group, self.counter, self.load_balanced, kit=self.kit)
        return attn.proj(y.transpose(1, 2).contiguous().view(B, T, C))

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, loss_mask: torch.Tensor | None = None):
        """``idx`` (B, T) whole rows -> this rank's logits (B, T/cp, V) and its share of the loss."""
        m = self.model
        pos = self.positions(idx.shape[1]).to(idx.device)
        x = m.wte(self.local(idx)) + m.wpe(pos)
        for block in m.blocks:
            x = x + self._attention(block.attn, block.ln_1(x))
            x = x + block.mlp(block.ln_2(x))
        logits = m.lm_head(m.ln_f(x))
        if targets is None:
            return logits, None
        mask = torch.ones_like(targets, dtype=torch.bool) if loss_mask is None else loss_mask
        counts = mask.sum(dim=1).to(torch.float64)  # each row's masked tokens, over the whole row
        per_token = F.cross_entropy(logits.flatten(0, 1), self.local(targets).flatten(), reduction="none")
        local_mask = self.local(mask).to(per_token.dtype)
        per_row = (per_token.view(local_mask.shape) * local_mask).sum(dim=1) / counts.clamp(min=1).to(per_token.dtype)
        return logits, per_row.mean()

    @torch.no_grad()
    def all_reduce_gradients(self) -> None:
        """Sum every parameter's gradient over the group (each rank's is the gradient of its share)."""
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=self.group)
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()


def cp_bytes_per_step(
    batch: int, heads: int, seq_len: int, head_dim: int, n_layer: int, cp: int, element_size: int = 4
) -> int:
    """What one rank sends through ring attention in one training step: every layer's K and V, forward
    and backward (:func:`~minigpt.parallel.tensor_parallel.ring_attention_bytes` each way)."""
    return round(2 * n_layer * ring_attention_bytes(batch, heads, seq_len, head_dim, cp, element_size))
