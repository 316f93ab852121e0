"""PyTorch's own tensor parallelism on MiniGPT: what Lab 05's hand-made TP is held against.

``torch.distributed.tensor.parallel.parallelize_module`` cuts ``nn.Linear`` layers by a *plan*:
``ColwiseParallel`` keeps a slice of a layer's outputs (its weight's rows), ``RowwiseParallel`` a
slice of its inputs and all-reduces its output. That is Megatron's column-then-row pair, the
same cut :class:`~minigpt.parallel.tensor_parallel.TPMiniGPT` makes by hand, with DTensors.

One thing in MiniGPT does not fit a plan as it is: its attention computes q, k and v with one
fused ``Linear`` of ``3 C`` outputs laid out ``[q | k | v]``. ``ColwiseParallel`` on it would give
rank 0 the first ``3 C / tp`` outputs, all of q and part of k, not its heads of each. So PyTorch's
version runs the same weights with q, k and v as three ``Linear`` layers (:class:`SplitQKVAttention`,
each one the fused weight's block of rows), each cut by columns, and the attention reads its number
of heads from the slice it holds. In one process, splitting the fused layer changes nothing but the
order of a few float32 additions: the lab measures that too, as a control.

What is cut, as our version cuts it: in every block q, k, v and the MLP's ``fc`` by columns,
attention's and the MLP's ``proj`` by rows; and the vocabulary (:func:`cut_vocabulary`): the token
embedding by rows (``RowwiseParallel``: each rank looks up the tokens of its rows, an all-reduce
adds), the tied output layer with the same sharded matrix, its logits left cut by vocabulary, and
the loss computed on them by PyTorch's ``loss_parallel`` (each rank's share of the softmax, as our
vocabulary-parallel cross-entropy does). The position embedding and the layer norms stay whole.
A vocabulary of 609 rows is cut unevenly (305 and 304 on two ranks); ours pads it to 610.
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn as nn
from torch.nn import functional as F

from minigpt.model import MiniGPT

SPLIT = ("q", "k", "v")


class SplitQKVAttention(nn.Module):
    """MiniGPT's causal self-attention with q, k and v as three ``Linear`` layers. The number of
    heads is read from q's width (``width / head_dim``), so the module works whole and cut."""

    def __init__(self, attn: nn.Module):
        super().__init__()
        C = attn.qkv.in_features
        self.head_dim = C // attn.n_head
        fused = attn.qkv.weight
        for i, name in enumerate(SPLIT):
            linear = nn.Linear(C, C, bias=False)
            with torch.no_grad():
                linear.weight.copy_(fused[i * C : (i + 1) * C])
            setattr(self, name, linear.to(fused.device, fused.dtype))  # where the fused weight lives
        self.proj = attn.proj
        self.register_buffer("mask", attn.mask.clone(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        # (B, T, width) -> (B, heads held, T, D): every head attends on its own D-sized slice
        q, k, v = (getattr(self, n)(x).view(B, T, -1, self.head_dim).transpose(1, 2) for n in SPLIT)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        scores = scores.masked_fill(~self.mask[:T, :T], float("-inf"))
        y = F.softmax(scores, dim=-1) @ v
        return self.proj(y.transpose(1, 2).contiguous().view(B, T, -1))


def split_qkv(model: MiniGPT) -> MiniGPT:
    """A copy of ``model`` whose attention layers are :class:`SplitQKVAttention` (the same weights)."""
    split = copy.deepcopy(model)
    for block in split.blocks:
        block.attn = SplitQKVAttention(block.attn)
    return split


def parallelize(model: MiniGPT, mesh, vocabulary: bool = False) -> MiniGPT:
    """``parallelize_module`` with the Megatron plan on every block of a split-qkv MiniGPT; with
    ``vocabulary``, the vocabulary cut too (:func:`cut_vocabulary`)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    plan = {f"attn.{n}": ColwiseParallel() for n in SPLIT}
    plan.update({"attn.proj": RowwiseParallel(), "mlp.fc": ColwiseParallel(), "mlp.proj": RowwiseParallel()})
    for block in model.blocks:
        parallelize_module(block, mesh, plan)
    return cut_vocabulary(model, mesh) if vocabulary else model


def cut_vocabulary(model: MiniGPT, mesh) -> MiniGPT:
    """The token embedding cut by vocabulary rows over ``mesh``, the output layer tied to the same
    sharded matrix (its input made a replicated DTensor, so its logits come out cut by vocabulary),
    and the model's loss computed on those cut logits: run its forward and backward under
    ``torch.distributed.tensor.parallel.loss_parallel()``."""
    import types

    from torch.distributed.tensor import DTensor, Replicate
    from torch.distributed.tensor.parallel import PrepareModuleInput, RowwiseParallel, parallelize_module

    parallelize_module(model, mesh, {"wte": RowwiseParallel(input_layouts=Replicate())})
    model.lm_head.weight = model.wte.weight  # still tied: one sharded matrix, used twice
    layout = PrepareModuleInput(input_layouts=Replicate(), desired_input_layouts=Replicate(), use_local_output=False)
    parallelize_module(model, mesh, {"lm_head": layout})
    forward = model.forward

    def vocabulary_parallel_forward(self, idx, targets=None, loss_mask=None):
        logits, _ = forward(idx)  # (B, T, V) cut by vocabulary: a DTensor sharded on its last dim
        if targets is None:
            return logits, None
        mask = torch.ones_like(targets, dtype=torch.bool) if loss_mask is None else loss_mask
        per_token = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none")  # replicated
        weights = mask.to(per_token.dtype)
        local = [weights.flatten(), weights.sum(dim=1).clamp(min=1)]
        flat, counts = (DTensor.from_local(t, mesh, [Replicate()]) for t in local)
        per_row = (per_token * flat).view(targets.shape).sum(dim=1) / counts  # masked_loss, sentence by sentence
        return logits, per_row.mean()

    model.forward = types.MethodType(vocabulary_parallel_forward, model)
    return model


def _whole(t: torch.Tensor) -> torch.Tensor:
    from minigpt.parallel.proof import whole

    return whole(t)


def fused_names(named: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A split-qkv model's tensors (whole) under MiniGPT's names: each block's q, k and v stacked
    back into ``attn.qkv.weight``."""
    out = {}
    for name, t in named.items():
        head, _, leaf = name.rpartition(".")
        if head.endswith(".attn.q") or head.endswith(".attn.k") or head.endswith(".attn.v"):
            if head.endswith(".q"):
                base = head[: -len(".q")]
                out[f"{base}.qkv.{leaf}"] = torch.cat([named[f"{base}.{n}.{leaf}"] for n in SPLIT])
            continue
        out[name] = t
    return out


def whole_state(model: MiniGPT, optimizer: torch.optim.Optimizer) -> dict:
    """The weights and the optimizer's moments gathered whole (every rank), under MiniGPT's names."""
    named = dict(model.named_parameters())
    weights = fused_names({n: _whole(p.detach()) for n, p in model.state_dict(keep_vars=True).items()})
    state = {"weights": weights, "moments": {}, "step": None}
    by_key: dict[str, dict[str, torch.Tensor]] = {}
    for name, p in named.items():
        for key, value in optimizer.state.get(p, {}).items():
            if key == "step":
                state["step"] = _whole(value)
            elif torch.is_tensor(value):
                by_key.setdefault(key, {})[name] = _whole(value)
    state["moments"] = {key: fused_names(values) for key, values in by_key.items()}
    return state


def whole_gradients(model: MiniGPT) -> dict[str, torch.Tensor]:
    """Every parameter's gradient gathered whole, under MiniGPT's names."""
    grads = {n: _whole(p.grad) for n, p in model.named_parameters() if p.grad is not None}
    return fused_names(grads)


@torch.no_grad()
def clip_grad_norm_(model: MiniGPT, max_norm: float) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_``'s arithmetic on a model whose gradients are partly DTensors
    (the cut layers) and partly plain tensors (the whole ones), which the function itself refuses
    to mix: each parameter's norm (a cut one's over its whole gradient, by DTensor's reduction),
    the norm of those norms, and every gradient scaled by ``max_norm / (norm + 1e-6)``, at most 1."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    norms = [torch.linalg.vector_norm(g) for g in grads]
    norms = [n.full_tensor() if hasattr(n, "full_tensor") else n for n in norms]
    total = torch.linalg.vector_norm(torch.stack(norms))
    scale = float(torch.clamp(max_norm / (total + 1e-6), max=1.0))
    for g in grads:
        g.mul_(scale)
    return total
