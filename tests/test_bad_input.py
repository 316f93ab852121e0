"""Bad input, the same answer everywhere: every entry point refuses a value that cannot work with
exit status 2, exactly one line on stderr that names the option (or variable) and the value, no
traceback, nothing written, and no process group started.

The table has one row per refusal. Most rows call the entry point's ``main(argv)`` in this process
(each refuses before any process group or model exists; a row that got further would reach a
trip-wire and fail). The rows about the launcher's environment run in one subprocess that sets
each row's variables in turn; a few rows run under a real ``torchrun`` of two ranks, where every
rank must say it, with its rank. Divergence (a loss that becomes nan) is not bad input, but its
one line is checked here too: under torchrun, on both ranks.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch.distributed as dist

from tests.launcher import ROOT
from tests.limits import limit

LAUNCHER = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
TORCHELASTIC = ("TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_RUN_ID")

TRAIN = "minigpt.train"
TUTOR = "minigpt.tutor"
DDP = "minigpt.runners.lab01_ddp"
BENCH = "minigpt.runners.lab01_benchmark"
LINKS = "minigpt.runners.lab01_links"
KERNELS = "minigpt.runners.lab01_kernel_sets"
DRIFT = "minigpt.runners.lab01_drift"
ZERO = "minigpt.runners.lab02_zero"
CROSS = "minigpt.runners.lab02_crosscheck"
READING = "minigpt.runners.lab03_fsdp_reading"
PREFETCH = "minigpt.runners.lab03_fsdp_prefetch"
PRACTICE = "minigpt.runners.lab03_fsdp_practice"
OPTIONS = "minigpt.runners.lab03_fsdp_options"
BUDGET = "minigpt.runners.lab03_compile_budget"
SCALING = "minigpt.runners.lab00_batch_scaling"
FSDP4 = "minigpt.runners.lab04_fsdp"
TP5 = "minigpt.runners.lab05_tensor_parallel"
RING5 = "minigpt.runners.lab05_ring_attention"
PIPE6 = "minigpt.runners.lab06_pipeline"
MESH6 = "minigpt.runners.lab06_mesh"
ND7 = "minigpt.runners.lab07_nd_parallel"
PAGES = "minigpt.pages.site"
GRADER = "minigpt.grader"

# (entry point, argv, what the line must name). {tmp} is this row's folder (the working directory
# too), {file} a file in it that is not JSON, where a folder or a results file is needed, and
# {tmp}/other.json a JSON file that is no script's result.
ROWS: list[tuple[str, list[str], list[str]]] = [
    # the single-process trainer: every TrainConfig field has its rule
    (TRAIN, ["--seed", "-1"], ["--seed -1", "0..4294967295"]),
    (TRAIN, ["--seed", "4294967296"], ["--seed 4294967296", "too large"]),
    (TRAIN, ["--seed", "abc"], ["--seed abc", "not an integer"]),
    (TRAIN, ["--lr", "nan"], ["--lr nan", "not a number"]),
    (TRAIN, ["--lr", "inf"], ["--lr inf", "not finite"]),
    (TRAIN, ["--lr", "0"], ["--lr 0", "positive"]),
    (TRAIN, ["--lr", "1e39"], ["--lr 1e+39", "float32"]),
    (TRAIN, ["--min-lr", "0.1"], ["--min-lr 0.1", "--lr 0.003"]),
    (TRAIN, ["--grad-clip", "nan"], ["--grad-clip nan", "not a number"]),
    (TRAIN, ["--grad-clip", "-1"], ["--grad-clip -1", "negative"]),
    (TRAIN, ["--weight-decay", "nan"], ["--weight-decay nan", "not a number"]),
    (TRAIN, ["--weight-decay", "inf"], ["--weight-decay inf", "not finite"]),
    (TRAIN, ["--momentum", "1"], ["--momentum 1", "[0, 1)"]),
    (TRAIN, ["--dropout", "-0.1"], ["--dropout -0.1", "negative"]),
    (TRAIN, ["--steps", "0"], ["--steps 0", "positive integer"]),
    (TRAIN, ["--batch-size", "2.5"], ["--batch-size 2.5", "not an integer"]),
    (TRAIN, ["--warmup", "-1"], ["--warmup -1", "negative"]),
    (TRAIN, ["--warmup", "450"], ["--warmup 450", "0..449"]),
    (TRAIN, ["--block-size", "10"], ["--block-size 10", "18"]),
    (TRAIN, ["--optimizer", "adam"], ["--optimizer adam", "adamw, sgd"]),
    (TRAIN, ["--stop-at", "0"], ["--stop-at 0"]),
    (TRAIN, ["--resume", "{tmp}/missing.pt"], ["--resume {tmp}/missing.pt", "no checkpoint"]),
    (TRAIN, ["--out", "{file}/x.pt"], ["--out {file}/x.pt", "is a file, not a folder"]),
    # the tutor
    (TUTOR, ["--checkpoint", "{tmp}/none.pt", "nosotros habla"], ["--checkpoint {tmp}/none.pt"]),
    (TUTOR, ["nosotros hablamos chino"], ["chino"]),
    # Lab 01
    (DDP, ["--seed", "-1"], ["--seed -1"]),
    (DDP, ["--bucket-cap-mb", "inf"], ["--bucket-cap-mb inf", "MiB"]),
    (DDP, ["--bucket-cap-mb", "0"], ["--bucket-cap-mb 0", "MiB"]),
    (DDP, ["--timeout", "inf"], ["--timeout inf", "seconds"]),
    (DDP, ["--timeout", "nan"], ["--timeout nan", "seconds"]),
    (DDP, ["--timeout", "-5"], ["--timeout -5", "seconds"]),
    (DDP, ["--lr", "nan"], ["--lr nan"]),
    (DDP, ["--grad-clip", "inf"], ["--grad-clip inf"]),
    (DDP, ["--test-sentences", "0"], ["--test-sentences 0"]),
    (DDP, ["--accum", "3"], ["--accum 3", "--batch-size 64"]),
    (DDP, ["--collective", "nccl"], ["--collective nccl", "torch, ring"]),
    (DDP, ["--report", "{file}/r.json"], ["--report {file}/r.json"]),
    (DDP, ["--device", "gpu"], ["--device gpu", "auto, cpu, cuda"]),
    (DDP, ["--trace", "{file}"], ["--trace {file}", "is a file; give a folder"]),
    (FSDP4, ["--trace", "{file}"], ["--trace {file}", "is a file; give a folder"]),
    (PREFETCH, ["--trace", "{file}"], ["--trace {file}", "is a file; give a folder"]),
    (BENCH, ["--device", "tpu"], ["--device tpu", "auto, cpu, cuda"]),
    (BENCH, ["--render", "{tmp}/missing.json"], ["--render {tmp}/missing.json", "no such file"]),
    (BENCH, ["--render", "{file}"], ["--render {file}", "not a JSON file"]),
    (BENCH, ["--steps", "0"], ["--steps 0"]),
    (BENCH, ["--warmup", "-1"], ["--warmup -1"]),
    (BENCH, ["--bucket-cap-mb", "nan"], ["--bucket-cap-mb nan"]),
    (BENCH, ["--parts", "minigpt,nope"], ["--parts minigpt,nope"]),
    (LINKS, ["--device", "tpu"], ["--device tpu", "auto, cpu, cuda"]),
    (OPTIONS, ["--device", "gpu"], ["--device gpu", "auto, cpu, cuda"]),
    (BUDGET, ["--render", "{file}"], ["--render {file}", "not a JSON file"]),
    (SCALING, ["--render", "{file}"], ["--render {file}", "not a JSON file"]),
    (SCALING, ["--report", "{file}/x.json"], ["--report {file}/x.json", "is a file, not a folder"]),
    (BUDGET, ["--report", "{file}/x.json"], ["--report {file}/x.json", "is a file, not a folder"]),
    (OPTIONS, ["--render", "{file}"], ["--render {file}", "not a JSON file"]),
    (OPTIONS, ["--report", "{file}/x.json"], ["--report {file}/x.json", "is a file, not a folder"]),
    (LINKS, ["--repeats", "0"], ["--repeats 0"]),
    (LINKS, ["--node-size", "0"], ["--node-size 0"]),
    (LINKS, ["--render", "{file}"], ["--render {file}", "not a JSON file"]),
    (KERNELS, ["--render", "{tmp}/missing.json"], ["--render {tmp}/missing.json", "no such file"]),
    (KERNELS, ["--render", "{tmp}/other.json"], ["--render {tmp}/other.json", "not a result of this script"]),
    (KERNELS, ["--timeout", "inf"], ["--timeout inf"]),
    (KERNELS, ["--kernel-sets", "avx9"], ["--kernel-sets", "avx9"]),
    (DRIFT, ["--sources", "999"], ["--sources 999", "0..449"]),
    (DRIFT, ["--sources", "abc"], ["--sources abc"]),
    (DRIFT, ["--out", "{file}"], ["--out {file}", "is a file"]),
    # Lab 02
    (ZERO, ["memory", "--params", "inf", "--dp", "4"], ["--params inf", "not finite"]),
    (ZERO, ["memory", "--params", "nan", "--dp", "4"], ["--params nan", "not a number"]),
    (ZERO, ["memory", "--params", "0", "--dp", "4"], ["--params 0"]),
    (ZERO, ["memory", "--params", "7B", "--dp", "4"], ["--params 7B", "not a number"]),
    (ZERO, ["memory", "--params", "1e9", "--dp", "4", "--largest-layer", "nan"], ["--largest-layer nan"]),
    (ZERO, ["memory", "--params", "1e9", "--dp", "4", "--largest-layer", "inf"], ["--largest-layer inf"]),
    (ZERO, ["memory", "--params", "1e9", "--dp", "0"], ["--dp 0"]),
    (ZERO, ["memory", "--params", "1e9", "--dp", "2.5"], ["--dp 2.5", "not an integer"]),
    (ZERO, ["memory", "--params", "1e9", "--dp", "8", "--nodes", "3"], ["--dp 8", "--nodes 3"]),
    (ZERO, ["memory", "--params", "1e9", "--dp", "4", "--stage", "7"], ["--stage 7"]),
    (ZERO, ["comm", "--params", "-1", "--dp", "4"], ["--params -1", "negative"]),
    (ZERO, ["simulate", "--workers", "0"], ["--workers 0"]),
    (ZERO, ["simulate", "--widths", "16,x"], ["--widths 16,x"]),
    (CROSS, ["--seed", "-1"], ["--seed -1"]),
    (CROSS, ["--timeout", "inf"], ["--timeout inf"]),
    (CROSS, ["--steps", "0"], ["--steps 0"]),
    (CROSS, ["--variants", "ddp,zero9"], ["--variants ddp,zero9", "zero9"]),
    (CROSS, ["--render", "{tmp}/missing.json"], ["--render {tmp}/missing.json", "no such file"]),
    (CROSS, ["--render", "{file}"], ["--render {file}", "not a JSON file"]),
    (CROSS, ["--sizes", "96,100"], ["--sizes 96,100", "unknown size '100'", "choose n_embd from 96, 192, 384"]),
    (CROSS, ["--sizes", "96", "--steps", "2"], ["--steps 2 with --sizes"]),
    # Lab 03
    (READING, ["--lang", "fr"], ["--lang fr", "en, es"]),
    (READING, ["--section", "fsdp3"], ["--section", "fsdp3"]),
    (READING, ["--markdown", "{file}/x.md"], ["--markdown {file}/x.md"]),
    (PREFETCH, ["--seed", "-1"], ["--seed -1"]),
    (PREFETCH, ["--timeout", "inf"], ["--timeout inf"]),
    (PREFETCH, ["--steps", "0"], ["--steps 0"]),
    (PREFETCH, ["--steps", "451"], ["--steps 451", "1..450"]),
    (PREFETCH, ["--variants", "fsdp9"], ["--variants fsdp9"]),
    (PREFETCH, ["--render", "{tmp}/missing.json"], ["--render {tmp}/missing.json", "no such file"]),
    (PREFETCH, ["--render", "{tmp}/other.json"], ["--render {tmp}/other.json", "not a result of this script"]),
    (PRACTICE, ["--seed", "-1"], ["--seed -1"]),
    (PRACTICE, ["--timeout", "nan"], ["--timeout nan"]),
    (PRACTICE, ["--steps", "1"], ["--steps 1"]),
    (PRACTICE, ["--batch-size", "0"], ["--batch-size 0"]),
    (PRACTICE, ["--only", "wrap,nope"], ["--only", "nope"]),
    (PRACTICE, ["--device", "mps"], ["--device mps", "auto, cpu, cuda"]),
    (PREFETCH, ["--device", "gpu"], ["--device gpu", "auto, cpu, cuda"]),
    (ND7, ["--device", "xla"], ["--device xla", "auto, cpu, cuda"]),
    (PRACTICE, ["--render", "{tmp}/missing.json"], ["--render {tmp}/missing.json", "no such file"]),
    # Lab 04
    (FSDP4, ["--seed", "-1"], ["--seed -1"]),
    (FSDP4, ["--timeout", "inf"], ["--timeout inf", "seconds"]),
    (FSDP4, ["--steps", "0"], ["--steps 0", "positive integer"]),
    (FSDP4, ["--rounds", "-1"], ["--rounds -1", "negative"]),
    (FSDP4, ["--fp64-steps", "x"], ["--fp64-steps x", "not an integer"]),
    # the proof's flags (minigpt/runners/entry.py), the same in every lab
    (DDP, ["--full"], ["--full", "add --check"]),
    (DDP, ["--check", "--fp64-steps", "5"], ["--fp64-steps 5", "at least 20"]),
    (DDP, ["--check", "--ddp-steps", "-1"], ["--ddp-steps -1", "negative"]),
    (FSDP4, ["--check", "--fsdp2-steps", "-2"], ["--fsdp2-steps -2", "negative"]),
    (FSDP4, ["--rounds", "3"], ["--rounds 3", "add --check"]),
    (TP5, ["--check", "--check-steps", "0"], ["--check-steps 0", "positive integer"]),
    (TP5, ["--full"], ["--full", "add --check"]),
    (RING5, ["--check", "--fp64-steps", "19"], ["--fp64-steps 19", "at least 20"]),
    (PIPE6, ["--check", "--check-steps", "1.5"], ["--check-steps 1.5", "not an integer"]),
    (MESH6, ["--full"], ["--full", "add --check"]),
    (CROSS, ["--fp64-steps", "2"], ["--fp64-steps 2", "at least 20"]),
    (FSDP4, ["--impl", "mine"], ["--impl mine", "reference, exercises"]),
    (FSDP4, ["--check"], ["--check", "2 ranks"]),
    (FSDP4, ["--report", "{file}/r.json"], ["--report {file}/r.json"]),
    (FSDP4, ["--render", "{tmp}/missing.json"], ["--render {tmp}/missing.json", "no such file"]),
    (FSDP4, ["--render", "{tmp}/other.json"], ["--render {tmp}/other.json", "not a result of this script"]),
    (TP5, ["--tp", "2"], ["--tp 2", "world size 1"]),
    (TP5, ["--dp", "2"], ["--dp 2", "world size is 1"]),
    (TP5, ["--steps", "0"], ["--steps 0", "positive integer"]),
    (TP5, ["--check"], ["--check", "2 ranks"]),
    (TP5, ["--impl", "mine"], ["--impl mine", "reference, exercises"]),
    (TP5, ["--report", "{file}/r.json"], ["--report {file}/r.json"]),
    (RING5, [], ["world size 1", "2 ranks"]),
    (RING5, ["--seq-lens", "0"], ["--seq-lens 0", "positive integer"]),
    (RING5, ["--seq-lens", "32", "31"], ["--seq-lens 31", "multiple of 2 x cp = 2"]),
    (PIPE6, ["--micro-batches", "3"], ["--micro-batches 3", "batch of 64", "divisor"]),
    (PIPE6, ["--bubble-micro-batches", "1", "48"], ["--bubble-micro-batches 48", "batch of 64"]),
    (PIPE6, ["--micro-batches", "0"], ["--micro-batches 0", "positive integer"]),
    (PIPE6, ["--schedule", "zb"], ["--schedule zb", "gpipe, 1f1b"]),
    (PIPE6, ["--check"], ["--check", "2 stages"]),
    (PIPE6, ["--impl", "mine"], ["--impl mine", "reference, exercises"]),
    (PIPE6, ["--report", "{file}/r.json"], ["--report {file}/r.json"]),
    (MESH6, [], ["--tp 2", "world size 1"]),
    (MESH6, ["--check"], ["--check", "world size 1"]),
    (MESH6, ["--shard", "2"], ["--shard 2", "world size 1"]),
    (MESH6, ["--replicate", "2", "--shard", "2"], ["--replicate 2 --shard 2", "world size is 1"]),
    (MESH6, ["--tp", "0"], ["--tp 0", "positive integer"]),
    (MESH6, ["--steps", "0"], ["--steps 0", "positive integer"]),
    (MESH6, ["--impl", "mine"], ["--impl mine", "reference, exercises"]),
    (MESH6, ["--report", "{file}/r.json"], ["--report {file}/r.json"]),
    (MESH6, ["--render", "{tmp}/missing.json"], ["--render {tmp}/missing.json", "no such file"]),
    (MESH6, ["--render", "{tmp}/other.json"], ["--render {tmp}/other.json", "not a result of this script"]),
    (ND7, [], ["dp_replicate 2 x dp_shard 2 x cp 1 x tp 2 = 8 ranks", "world size is 1"]),
    (ND7, ["--tp", "2"], ["give all four degrees or none", "--dp-replicate, --dp-shard, --cp missing"]),
    (ND7, ["--cp", "0"], ["--cp 0", "positive integer"]),
    (ND7, ["--full"], ["--full", "add --check"]),
    (ND7, ["--report", "{file}/r.json"], ["--report {file}/r.json"]),
    (ND7, ["--render", "{tmp}/other.json"], ["--render {tmp}/other.json", "not a result of this script"]),
    (PRACTICE, ["--render", "{tmp}/other.json"], ["--render {tmp}/other.json", "not a result of this script"]),
    (PRACTICE, ["--report", "{tmp}/r.txt"], ["--report {tmp}/r.txt", ".json"]),
    (PRACTICE, ["--report", "{file}/r.json"], ["--report {file}/r.json", "is a file"]),
    # the site's tables
    (PAGES, ["--tables-dir", "{file}"], ["--tables-dir {file}"]),
    (PAGES, ["--no-such-option"], ["--no-such-option"]),
    # the grader (make grade)
    (GRADER, ["--exercise", "9.9"], ["--exercise 9.9", "0.1", "all"]),
    (GRADER, ["--lab", "08"], ["--lab 08", "00"]),
    (GRADER, ["--lang", "fr"], ["--lang fr", "en or es"]),
    (GRADER, ["--lab", "01", "--exercise", "2.1"], ["--exercise 2.1", "--lab 01"]),
    (GRADER, ["--impl", "mine"], ["--impl mine", "reference"]),
]

# (entry point, argv, the launcher's variables, what the line must name): one subprocess runs them all
ENV_ROWS: list[tuple[str, list[str], dict[str, str], list[str]]] = [
    (DDP, [], {"RANK": "abc", "LOCAL_RANK": "0", "WORLD_SIZE": "2"}, ["RANK=abc", "not an integer"]),
    (DDP, [], {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "0"}, ["WORLD_SIZE=0"]),
    (DDP, [], {"RANK": "2", "LOCAL_RANK": "0", "WORLD_SIZE": "2"}, ["RANK=2", "0..1"]),
    (DDP, [], {"RANK": "0", "LOCAL_RANK": "-1", "WORLD_SIZE": "2"}, ["LOCAL_RANK=-1"]),
    (DDP, [], {"RANK": "0"}, ["RANK", "LOCAL_RANK, WORLD_SIZE missing"]),
    (DDP, ["--batch-size", "30"], {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "4"}, ["--batch-size 30", "4"]),
    (
        DDP,
        [],
        {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_PORT": "notaport"},
        ["MASTER_PORT=notaport", "1..65535"],
    ),
    (CROSS, [], {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "70000"}, ["MASTER_PORT=70000"]),
    (CROSS, [], {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": " "}, ["MASTER_ADDR"]),
    (CROSS, [], {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "3"}, ["WORLD_SIZE=3", "64"]),
    (PREFETCH, [], {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "3"}, ["WORLD_SIZE=3", "64"]),
    (PRACTICE, [], {"RANK": "x", "LOCAL_RANK": "0", "WORLD_SIZE": "2"}, ["RANK=x"]),
    (PRACTICE, [], {}, ["world size 1", "--nproc_per_node=2"]),
    (OPTIONS, [], {}, ["world size 1", "--nproc_per_node=2"]),
    (PRACTICE, ["--batch-size", "63"], {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2"}, ["--batch-size 63"]),
    (
        PRACTICE,
        ["--load-resharded", "{tmp}/checkpoints"],
        {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2"},
        ["--load-resharded {tmp}/checkpoints", "WORLD_SIZE=2"],
    ),
    (BENCH, ["--out", "{tmp}/out"], {}, ["world size 1", "--nproc_per_node=2"]),
    (BENCH, ["--out", "{tmp}/out"], {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "3"}, ["WORLD_SIZE=3", "64"]),
    (LINKS, ["--out", "{tmp}/out"], {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2"}, ["WORLD_SIZE=2", "two nodes"]),
    (LINKS, ["--out", "{tmp}/out"], {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "5"}, ["--node-size 2", "5 ranks"]),
    (TP5, [], {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "3"}, ["--tp 3", "4 attention heads"]),
    (TP5, ["--tp", "2", "--dp", "2"], {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2"}, ["--tp 2 x --dp 2", "2"]),
    (TP5, ["--tp", "1"], {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2"}, ["--dp 2", "Lab 06"]),
    (RING5, ["--seq-lens", "36"], {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "4"}, ["--seq-lens 36", "2 x cp = 8"]),
    (MESH6, ["--tp", "8"], {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "8"}, ["--tp 8", "4 attention heads"]),
    (MESH6, ["--shard", "3"], {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "4"}, ["--shard 3", "world size 4"]),
    (
        ND7,
        ["--dp-replicate", "1", "--dp-shard", "1", "--cp", "1", "--tp", "8"],
        {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "8"},
        ["--tp 8", "4 attention heads"],
    ),
    (
        ND7,
        ["--dp-replicate", "1", "--dp-shard", "2", "--cp", "3", "--tp", "1"],
        {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "6"},
        ["--cp 3", "2 x cp = 6"],
    ),
    (
        ND7,
        ["--dp-replicate", "1", "--dp-shard", "6", "--cp", "1", "--tp", "1"],
        {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "6"},
        ["dp_shard 6 = 6", "multiple of 6"],
    ),
    (
        ND7,
        ["--dp-replicate", "1", "--dp-shard", "4", "--cp", "1", "--tp", "2"],
        {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "1"},
        ["--tp 2", "1 ranks of a node"],
    ),
    (
        ND7,
        [],
        {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "2"},
        ["dp_shard 2 x cp 1 x tp 2 = 4 ranks per replica", "LOCAL_WORLD_SIZE"],
    ),
    (ND7, ["--pp", "3"], {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "8"}, ["--pp 3", "divisor of 8"]),
    (ND7, ["--pp", "8"], {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "8"}, ["--pp 8", "4 blocks"]),
    (
        ND7,
        ["--pp", "2", "--dp-replicate", "1", "--dp-shard", "2", "--cp", "1", "--tp", "2"],
        {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "8"},
        ["--pp 2", "--dp-shard 1 --cp 1"],
    ),
    (
        ND7,
        ["--pp", "2", "--micro-batches", "5"],
        {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "8"},
        ["--micro-batches 5", "64 / 2 rows"],
    ),
    (
        ND7,
        ["--pp", "2"],
        {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "1"},
        ["--tp 2", "1 ranks of a node"],
    ),
    (
        ND7,
        ["--pp", "2", "--dp-replicate", "3", "--dp-shard", "1", "--cp", "1", "--tp", "1"],
        {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "6"},
        ["--dp-replicate 3", "divisor of 64"],
    ),
    (ND7, ["--micro-batches", "4"], {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "8"}, ["--micro-batches 4", "--pp"]),
]

# the device decision (minigpt.parallel.launch.place): a request no machine here can meet, on any
# machine (CUDA_VISIBLE_DEVICES hides every GPU), and a MINIGPT_DEVICE that is no device
ENV_ROWS += [
    (DDP, ["--device", "cuda"], {"CUDA_VISIBLE_DEVICES": ""}, ["--device cuda", "GPU", "--device auto"]),
    (FSDP4, [], {"MINIGPT_DEVICE": "gpu"}, ["MINIGPT_DEVICE=gpu", "auto, cpu, cuda"]),
    (
        TP5,
        [],
        {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MINIGPT_DEVICE": "cuda", "CUDA_VISIBLE_DEVICES": ""},
        ["[rank 0] lab/05_tensor_parallel.py: error: MINIGPT_DEVICE cuda", "GPU"],
    ),
]

# run on each rank of one torchrun of two: every rank refuses, each with its rank
TORCHRUN_ROWS: list[tuple[str, list[str], list[str]]] = [
    (DDP, ["--seed", "-1"], ["--seed -1"]),
    (DDP, ["--report", "{file}/r.json"], ["--report {file}/r.json"]),  # rank 0 writes it; both check it
    (CROSS, ["--timeout", "inf"], ["--timeout inf"]),
    (PREFETCH, ["--trace-dir", "{file}"], ["--trace-dir {file}"]),
    (PRACTICE, ["--batch-size", "63"], ["--batch-size 63", "world size 2"]),
    (BENCH, ["--bucket-cap-mb", "inf"], ["--bucket-cap-mb inf"]),
    (DDP, ["--device", "gpu"], ["--device gpu", "auto, cpu, cuda"]),
    (FSDP4, ["--trace", "{file}"], ["--trace {file}", "is a file"]),
]


class Reached(Exception):
    """A trip-wire: the entry point went past its checks (into a process group, a model, work)."""


TRIP_WIRES = [
    ("minigpt.parallel.launch", "init"),
    ("minigpt.train", "build_model"),
    ("minigpt.runners.lab01_drift", "drift_sources"),
    ("minigpt.runners.lab01_drift", "one_step_amplification"),
    ("minigpt.kernel_sets", "native_capability"),
    ("minigpt.pages.site", "write_all"),
    ("minigpt.grader", "_grade"),
]


def set_trip_wires(patch) -> None:
    for module, name in TRIP_WIRES:

        def tripped(*args, _where=f"{module}.{name}", **kwargs):
            raise Reached(_where)

        patch(importlib.import_module(module), name, tripped)


def fill(items: list[str], tmp: Path) -> list[str]:
    return [x.format(tmp=tmp, file=tmp / "a-file") for x in items]


def call(module: str, argv: list[str]) -> tuple[int | str, str, str]:
    """``module.main(argv)`` here: (exit status, stdout, stderr); a tripped wire is the status."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            result = importlib.import_module(module).main(argv)
            code = 0 if result is None or isinstance(result, (dict, list)) else result
        except SystemExit as exc:
            code = exc.code
        except Reached as exc:
            code = f"accepted: reached {exc}"
    return code, out.getvalue(), err.getvalue()


