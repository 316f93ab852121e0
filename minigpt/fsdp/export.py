"""Export: a sharded (DCP) checkpoint consolidated into one ``torch.save`` file.

A DCP checkpoint is a folder: one file per saving rank and a ``.metadata`` index that says
which piece of which tensor lies where. To hand the model to someone who runs it in one process
(an inference server, a colleague's notebook, a model hub) it is turned into one ordinary file:
``torch.distributed.checkpoint.format_utils.dcp_to_torch_save`` reads every piece of every tensor
(no process group needed) and writes the whole state dict with ``torch.save``. That file holds
plain tensors, nested as they were saved (here ``{"model": ..., "optimizer": ...}``), and loads
into a plain MiniGPT with ``load_state_dict``.

:func:`consolidate` does it in a world of one (the second half of the checkpoint demonstration)
and checks the result: the consolidated model's logits against those of the run that saved.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from minigpt.fsdp.practice import probe_logits
from minigpt.parallel import equivalence
from minigpt.train import TrainConfig, build_model

CONSOLIDATED_FILE = "consolidated.pt"  # written beside the checkpoint's other files


def consolidate(cfg: TrainConfig, dcp_folder: Path, saved_logits: torch.Tensor, dest: Path) -> dict:
    """``dcp_folder`` -> ``dest`` (one file); load its ``model`` into a plain MiniGPT built from
    other weights (``cfg.seed + 1``) and compare its logits with ``saved_logits``."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(dcp_folder, dest)
    state = torch.load(dest, weights_only=True)
    plain = build_model(replace(cfg, seed=cfg.seed + 1))
    plain.load_state_dict(state["model"])  # strict: every key of the model, no other
    logits = probe_logits(plain, equivalence.probe_batch(block_size=cfg.block_size))
    return {
        "file": dest.name,
        "bytes": dest.stat().st_size,
        "top_level": sorted(state),
        "model_tensors": len(state["model"]),
        "max_logit_difference": float((logits - saved_logits).abs().max()),
        "identical_logits": bool(torch.equal(logits, saved_logits)),
    }
