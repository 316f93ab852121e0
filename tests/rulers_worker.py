"""One rank of the rulers' launch: ``python tests/rulers_worker.py OUTDIR`` under RANK/WORLD_SIZE
(started by tests/test_kernel_sets.py, two ranks, once per kernel set).

It measures the proof harness's rulers (:mod:`minigpt.parallel.proof`) on a few steps of every lab's
distributed MiniGPT, in one process per rank (importing torch is the slow part): the first step
against one process (float32), the step drift of a short float64 run, and the step drift of a short
float32 run. The systems are the ones each lab's ``--check`` builds: Lab 01's DDP, Lab 02's ZeRO-1,
Lab 04's FSDP, Lab 05's tensor (with and without sequence) and context parallelism, Lab 06's
pipeline. Lab 06's meshes need four ranks for their two dimensions (on two, HSDP is FSDP2 and DP x
TP is Lab 05's TP): their kernel sets are ``make kernel-sets``. Writes ``OUTDIR/rank<r>.json`` after
every lab.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from minigpt.parallel import launch, proof
from minigpt.train import TrainConfig
from tests import launcher

OUT = Path(sys.argv[1]) if __name__ == "__main__" else None
RANK = int(os.environ.get("RANK", 0))
RESULTS: dict[str, dict] = {}
FP64_STEPS, FP32_STEPS = 2, 3  # the first steps, where AdamW amplifies most; the labs' own checks run 20 and more
# the short schedule: AdamW's first steps, where it amplifies most, at the peak learning rate
CFG = TrainConfig(steps=12, warmup=4)


def systems(ctx) -> dict:
    """Each lab's system builder (a function of the TrainConfig) and its family."""
    from minigpt.runners import (
        lab01_ddp,
        lab02_crosscheck,
        lab04_fsdp,
        lab05_ring_attention,
        lab05_tensor_parallel,
        lab06_pipeline,
    )

    ddp_args = lab01_ddp.parse_args([])
    return {
        "01 DDP": (lambda c: lab01_ddp.DDPSystem("bucketed", c, ddp_args, ctx), proof.DATA_PARALLEL),
        "02 ZeRO-1": (lambda c: lab02_crosscheck.CrossSystem("zero1", c, ctx), proof.DATA_PARALLEL),
        "04 FSDP": (lambda c: lab04_fsdp.FSDPSystem(c, ctx), proof.DATA_PARALLEL),
        "05 TP": (lambda c: lab05_tensor_parallel.TPSystem(c, False), proof.MODEL_PARALLEL),
        "05 TP + SP": (lambda c: lab05_tensor_parallel.TPSystem(c, True), proof.MODEL_PARALLEL),
        "05 CP": (lambda c: lab05_ring_attention.CPSystem(c), proof.MODEL_PARALLEL),
        "06 pipeline": (lambda c: lab06_pipeline.Pipeline(c, ctx, "1f1b", 4), proof.DATA_PARALLEL),
    }


def rulers(build, family: str, ctx) -> dict:
    check = proof.Proof(family, twin_norm="run")
    check.first_step(build, CFG, ctx)
    check.float64(build, CFG, ctx, FP64_STEPS)
    check.float32(proof.run_with_twin(build(CFG), CFG, ctx, twin_norm="run", steps=FP32_STEPS))
    return {**check.report, "cpu_capability": torch.backends.cpu.get_cpu_capability()}


def main() -> None:
    ctx = launch.init(launch.DEFAULT_TIMEOUT_S)
    for name, (build, family) in systems(ctx).items():
        launcher.record(RESULTS, OUT, RANK, name, lambda build=build, family=family: rulers(build, family, ctx))
    launch.teardown()


if __name__ == "__main__":
    main()
