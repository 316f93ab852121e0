"""MiniGPT cut over a tensor-parallel group (Megatron-style), built from a whole MiniGPT.

Every rank builds the same single-process :class:`~minigpt.model.MiniGPT` (same seed), then
:class:`TPMiniGPT` keeps only its slices:

* **attention, by heads**: MiniGPT's ``qkv`` is one ``Linear`` of ``3 C`` outputs laid out
  ``[q | k | v]``; each of q, k and v is sliced by itself, so rank r keeps heads
  ``[r H/tp, (r+1) H/tp)`` of all three (column-parallel, no communication inside attention);
  ``proj`` is row-parallel (one all-reduce after it);
* **MLP**: ``fc`` column-parallel (its bias sliced with it), ``proj`` row-parallel (its bias whole,
  added after the all-reduce);
* **embeddings**: the token embedding and the tied output layer are one
  :class:`~.layers.VocabParallelEmbedding` (the vocabulary padded to a multiple of tp); the
  position embedding, the layer norms and the residual stream are whole on every rank.

Per block: two all-reduces of the ``(B, T, C)`` activations forward (after attention's and the
MLP's row-parallel layer), two backward (the ``copy_to_tp`` before each column-parallel layer).
Around them, the model sends one all-reduce forward after the token embedding, one backward before
the output layer, and the loss's three numbers per token (:func:`tp_bytes_per_step`).

**Sequence parallelism** (``sequence_parallel=True``): outside the tensor-parallel layers (layer
norms, residual additions, position embedding) each rank keeps only its ``T / tp`` tokens. Each
all-reduce becomes a reduce-scatter where it was (after a row-parallel layer, after the token
embedding) and an all-gather before the next column-parallel layer: the same bytes. The layer
norms, the row-parallel biases and the position embedding then see only this rank's tokens, so
their gradients are partial sums: :meth:`TPMiniGPT.sync_sequence_parallel_grads` all-reduces them
once per step (a few KB, like DDP's gradients: per step, not per token, and not in the formula).

**Context parallelism inside tensor parallelism** (``cp_group=...``, Lab 07): each rank also keeps
only its ``T / cp`` tokens of every row (load-balanced, as :class:`.context_parallel.CPMiniGPT`),
and attention on its local heads becomes :func:`.ring_attention.ring_attention` over the ``cp``
group (its bytes on ``cp_counter``). The tensor-parallel all-reduces then carry ``(B, T/cp, C)``,
and the loss is this rank's share of each row's masked mean (the counts from the whole row), so
the ``cp`` ranks' gradients must be summed, not averaged, as context parallelism's are.

Dropout is refused (``dropout > 0`` raises): replicated regions would need the same random draws on
every rank and sharded ones different draws, which this lab does not build.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn import functional as F

from minigpt.model import MiniGPT, causal_mask
from minigpt.parallel import equivalence
from minigpt.parallel.ring import ByteCounter
from minigpt.parallel.tensor_parallel import comm
from minigpt.parallel.tensor_parallel.comm import Group
from minigpt.parallel.tensor_parallel.kit import Kit, reference_kit
from minigpt.parallel.tensor_parallel.layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    masked_mean_per_sentence,
    padded_vocab_size,
)
from minigpt.parallel.tensor_parallel.ring_attention import positions, ring_attention


def ring_all_reduce_bytes(size_bytes: float, n: int) -> float:
    """What one rank sends in a ring all-reduce of ``size_bytes``: ``2 (n-1)/n`` of it."""
    return 2 * (n - 1) / n * size_bytes


def tp_bytes_per_step(
    batch: int, seq_len: int, hidden: int, n_layer: int, tp: int, bytes_per_element: int = 4
) -> float:
    """Bytes one rank sends in one forward + backward of :class:`TPMiniGPT`, from the theory's
    formula (page 02, tensor parallelism), independent of any counter:

    * per block, ``V_TP = 4 * 2 (t-1)/t * b s h`` elements (two all-reduces forward, two backward);
    * the token embedding's all-reduce forward and the output layer's ``copy_to_tp`` backward:
      two more all-reduces of ``b s h``;
    * the vocabulary-parallel loss: all-reduces of ``b s`` (the maximum) and ``2 b s`` (the sum
      of exponentials and the target's logit).

    The same with sequence parallelism (each all-reduce split into a reduce-scatter and an
    all-gather); the once-a-step gradient all-reduce of its sequence-sharded parameters is not in it.
    """
    bsh = batch * seq_len * hidden * bytes_per_element
    bs = batch * seq_len * bytes_per_element
    return (4 * n_layer + 2) * ring_all_reduce_bytes(bsh, tp) + ring_all_reduce_bytes(3 * bs, tp)


class TPAttention(nn.Module):
    """Causal self-attention on this rank's ``H / tp`` heads."""

    def __init__(self, attn: nn.Module, n_head: int, block_size: int, group: Group, **kw):
        super().__init__()
        tp = dist.get_world_size(group)
        if n_head % tp:
            raise ValueError(f"tp={tp} does not divide the {n_head} attention heads")
        self.local_heads = n_head // tp
        self.qkv = ColumnParallelLinear.from_linear(attn.qkv, group, parts=3, **kw)  # [q_r | k_r | v_r]
        self.proj = RowParallelLinear.from_linear(attn.proj, group, **kw)
        self.register_buffer("mask", causal_mask(block_size).to(attn.qkv.weight.device), persistent=False)
        self.ring: tuple | None = None  # (cp group, its counter, kit): set by TPMiniGPT for context parallelism

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv(x)  # (B, T, 3 C/tp): whole sequence even with sequence parallelism
        B, T, three_c = qkv.shape
        c = three_c // 3
        q, k, v = (t.view(B, T, self.local_heads, c // self.local_heads).transpose(1, 2) for t in qkv.split(c, 2))
        if self.ring is not None:  # T is this rank's tokens: the other cp ranks' keys come round the ring
            group, counter, kit = self.ring
            y = ring_attention(q, k, v, group, counter, load_balanced=True, kit=kit)
            return self.proj(y.transpose(1, 2).contiguous().view(B, T, c))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
        scores = scores.masked_fill(~self.mask[:T, :T], float("-inf"))
        y = F.softmax(scores, dim=-1) @ v
        return self.proj(y.transpose(1, 2).contiguous().view(B, T, c))


class TPMLP(nn.Module):
    def __init__(self, mlp: nn.Module, group: Group, **kw):
        super().__init__()
        self.fc = ColumnParallelLinear.from_linear(mlp.fc, group, **kw)
        self.proj = RowParallelLinear.from_linear(mlp.proj, group, **kw)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class TPBlock(nn.Module):
    def __init__(self, block: nn.Module, n_head: int, block_size: int, group: Group, **kw):
        super().__init__()
        self.ln_1 = _copy_norm(block.ln_1)
        self.attn = TPAttention(block.attn, n_head, block_size, group, **kw)
        self.ln_2 = _copy_norm(block.ln_2)
        self.mlp = TPMLP(block.mlp, group, **kw)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


def _copy_norm(norm: nn.LayerNorm) -> nn.LayerNorm:
    w = norm.weight
    new = nn.LayerNorm(norm.normalized_shape, eps=norm.eps, bias=norm.bias is not None, dtype=w.dtype, device=w.device)
    new.load_state_dict(norm.state_dict())
    return new


class TPMiniGPT(nn.Module):
    """This rank's part of ``model`` over the tensor-parallel ``group`` (default: all ranks).

    ``forward(idx, targets, loss_mask)`` returns this rank's logit slice ``(B, T, padded/tp)`` and
    the same masked per-sentence loss as :func:`minigpt.model.masked_loss` on every rank.
    ``counter`` receives the bytes of every collective (default :data:`.comm.COUNTER`); ``kit``
    (default :func:`~.kit.reference_kit`) supplies the pieces the learner writes in Lab 05.
    Raises ValueError when tp does not divide the heads, the MLP width or the (padded) vocabulary."""

    def __init__(
        self,
        model: MiniGPT,
        group: Group = None,
        sequence_parallel: bool = False,
        counter: ByteCounter | None = None,
        pad_vocab: bool = True,
        kit: Kit | None = None,
        cp_group: Group | None = None,
        cp_counter: ByteCounter | None = None,
    ):
        super().__init__()
        cfg = model.config
        tp = dist.get_world_size(group)
        if cp_group is not None and sequence_parallel:
            raise ValueError("context parallelism inside tensor parallelism takes no sequence parallelism")
        if cfg.dropout:
            raise ValueError(f"TPMiniGPT supports no dropout; got dropout={cfg.dropout}")
        if cfg.n_head % tp:
            raise ValueError(f"tp={tp} does not divide the {cfg.n_head} attention heads")
        padded = padded_vocab_size(cfg.vocab_size, tp) if pad_vocab else cfg.vocab_size
        if padded % tp:
            raise ValueError(f"tp={tp} does not divide the vocabulary of {padded} rows; use pad_vocab=True")
        self.config, self.group, self.counter, self.tp = cfg, group, counter, tp
        self.rank, self.sequence_parallel = dist.get_rank(group), sequence_parallel
        self.kit = reference_kit() if kit is None else kit
        kw = dict(counter=counter, sequence_parallel=sequence_parallel, kit=self.kit)
        self.wte = VocabParallelEmbedding(model.wte.weight, group, padded=padded, **kw)
        self.wpe = nn.Embedding.from_pretrained(model.wpe.weight.detach().clone(), freeze=False)
        self.blocks = nn.ModuleList(TPBlock(b, cfg.n_head, cfg.block_size, group, **kw) for b in model.blocks)
        self.ln_f = _copy_norm(model.ln_f)
        self.cp_group, self.cp, self.cp_rank = cp_group, 1, 0
        if cp_group is not None:
            self.cp, self.cp_rank = dist.get_world_size(cp_group), dist.get_rank(cp_group)
            for b in self.blocks:
                b.attn.ring = (cp_group, cp_counter, self.kit)

    def local_tokens(self, t: torch.Tensor) -> torch.Tensor:
        """This rank's tokens of a ``(B, T, ...)`` tensor of whole rows (all of them without a cp group)."""
        if self.cp_group is None:
            return t
        return t.index_select(1, positions(t.shape[1], self.cp, self.cp_rank, True).to(t.device))

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, loss_mask: torch.Tensor | None = None):
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"sequence of {T} tokens is longer than block_size {self.config.block_size}")
        pos = torch.arange(T, device=idx.device)
        if self.cp_group is not None:
            if T % (2 * self.cp):
                raise ValueError(f"context parallelism needs T divisible by 2 cp: T={T}, cp={self.cp}")
            pos, idx = self.local_tokens(pos.view(1, T))[0], self.local_tokens(idx)  # this rank's tokens
        if self.sequence_parallel:
            if T % self.tp:
                raise ValueError(f"sequence parallelism needs T divisible by tp: T={T}, tp={self.tp}")
            pos = pos.view(self.tp, T // self.tp)[self.rank]  # this rank's tokens
        x = self.wte(idx) + self.wpe(pos)  # (B, T, C), or (B, T/tp, C)
        for block in self.blocks:
            x = block(x)
        logits = self.wte.logits(self.ln_f(x))  # (B, T, padded/tp)
        if targets is None:
            return logits, None
        if loss_mask is None:
            loss_mask = torch.ones_like(targets, dtype=torch.bool)
        per_token = self.kit.vocab_parallel_cross_entropy(
            logits, self.local_tokens(targets), self.wte.start, self.config.vocab_size, self.group, self.counter
        )
        if self.cp_group is None:
            return logits, masked_mean_per_sentence(per_token, loss_mask)
        # this rank's share: its masked losses of each row over the row's whole count, averaged over rows
        counts = loss_mask.sum(dim=1).clamp(min=1).to(per_token.dtype)
        local_mask = self.local_tokens(loss_mask).to(per_token.dtype)
        return logits, ((per_token * local_mask).sum(dim=1) / counts).mean()

    def sequence_parallel_parameters(self) -> list[nn.Parameter]:
        """The parameters whole on every rank but fed only this rank's tokens under sequence
        parallelism: layer norms, row-parallel biases, position embedding (empty without it)."""
        if not self.sequence_parallel:
            return []
        params = [self.wpe.weight, *self.ln_f.parameters()]
        for b in self.blocks:
            params += [*b.ln_1.parameters(), *b.ln_2.parameters()]
            params += [p for p in (b.attn.proj.bias, b.mlp.proj.bias) if p is not None]
        return params

    def sync_sequence_parallel_grads(self, counter: ByteCounter | None = None) -> None:
        """All-reduce (sum) the gradients of :meth:`sequence_parallel_parameters`, once per step
        after backward. ``counter`` defaults to :data:`.comm.COUNTER`; pass another to keep these
        bytes apart from the activations'."""
        params = [p for p in self.sequence_parallel_parameters() if p.grad is not None]
        if not params:
            return
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        flat = comm.all_reduce(flat, self.group, counter)
        offset = 0
        for p in params:
            p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()

    def sharded_parameters(self) -> list[nn.Parameter]:
        """The parameters cut over the group (each rank holds a different slice): the vocabulary
        shard, and the weights (and column-parallel biases) of the parallel layers. Every other
        parameter is whole and the same on every rank."""
        params = [self.wte.weight]
        for b in self.blocks:
            for layer in (b.attn.qkv, b.attn.proj, b.mlp.fc, b.mlp.proj):
                params.append(layer.weight)
                if isinstance(layer, ColumnParallelLinear) and layer.bias is not None:
                    params.append(layer.bias)
        return params

    def tp_layout(self) -> dict[str, tuple[int | None, int]]:
        """How each parameter is cut over the group, by name: ``(tp_dim, parts)``. ``tp_dim`` is 0 for
        a tensor cut in rows (the vocabulary shard, the column-parallel weights and biases), 1 for one
        cut in columns (the row-parallel weights), None for one every rank holds whole; ``parts`` is
        3 for the fused q, k, v weight, whose rows are cut part by part (each rank holds its rows of
        q, then of k, then of v), else 1. :meth:`full_state_dict` joins the slices this way; Lab 07
        joins them from FSDP's pieces (Exercise 7.3)."""
        layout: dict[str, tuple[int | None, int]] = {n: (None, 1) for n, _ in self.named_parameters()}
        layout["wte.weight"] = (0, 1)
        for i, b in enumerate(self.blocks):
            pre = f"blocks.{i}."
            layout[pre + "attn.qkv.weight"] = (0, 3)
            layout[pre + "attn.proj.weight"] = (1, 1)
            layout[pre + "mlp.fc.weight"] = (0, 1)
            if b.mlp.fc.bias is not None:
                layout[pre + "mlp.fc.bias"] = (0, 1)
            layout[pre + "mlp.proj.weight"] = (1, 1)
        return layout

    def clip_grad_norm_(self, max_norm: float, counter: ByteCounter | None = None) -> torch.Tensor:
        """Clip every gradient by the norm of the **whole** model's gradient, as
        ``torch.nn.utils.clip_grad_norm_`` on the single-process model would (same scale,
        ``max_norm / (norm + 1e-6)`` at most 1). The squares of the sharded gradients are summed
        over the group (an all-reduce of one number, on ``counter``); those of the whole
        parameters, the same on every rank, are counted once. Returns the norm. Under sequence
        parallelism call :meth:`sync_sequence_parallel_grads` first."""
        sharded = {id(p) for p in self.sharded_parameters()}
        grads = [(id(p) in sharded, p.grad) for p in self.parameters() if p.grad is not None]
        squares = [torch.linalg.vector_norm(g) ** 2 for _, g in grads]
        mine = torch.stack([s for (cut, _), s in zip(grads, squares) if cut]).sum()
        whole = torch.stack([s for (cut, _), s in zip(grads, squares) if not cut]).sum()
        norm = torch.sqrt(comm.all_reduce(mine.reshape(1), self.group, counter)[0] + whole)
        scale = (max_norm / (norm + 1e-6)).clamp(max=1.0)
        for _, g in grads:
            g.mul_(scale)
        return norm

    def full_state_dict(self, grads: bool = False, of=None) -> dict[str, torch.Tensor]:
        """The whole model in :class:`~minigpt.model.MiniGPT`'s layout and names (``lm_head.weight``
        the same tensor as ``wte.weight``), gathered on every rank with ``dist.all_gather`` (not
        counted). With ``grads=True``, the gradients instead (zeros where a parameter has none;
        under sequence parallelism call :meth:`sync_sequence_parallel_grads` first); with ``of``, a
        function of a parameter, its value instead (an optimizer's moment of each parameter)."""

        def value(p: torch.Tensor) -> torch.Tensor:
            if of is not None:
                return of(p)
            if not grads:
                return p.detach()
            return torch.zeros_like(p) if p.grad is None else p.grad.detach()

        # every cut tensor is gathered in one all-gather (each rank's pieces laid end to end): per
        # tensor, ~60 small collectives a step of the proof, each waiting for every rank to be scheduled
        cut: list[tuple[str, torch.Tensor, str, int]] = []  # (key, local piece, "rows" or "columns", parts)
        state: dict[str, torch.Tensor] = {}

        def rows(key: str, t: torch.Tensor, parts: int = 1) -> None:
            cut.append((key, value(t).contiguous(), "rows", parts))
            state[key] = t  # keeps MiniGPT's key order; the gathered tensor replaces it below

        def columns(key: str, t: torch.Tensor) -> None:
            cut.append((key, value(t).contiguous(), "columns", 1))
            state[key] = t

        rows("wte.weight", self.wte.weight)
        state["wpe.weight"] = value(self.wpe.weight).clone()
        for i, b in enumerate(self.blocks):
            pre = f"blocks.{i}."
            for name in ("ln_1", "ln_2"):
                for k, p in getattr(b, name).named_parameters():
                    state[f"{pre}{name}.{k}"] = value(p).clone()
            rows(pre + "attn.qkv.weight", b.attn.qkv.weight, parts=3)
            columns(pre + "attn.proj.weight", b.attn.proj.weight)
            rows(pre + "mlp.fc.weight", b.mlp.fc.weight)
            if b.mlp.fc.bias is not None:
                rows(pre + "mlp.fc.bias", b.mlp.fc.bias)
            columns(pre + "mlp.proj.weight", b.mlp.proj.weight)
            if b.mlp.proj.bias is not None:
                state[pre + "mlp.proj.bias"] = value(b.mlp.proj.bias).clone()
        for k, p in self.ln_f.named_parameters():
            state[f"ln_f.{k}"] = value(p).clone()
        flat = torch.cat([t.reshape(-1) for _, t, _, _ in cut])
        everyone = [torch.empty_like(flat) for _ in range(self.tp)]
        dist.all_gather(everyone, flat, group=self.group)
        offset = 0
        for key, t, how, parts in cut:
            pieces = [r[offset : offset + t.numel()].view_as(t) for r in everyone]
            offset += t.numel()
            if how == "columns":
                state[key] = torch.cat(pieces, dim=1)
            else:
                split = [piece.chunk(parts) for piece in pieces]  # each rank's [q_r | k_r | v_r]
                state[key] = torch.cat([s[i] for i in range(parts) for s in split])
        state["wte.weight"] = state["wte.weight"][: self.config.vocab_size]
        state["lm_head.weight"] = state["wte.weight"]
        return state


def whole_state(model: TPMiniGPT, optimizer: torch.optim.Optimizer) -> dict:
    """The cut model's weights and optimizer state (AdamW's moments, or SGD's momentum), gathered
    into MiniGPT's names (every rank)."""
    state = {"weights": model.full_state_dict(), "moments": {}, "step": None}
    first = next(iter(model.parameters()))
    for key in ("exp_avg", "exp_avg_sq", "momentum_buffer"):
        if key in optimizer.state.get(first, {}):
            state["moments"][key] = model.full_state_dict(of=lambda p, key=key: optimizer.state[p][key])
    if "step" in optimizer.state.get(first, {}):
        state["step"] = optimizer.state[first]["step"].clone()  # AdamW adds to it in place
    return state


def replicated_digest(model: TPMiniGPT) -> str:
    """A digest of the parameters every rank holds whole (they must stay bit-identical)."""
    cut_ids = {id(p) for p in model.sharded_parameters()}
    return equivalence.digest(p for p in model.parameters() if id(p) not in cut_ids)