def check_refusal(where: str, code, out: str, err: str, names: list[str]) -> None:
    lines = err.strip().splitlines()
    assert code == 2, f"{where}: exit {code}\n{err[-2000:]}"
    assert "Traceback" not in out + err, f"{where}: a traceback\n{err[-3000:]}"
    assert len(lines) == 1, f"{where}: {len(lines)} lines on stderr, not 1:\n{err[-2000:]}"
    assert ": error: " in lines[0], f"{where}: {lines[0]}"
    missing = [n for n in names if n not in lines[0]]
    assert not missing, f"{where}: the line does not name {missing}: {lines[0]}"


def clean_env(monkeypatch) -> None:
    for name in (*LAUNCHER, *TORCHELASTIC):
        monkeypatch.delenv(name, raising=False)


def row_id(row) -> str:
    module, argv = row[0], row[1]
    return f"{module.split('.')[-1]}:{' '.join(argv)}".replace("{tmp}/", "").replace("{file}", "FILE")


@pytest.fixture
def row_folder(tmp_path, monkeypatch) -> Path:
    """A folder, the working directory (where default outputs like out/ would go), with a file that
    is not JSON ("a-file", where a folder or a result belongs) and a JSON file no script wrote."""
    (tmp_path / "a-file").write_text("a file, not a folder\n")
    (tmp_path / "other.json").write_text('{"a": 1}\n')
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("row", ROWS, ids=[row_id(r) for r in ROWS])
def test_bad_input_is_refused_in_one_line(row, row_folder, monkeypatch):
    module, argv, names = row
    clean_env(monkeypatch)
    set_trip_wires(monkeypatch.setattr)
    before = sorted(row_folder.rglob("*"))
    code, out, err = call(module, fill(argv, row_folder))
    check_refusal(row_id(row), code, out, err, fill(names, row_folder))
    assert out == "", f"{row_id(row)}: printed before refusing:\n{out[-2000:]}"
    assert sorted(row_folder.rglob("*")) == before, f"{row_id(row)}: left files behind"
    assert not dist.is_initialized(), f"{row_id(row)}: started a process group"


