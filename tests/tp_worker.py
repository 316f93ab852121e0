"""One rank of the course's own checks of Lab 05's mechanism (no points):
``python tests/tp_worker.py OUTDIR`` under RANK/WORLD_SIZE, started by tests/test_lab05_reference.py
through tests/launcher.py at 2 and at 4 ranks (tp = cp = the world size).

Every scenario measures; the test file compares with the references it computes itself (one process,
the formulas of theory page 02). Each rank builds the same single-process MiniGPT and the same batch
from the same seeds, so the one-process reference is computed on every rank. Writes
``OUTDIR/rank<r>.json``.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn import functional as F

from minigpt.model import GPTConfig, MiniGPT
from minigpt.parallel.ring import ByteCounter
from minigpt.parallel.tensor_parallel import (
    TPMiniGPT,
    gather_logits,
    merge_sequence,
    ring_attention,
    split_sequence,
)
from tests import launcher
from tests.limits import limit

OUT = Path(sys.argv[1]) if __name__ == "__main__" else None
RANK, WORLD = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
RESULTS: dict[str, dict] = {}
BATCH, SEQ = 4, 32
DTYPES = {"float32": torch.float32, "float64": torch.float64}


def batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random tokens and targets over the whole vocabulary (the last rows, the padding's
    neighbours, included), a ragged loss mask and one row with no masked token at all."""
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, 609, (BATCH, SEQ), generator=g)
    targets = torch.randint(0, 609, (BATCH, SEQ), generator=g)
    targets[0, :4] = torch.tensor([608, 607, 0, 304])
    mask = torch.rand(BATCH, SEQ, generator=g) < 0.6
    mask[1] = False
    return idx, targets, mask


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in b)


def tp_against_one_process(dtype_name: str) -> dict:
    """One forward and backward of MiniGPT in one process, of TPMiniGPT, and of TPMiniGPT with
    sequence parallelism: logits, loss, every gradient, and the bytes each sent."""
    dtype = DTYPES[dtype_name]
    torch.manual_seed(0)
    one = MiniGPT(GPTConfig()).to(dtype)
    with torch.no_grad():  # biases and norms away from their init (zeros, ones): a bias added on
        for name, p in one.named_parameters():  # every rank, not once, would then show
            if name.endswith("bias") or ".ln_" in name or name.startswith("ln_f"):
                p.add_(0.1 * torch.randn_like(p))
    idx, targets, mask = batch()
    logits, loss = one(idx, targets, mask)
    loss.backward()
    grads = {n: p.grad for n, p in one.named_parameters()}
    out = {}
    runs = {}
    for sp in (False, True):
        counter, grad_counter = ByteCounter(), ByteCounter()
        tp = TPMiniGPT(one, sequence_parallel=sp, counter=counter)
        built = tp.full_state_dict()
        local, tp_loss = tp(idx, targets, mask)
        tp_loss.backward()
        tp.sync_sequence_parallel_grads(grad_counter)
        full_logits = gather_logits(local, 609)
        tp_grads = tp.full_state_dict(grads=True)
        rows = torch.arange(tp.wte.start, tp.wte.start + tp.wte.per_rank)
        padding_grad = tp.wte.weight.grad[rows >= 609]
        runs[sp] = (full_logits, tp_grads)
        out["sp" if sp else "tp"] = {
            "built_exact": all(torch.equal(built[k], v) for k, v in one.state_dict().items()),
            "local_vocab": local.shape[-1],
            "logits": float((full_logits - logits.detach()).abs().max()),
            "loss": abs(float(tp_loss) - float(loss)),
            "grads": max_diff(tp_grads, grads),
            "grad_keys": sorted(set(grads) - set(tp_grads)),
            "padding_rows": int((rows >= 609).sum()),
            "padding_grad": float(padding_grad.abs().max()) if padding_grad.numel() else 0.0,
            "bytes": counter.sent,
            "grad_sync_bytes": grad_counter.sent,
        }
    out["sp_vs_tp"] = {
        "logits": float((runs[True][0] - runs[False][0]).abs().max()),
        "grads": max_diff(runs[True][1], runs[False][1]),
    }
    return out


