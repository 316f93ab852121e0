"""One rank of the course's own 3- and 4-rank checks of Lab 04's FSDP (no points):
``python tests/fsdp_ranks_worker.py OUTDIR`` under RANK/WORLD_SIZE, started by
tests/test_lab04_reference.py through tests/launcher.py.

Each scenario holds our FSDP (the reference's code) against PyTorch's FSDP2 on the same input with
the same units: on 3 ranks most of MiniGPT's tensors need padding (32 positions -> 33 rows, a
2-layer model, 48 sequences), and the model of odd parts (a frozen layer, a layer unused in
forward, a block called twice, a buffer) is not MiniGPT at all. Writes ``OUTDIR/rank<r>.json``.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from pathlib import Path

import torch
from torch.distributed.fsdp import fully_shard as fsdp2_shard

from minigpt import grammar
from minigpt.parallel import fsdp_by_hand as fsdp
from minigpt.train import TrainConfig, build_model
from tests import launcher
from tests.fsdp_scratch_worker import Odd, odd_batch
from tests.limits import limit

OUT = Path(sys.argv[1]) if __name__ == "__main__" else None
RANK, WORLD = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
RESULTS: dict[str, dict] = {}


def full_params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v) for k, v in model.state_dict().items()}


def minigpt_against_fsdp2() -> dict:
    """Two AdamW steps (no clipping) of a 2-layer MiniGPT, ours and FSDP2's, every rank its slice of
    48 sequences: the weights after each step must be the same bits."""
    cfg = TrainConfig(n_layer=2, batch_size=48, grad_clip=0.0)
    ours, theirs = build_model(cfg), build_model(cfg)
    for block in ours.blocks:
        fsdp.fully_shard(block)
    fsdp.fully_shard(ours)
    for block in theirs.blocks:
        fsdp2_shard(block)
    fsdp2_shard(theirs)
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (ours, theirs)]
    diffs, shapes = [], {}
    for step in range(2):
        x, y, mask = grammar.get_batch("train", step, cfg.batch_size, RANK, WORLD, seed=0, block_size=32)
        for model, opt in zip((ours, theirs), opts):
            model(x, y, mask)[1].backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        mine = fsdp.full_state_dict(ours)
        diffs.append(max(float((mine[k] - v).abs().max()) for k, v in full_params(theirs).items()))
    shapes = {n: list(p.shape) for n, p in ours.named_parameters() if n in ("wpe.weight", "wte.weight")}
    return {"diffs": diffs, "shard_shapes": shapes}


def odd_against_fsdp2_and_one_process() -> dict:
    """The model of odd parts, 2 SGD steps: ours against FSDP2 (the same bits expected) and
    against one process (the gradients summed over ranks in another order)."""
    torch.manual_seed(0)
    one = Odd()
    ours, theirs = copy.deepcopy(one), copy.deepcopy(one)
    for sub in ("frozen", "twice", "unused", "out"):
        fsdp.fully_shard(getattr(ours, sub))
        fsdp2_shard(getattr(theirs, sub))
    fsdp.fully_shard(ours)
    fsdp2_shard(theirs)
    models = (one, ours, theirs)
    opts = [torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=0.1, momentum=0.9) for m in models]
    for step in range(2):
        for r in range(WORLD):
            (one(odd_batch(step, r)) / WORLD).backward()
        ours(odd_batch(step, RANK)).backward()
        theirs(odd_batch(step, RANK)).backward()
        for opt in opts:
            opt.step()
            opt.zero_grad(set_to_none=True)
    mine = fsdp.full_state_dict(ours)
    return {
        "vs_fsdp2": max(float((mine[k] - v).abs().max()) for k, v in full_params(theirs).items()),
        "vs_one_process": max(float((mine[k] - v).abs().max()) for k, v in one.state_dict().items()),
    }


def main() -> None:
    launcher.join(limit(30))
    torch.set_num_threads(1)
    launcher.record(RESULTS, OUT, RANK, "minigpt", minigpt_against_fsdp2)
    launcher.record(RESULTS, OUT, RANK, "odd", odd_against_fsdp2_and_one_process)
    (OUT / f"rank{RANK}.json").write_text(json.dumps({**RESULTS, "finished": {"ok": True}}))
    os._exit(0)


if __name__ == "__main__":
    main()