def test_the_table_covers_every_entry_point():
    rows = ROWS + [(m, a, n) for m, a, _, n in ENV_ROWS] + TORCHRUN_ROWS
    assert len(rows) >= 60
    assert {m for m, _, _ in rows} == {TRAIN, TUTOR, DDP, BENCH, LINKS, KERNELS, DRIFT, ZERO, CROSS, READING}.union(
        {PREFETCH, PRACTICE, OPTIONS, BUDGET, SCALING, FSDP4, TP5, RING5, PIPE6, MESH6, ND7, PAGES, GRADER}
    )


# ----------------------------------------------------------------------------------------------
# Subprocesses: the launcher's environment, and torchrun


def drive(rows_file: str, results: str) -> None:
    """In a subprocess (plain python, or each rank of a torchrun): run every row of ``rows_file``
    (entry point, argv, extra environment, folder) and write what each answered to
    ``results/rank<r>.json``."""
    from minigpt import cli

    cli.PEERS_GRACE_S = 0.0  # no other rank waits to print here: each row's refusal returns at once
    set_trip_wires(setattr)
    rank = os.environ.get("RANK", "0") if "TORCHELASTIC_RUN_ID" in os.environ else "0"
    base = dict(os.environ)
    answers = []
    for module, argv, env, folder in json.loads(Path(rows_file).read_text()):
        os.environ.clear()
        os.environ.update(base)
        for name in LAUNCHER if env is not None else ():
            os.environ.pop(name, None)
        os.environ.update(env or {})
        os.chdir(folder)
        before = sorted(str(p) for p in Path(folder).rglob("*"))
        code, out, err = call(module, argv)
        after = sorted(str(p) for p in Path(folder).rglob("*"))
        answers.append({"code": code, "out": out, "err": err, "written": sorted(set(after) - set(before))})
    os.environ.clear()
    os.environ.update(base)
    Path(results, f"rank{rank}.json").write_text(json.dumps(answers))