def refusals() -> dict:
    """Bad input: an unpadded vocabulary, a head count and a sequence tp does not divide."""
    found = {}
    torch.manual_seed(0)
    checks = {
        "vocab": lambda: TPMiniGPT(MiniGPT(GPTConfig(n_layer=1)), pad_vocab=False),
        "heads": lambda: TPMiniGPT(MiniGPT(GPTConfig(n_layer=1, n_head=3 if WORLD == 2 else 6))),
        "sequence": lambda: TPMiniGPT(MiniGPT(GPTConfig(n_layer=1)), sequence_parallel=True)(
            torch.zeros(1, SEQ - 1, dtype=torch.long)
        ),
        "cp_split": lambda: split_sequence(torch.zeros(1, 1, 9, 2), WORLD, RANK),
        "cp_split_balanced": lambda: split_sequence(torch.zeros(1, 1, 6, 2), WORLD, RANK, load_balanced=True),
    }
    for name, make in checks.items():
        try:
            make()
            found[name] = None
        except ValueError as exc:
            found[name] = str(exc)
    return found


def full_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The one-process reference: softmax over the masked score matrix."""
    T = q.shape[2]
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    return F.softmax(scores, dim=-1) @ v


def ring_against_full(dtype_name: str) -> dict:
    """Ring attention against full causal attention, for several lengths, both layouts: this
    rank's rows of the output, its slice of the gradients of q, k, v, and the bytes sent."""
    dtype = DTYPES[dtype_name]
    cases = {}
    for seq_len in (8, 24, 32):
        for balanced in (False, True):
            g = torch.Generator().manual_seed(seq_len)
            B, H, D = 2, 3, 8
            q, k, v, w = (torch.randn(B, H, seq_len, D, generator=g, dtype=dtype) for _ in range(4))
            full = [t.clone().requires_grad_() for t in (q, k, v)]
            ref = full_causal_attention(*full)
            (ref * w).sum().backward()
            mine = [split_sequence(t, WORLD, RANK, balanced).requires_grad_() for t in (q, k, v)]
            counter, computed = ByteCounter(), []
            out = ring_attention(*mine, counter=counter, load_balanced=balanced, computed=computed)
            forward_bytes = counter.sent
            (out * split_sequence(w, WORLD, RANK, balanced)).sum().backward()
            pieces = [torch.empty_like(out) for _ in range(WORLD)]
            dist.all_gather(pieces, out.detach().contiguous())
            cases[f"T{seq_len}{'-balanced' if balanced else ''}"] = {
                "shape": [B, H, seq_len, D],
                "element_size": q.element_size(),
                "out": float((out - split_sequence(ref, WORLD, RANK, balanced)).abs().max()),
                "merged_out": float((merge_sequence(pieces, balanced) - ref).abs().max()),
                "grads": max(
                    float((m.grad - split_sequence(f.grad, WORLD, RANK, balanced)).abs().max())
                    for m, f in zip(mine, full)
                ),
                "forward_bytes": forward_bytes,
                "backward_bytes": counter.sent - forward_bytes,
                "messages": counter.messages,
                "computed": computed,
            }
    return cases


def main() -> None:
    launcher.join(limit(30))
    torch.set_num_threads(1)
    for dtype in DTYPES:
        launcher.record(RESULTS, OUT, RANK, f"tp-{dtype}", lambda d=dtype: tp_against_one_process(d))
        launcher.record(RESULTS, OUT, RANK, f"ring-{dtype}", lambda d=dtype: ring_against_full(d))
    launcher.record(RESULTS, OUT, RANK, "refusals", refusals)
    (OUT / f"rank{RANK}.json").write_text(json.dumps({**RESULTS, "finished": {"ok": True}}))
    os._exit(0)


if __name__ == "__main__":
    main()
