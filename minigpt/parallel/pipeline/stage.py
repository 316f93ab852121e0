"""One pipeline stage: a consecutive slice of MiniGPT's layers, and the tied matrix it shares.

MiniGPT is ``wte + wpe -> block 0 -> ... -> block L-1 -> ln_f -> lm_head``. Cut into p stages,
stage 0 holds the embeddings and the first blocks, the last stage the last blocks, the final norm
and the output layer; a stage in between holds blocks only. The blocks are shared out as evenly as
they go (:func:`stage_blocks`: 4 blocks on 2 stages are 2 + 2, on 3 stages 2 + 1 + 1).

**The tied matrix.** MiniGPT's output layer uses the token embedding's matrix (``lm_head.weight is
wte.weight``). Cut into stages, that one matrix is needed on the first stage (to embed) and on the
last (to compute logits): each keeps its own copy. In backward each copy gets half of the story
(the embedding's gradient, the output layer's gradient); the whole gradient is their sum, so the
two stages swap their halves and add (:func:`minigpt.parallel.pipeline.engine.sync_tied_gradient`)
and then take the same optimizer step, which keeps the copies bit-identical. Megatron-LM does the
same with its "embedding group". With one stage there is one matrix and nothing to swap.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from minigpt.model import MiniGPT, masked_loss


def stage_blocks(n_layer: int, stages: int) -> list[range]:
    """The blocks of each stage: consecutive, the first ``n_layer % stages`` stages one more."""
    if stages < 1 or stages > n_layer:
        raise ValueError(f"cannot cut {n_layer} blocks into {stages} stages: use 1 to {n_layer} stages")
    base, extra = divmod(n_layer, stages)
    out, start = [], 0
    for s in range(stages):
        stop = start + base + (1 if s < extra else 0)
        out.append(range(start, stop))
        start = stop
    return out


class PipelineStage(nn.Module):
    """Stage ``stage`` of ``stages``, built from a whole MiniGPT (every rank builds the same one from
    the seed and keeps its slice, as copies).

    ``forward`` takes token ids (the first stage) or the previous stage's activations ``(B, T, C)``
    and returns activations ``(B, T, C)`` or, on the last stage, logits ``(B, T, V)``.
    """

    def __init__(self, model: MiniGPT, stage: int, stages: int):
        super().__init__()
        cfg = model.config
        self.stage, self.stages = stage, stages
        self.is_first, self.is_last = stage == 0, stage == stages - 1
        self.block_ids = stage_blocks(cfg.n_layer, stages)[stage]
        if self.is_first:
            self.wte = copy.deepcopy(model.wte)
            self.wpe = copy.deepcopy(model.wpe)
        self.blocks = nn.ModuleList(copy.deepcopy(model.blocks[i]) for i in self.block_ids)
        if self.is_last:
            self.ln_f = copy.deepcopy(model.ln_f)
            # the output layer's matrix: the embedding's own on a single stage, a copy otherwise
            self.head = self.wte.weight if self.is_first else nn.Parameter(model.wte.weight.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.is_first:
            pos = torch.arange(x.shape[1], device=x.device)
            x = self.wte(x) + self.wpe(pos)  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        if self.is_last:
            x = self.ln_f(x) @ self.head.t()  # (B, T, V)
        return x

    @staticmethod
    def loss(logits: torch.Tensor, targets: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
        """MiniGPT's own loss (per-sentence means, then their mean) on the last stage's logits."""
        return masked_loss(logits, targets, loss_mask)

    def tied_weight(self) -> nn.Parameter | None:
        """This stage's copy of the shared embedding matrix, when another stage holds the other."""
        if self.stages == 1:
            return None
        if self.is_first:
            return self.wte.weight
        return self.head if self.is_last else None

    def named_in_model(self) -> list[tuple[str, nn.Parameter]]:
        """``(name in MiniGPT, parameter)`` for every parameter of this stage (the last stage's copy
        of the tied matrix under ``lm_head.weight``)."""
        out = []
        for name, p in self.named_parameters():
            if name.startswith("blocks."):
                _, local, rest = name.split(".", 2)
                name = f"blocks.{self.block_ids[int(local)]}.{rest}"
            elif name == "head":
                name = "lm_head.weight"
            out.append((name, p))
        return out