def folders(tmp_path: Path, n: int) -> list[Path]:
    made = []
    for i in range(n):
        folder = tmp_path / f"row{i}"
        folder.mkdir(parents=True)
        (folder / "a-file").write_text("a file, not a folder\n")
        made.append(folder)
    return made


def python_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (*LAUNCHER, *TORCHELASTIC)}
    return {**env, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


DRIVER = [sys.executable, "-c", "import sys; from tests.test_bad_input import drive; drive(*sys.argv[1:])"]


@pytest.mark.timeout(120)
def test_the_launchers_environment_is_checked_before_any_process_group(tmp_path):
    places = folders(tmp_path / "rows", len(ENV_ROWS))
    rows = [(m, fill(a, f), env, str(f)) for (m, a, env, _), f in zip(ENV_ROWS, places)]
    (tmp_path / "rows.json").write_text(json.dumps(rows))
    proc = subprocess.run(
        [*DRIVER, str(tmp_path / "rows.json"), str(tmp_path)],
        cwd=ROOT,
        env=python_env(),
        capture_output=True,
        text=True,
        timeout=limit(100),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    answers = json.loads((tmp_path / "rank0.json").read_text())
    assert len(answers) == len(ENV_ROWS)
    for (module, argv, env, names), folder, answer in zip(ENV_ROWS, places, answers):
        where = f"{module} {' '.join(argv)} with {env}"
        check_refusal(where, answer["code"], answer["out"], answer["err"], fill(names, folder))
        assert answer["written"] == [], f"{where}: wrote {answer['written']}"


def torchrun(args: list[str], logs: Path, timeout_s: float, nproc: int = 2) -> tuple[subprocess.CompletedProcess, dict]:
    """``torchrun --standalone --nproc_per_node=2 ARGS`` with each rank's stderr in its own file:
    (the process, {rank: that rank's stderr}). torchrun's own report goes to the process's stderr."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={nproc}",
            "--log-dir",
            str(logs),
            "--redirects",
            "3",
            *args,
        ],
        cwd=ROOT,
        env=python_env(),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    ranks = {int(p.parent.name): p.read_text() for p in logs.rglob("stderr.log")}
    return proc, ranks


@pytest.mark.timeout(120)
def test_under_torchrun_every_rank_refuses_with_its_rank(tmp_path):
    """One torchrun of two ranks runs every row of TORCHRUN_ROWS on each rank (in-process): the
    launcher's real environment, and each rank's own line."""
    places = folders(tmp_path / "rows", len(TORCHRUN_ROWS))
    rows = [(m, fill(a, f), None, str(f)) for (m, a, _), f in zip(TORCHRUN_ROWS, places)]
    (tmp_path / "rows.json").write_text(json.dumps(rows))
    proc, _ = torchrun(
        ["-m", "tests.test_bad_input", str(tmp_path / "rows.json"), str(tmp_path)], tmp_path / "logs", limit(100)
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in (0, 1):
        answers = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert len(answers) == len(TORCHRUN_ROWS)
        for (module, argv, names), folder, answer in zip(TORCHRUN_ROWS, places, answers):
            where = f"rank {rank}: {module} {' '.join(argv)}"
            check_refusal(where, answer["code"], answer["out"], answer["err"], fill(names, folder))
            assert answer["err"].startswith(f"[rank {rank}] "), f"{where}: {answer['err']}"
            assert answer["written"] == [], f"{where}: wrote {answer['written']}"


@pytest.mark.timeout(120)
def test_a_real_torchrun_shows_every_ranks_line(tmp_path):
    """The script itself under torchrun: a refusing rank makes torchrun stop the others, and still
    every rank prints its line first. The path is rank 0's to write, and both ranks check it.
    torchrun's failure report (its box) ends with our line as the root cause, not with its empty
    'To enable traceback see: ...'."""
    (tmp_path / "a-file").write_text("a file, not a folder\n")
    report = tmp_path / "a-file" / "r.json"
    proc, ranks = torchrun(["lab/01_ddp.py", "--report", str(report)], tmp_path / "logs", limit(100))
    assert proc.returncode != 0
    assert sorted(ranks) == [0, 1], proc.stderr[-3000:]
    ours = f"lab/01_ddp.py: error: --report {report}: {report.parent} is a file, not a folder"
    for rank, err in ranks.items():
        check_refusal(f"rank {rank}", 2, "", err, [f"[rank {rank}] {ours}"])
    lines = [line.strip() for line in proc.stderr.splitlines() if line.strip().strip("=")]
    assert lines[-1].startswith("traceback : [rank ") and lines[-1].endswith(ours), lines[-12:]
    assert "Root Cause" in "\n".join(lines[-10:])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "logs"]


def torchrun_worker(monkeypatch, tmp_path: Path, local_rank: int, local_world: int) -> Path:
    """This process as worker ``local_rank`` of a torchrun of ``local_world`` on this machine: the
    error file torchrun would give it (``<log dir>/<run id>/attempt_0/<k>/error.json``)."""
    attempt = tmp_path / "run" / "attempt_0"
    for k in range(local_world):
        (attempt / str(k)).mkdir(parents=True, exist_ok=True)
    for name, value in {"RANK": local_rank, "LOCAL_RANK": local_rank, "WORLD_SIZE": local_world}.items():
        monkeypatch.setenv(name, str(value))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local_world))
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(attempt / str(local_rank) / "error.json"))
    monkeypatch.delenv("MINIGPT_TIME_SCALE", raising=False)
    return attempt


@pytest.mark.timeout(60)
def test_a_refusing_rank_waits_for_its_slower_peers_to_say_it_too(monkeypatch, tmp_path, capsys):
    """torchrun stops every worker once one exits: rank 0 refuses and returns only once rank 1 (still
    starting, here a thread that refuses 1 s later) has written its own error file, well before the
    grace; with a peer that never refuses (it waits in a collective), after the grace."""
    import threading

    from minigpt import cli

    attempt = torchrun_worker(monkeypatch, tmp_path, 0, 2)
    monkeypatch.setattr(cli, "PEERS_GRACE_S", 30.0)
    peer_wrote = threading.Event()

    def slower_peer():
        time.sleep(1.0)  # a second behind rank 0
        (attempt / "1" / "error.json").write_text("{}")
        peer_wrote.set()

    threading.Thread(target=slower_peer, daemon=True).start()
    started = time.monotonic()
    assert cli.refuse("lab/01_ddp.py", "--steps 0: zero; give a positive integer") == 2
    assert peer_wrote.is_set(), "rank 0 returned before rank 1 had said it"
    assert time.monotonic() - started < cli.PEERS_GRACE_S / 2, "rank 0 waited out the grace, not for rank 1"
    assert capsys.readouterr().err == "[rank 0] lab/01_ddp.py: error: --steps 0: zero; give a positive integer\n"
    assert json.loads((attempt / "0" / "error.json").read_text())["message"]["message"].startswith("[rank 0] ")

    # a peer that never refuses: the grace bounds the wait (without it, the test's time limit ends it)
    silent = torchrun_worker(monkeypatch, tmp_path / "silent", 1, 3)
    monkeypatch.setattr(cli, "PEERS_GRACE_S", 0.2)
    (silent / "0" / "error.json").write_text("{}")
    assert cli.refuse("lab/01_ddp.py", "--steps 0: zero; give a positive integer") == 2
    assert (silent / "1" / "error.json").exists()

    # peers on another machine too (4 ranks, 2 here): every local file at once is not enough, it waits
    # REMOTE_PEERS_S for the ones it cannot see
    here = torchrun_worker(monkeypatch, tmp_path / "two-nodes", 0, 2)
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setattr(cli, "PEERS_GRACE_S", 30.0)
    monkeypatch.setattr(cli, "REMOTE_PEERS_S", 0.5)
    (here / "1" / "error.json").write_text("{}")
    started = time.monotonic()
    assert cli.refuse("lab/01_ddp.py", "--steps 0: zero; give a positive integer") == 2
    assert 0.5 <= time.monotonic() - started < 15, "a rank with remote peers waits REMOTE_PEERS_S, not the grace"


@pytest.mark.timeout(180)
def test_divergence_ends_every_rank_in_one_line(tmp_path):
    """A learning rate that makes the loss nan: both ranks stop at the same step, each with one line
    naming the step, the value and the setting to look at; no traceback."""
    args = ["--lr", "1e6", "--steps", "20", "--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--warmup", "1"]
    proc, ranks = torchrun(["lab/01_ddp.py", *args, "--batch-size", "16", "--quiet"], tmp_path / "logs", limit(150))
    assert proc.returncode != 0
    assert sorted(ranks) == [0, 1], proc.stderr[-3000:]
    for rank, err in ranks.items():
        lines = err.strip().splitlines()
        assert "Traceback" not in err and len(lines) == 1, err[-3000:]
        assert lines[0].startswith(f"[rank {rank}] lab/01_ddp.py: error: step 1: the loss is nan: training diverged")
        assert "look at --lr 1e+06" in lines[0], lines[0]


def test_the_trainers_divergence_names_the_weight_decay(tmp_path):
    """Not always the learning rate: a weight decay that multiplies the weights by -29 each step."""
    tiny = ["--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--batch-size", "8", "--warmup", "1", "--quiet"]
    out = tmp_path / "x.pt"
    code, _, err = call("minigpt.train", [*tiny, "--steps", "30", "--weight-decay", "1e4", "--out", str(out)])
    assert code == 1 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "the loss is nan: training diverged" in err and "look at --weight-decay 10000" in err, err
    assert "1 - lr x weight decay = -29" in err, err


if __name__ == "__main__":  # each rank of the torchrun above
    drive(*sys.argv[1:])
