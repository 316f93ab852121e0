"""Lab 02's cross-check on real runs: two gloo processes train MiniGPT with Lab 01's DDP, the
ZeRO-1 optimizer and FSDP2; bytes and model states per rank must agree with the ZeRO model, and
every step with one process (logit drift <= 1e-5). One torchrun launch for all of it, and one more
for ``--sizes`` (when sharding pays: DDP and ZeRO-1/2/3 held against the model to the byte)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from minigpt.pages.lab02_crosscheck import fragment
from minigpt.parallel import proof
from tests import launcher
from tests.launcher import ROOT, free_port
from tests.limits import limit

RESULTS = ROOT / "lab" / "results"


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("lab02") / "lab02.json"
    torchrun = Path(sys.executable).parent / "torchrun"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [
            str(torchrun),
            "--nproc_per_node=2",
            "--master_addr=127.0.0.1",
            f"--master_port={free_port()}",
            "lab/02_crosscheck.py",
            "--steps",
            "3",
            "--report",
            str(out),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=limit(300),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text()), proc.stdout


def test_bytes_per_rank_agree_with_the_model(report):
    data, _ = report
    assert set(data["variants"]) == {"ddp", "zero1", "fsdp2"}
    psi = data["params"]
    for name, r in data["variants"].items():
        assert abs(r["bytes_relative_difference"]) < 0.01, name
        assert r["bytes_constant_over_steps"], name
    # N = 2: DDP's ring all-reduce and ZeRO-1's reduce-scatter + all-gather both send 4Ψ bytes;
    # ZeRO-1 adds the all-reduce of its usage marks (one byte per parameter tensor, as DDP's
    # find_unused_parameters) and of the squared norm for gradient clipping (4 bytes)
    from minigpt.train import TrainConfig, build_model

    tensors = len([p for p in build_model(TrainConfig()).parameters() if p.requires_grad])
    assert data["variants"]["ddp"]["bytes_sent_per_step"] == 4 * psi
    assert data["variants"]["zero1"]["bytes_sent_per_step"] == 4 * psi + tensors + 4
    fsdp = data["variants"]["fsdp2"]
    assert fsdp["bytes_sent_per_step"] == fsdp["prediction"]["bytes"]
    assert fsdp["prediction"]["padding_elements"] > 0  # 609 rows of the embedding, padded to 610


def test_model_states_agree_with_the_model(report):
    data, _ = report
    psi, n = data["params"], data["world_size"]
    for name, r in data["variants"].items():
        assert abs(r["model_states_relative_difference"]) < 1e-3, name
    # the shards really are 1/N: ZeRO-1's optimizer state, FSDP2's everything
    zero1 = data["variants"]["zero1"]["model_states_after_step"]
    assert zero1["optimizer"] == pytest.approx(8 * psi / n, rel=1e-3)
    assert zero1["parameters"] == 4 * psi and zero1["gradients"] == 4 * psi
    assert data["variants"]["fsdp2"]["model_states_after_step"]["total"] == pytest.approx(
        data["variants"]["ddp"]["model_states_after_step"]["total"] / n, rel=1e-3
    )
    # every rank measured the same bytes; model states differ only by uneven chunks: ZeRO-1's
    # chunks differ by one element, and FSDP2's last rank holds one row less of the 609-row
    # embedding's optimizer state (its weight shard is padded, Adam's m and v are not)
    for rank in data["per_rank"]:
        for name, (sent, states) in rank.items():
            assert sent == data["per_rank"][0][name][0], name
            assert states == pytest.approx(data["per_rank"][0][name][1], rel=1e-3), name


def test_every_step_matches_one_process(report):
    data, stdout = report
    assert data["criterion_pass"] is True and "check PASS" in stdout
    assert set(proof.REPORT_KEYS) <= set(data), sorted(data)
    for name, r in data["variants"].items():
        assert 0 <= r["step_drift"]["max"] <= 1e-5, name
    # the float64 ruler on ours (DDP, ZeRO-1): ZeRO-1's norm once summed float32 squares, 8.8e-8
    assert data["fp64_max_step_drift"] <= 1e-12, data["rulers_per_variant"]
    z = data["zero_redundancy"]  # PyTorch's ZeroRedundancyOptimizer, beside ours from the same weights
    assert z["without_clipping"]["bit_identical"] and z["with_clipping"]["max_difference"] <= 1e-6, z


def test_the_committed_measurement_and_its_tables():
    data = json.loads((RESULTS / "02-crosscheck-cpu.json").read_text())
    assert data["criterion_pass"] is True and data["world_size"] == 2 and data["backend"] == "gloo"
    for name, r in data["variants"].items():
        assert abs(r["bytes_relative_difference"]) < 0.01, name
    for lang in ("en", "es"):
        assert (RESULTS / f"02-crosscheck-cpu-{lang}.txt").read_text() == fragment(data, lang)


def test_zero1_in_a_world_of_one_is_adamw_and_refuses_a_partial_state_dict():
    """One process (no torchrun): the shard is everything, the step is AdamW's to the bit, the
    parameters and gradients are views of the flat buffers, and state_dict() is refused."""
    code = """
import torch
from minigpt.parallel import launch
from minigpt.parallel.zero1 import ZeroOneOptimizer
launch.init()
torch.manual_seed(0)
a, b = torch.nn.Linear(8, 4), torch.nn.Linear(8, 4)
b.load_state_dict(a.state_dict())
zero = ZeroOneOptimizer(a.parameters(), torch.optim.AdamW, lr=0.1, weight_decay=0.01)
plain = torch.optim.AdamW(b.parameters(), lr=0.1, weight_decay=0.01)
for step in range(3):
    x = torch.randn(5, 8)
    for model, opt in ((a, zero), (b, plain)):
        opt.zero_grad()
        model(x).square().sum().backward()
        opt.step()
assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
flat = zero.flat_params[0]
assert all(p.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr() for p in a.parameters())
assert zero.state_bytes() == 2 * 4 * sum(p.numel() for p in a.parameters())
try:
    zero.state_dict()
except RuntimeError as exc:
    assert "full_state()" in str(exc)
else:
    raise AssertionError("state_dict() should be refused")
print("ok")
"""
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=limit(120),
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


# --- when sharding pays (--sizes) ----------------------------------------------------------------


def expected_on_rank_0(n_embd: int) -> dict[str, dict]:
    """What rank 0 of 2 must send per step and hold (end of forward, after the step) for each stage at
    this width, from the ZeRO model's terms written out here: Ψ parameters of 4 + 4 + 8 bytes, AdamW's
    4-byte step counter per tensor it updates, FSDP2's rows padded to a multiple of 2. Rank 0 holds
    the first, longer half of everything, so its moments are the padded half too."""
    from dataclasses import replace

    from minigpt.fsdp.variants import fsdp2_unit_sizes
    from minigpt.train import TrainConfig, build_model
    from minigpt.zero import comm, memory

    model = build_model(replace(TrainConfig(), n_embd=n_embd))
    params = list(model.parameters())
    psi, tensors = sum(p.numel() for p in params), len(params)
    _, padded = fsdp2_unit_sizes(model, 2)
    psi_p, root_p = sum(padded), padded[0]
    ddp = memory.device_memory(psi, 2, 0, "fp32").device + 4 * tensors
    # ZeRO-1: weights and gradients whole; rank 0's chunk of each flat buffer (matrices, vectors) is
    # its first half, rounded up; one step counter per parameter that starts inside that half
    held = pieces = 0
    for group in ([p for p in params if p.dim() >= 2], [p for p in params if p.dim() < 2]):
        half = -(-sum(p.numel() for p in group) // 2)
        starts = [sum(q.numel() for q in group[:i]) for i in range(len(group))]
        held += half
        pieces += sum(start < half for start in starts)
    zero1 = 8 * psi + 8 * held + 4 * pieces
    # FSDP2: the shards (weights 2Ψp, gradients 2Ψp after backward), the moments of rank 0's half
    # (4Ψp), the counters; at the end of forward no gradient yet, and the gathered units beside
    shards_and_moments = 2 * psi_p + 4 * psi_p + 4 * tensors
    zero3_bytes = sum(
        c.bytes_sent for c in comm.unit_collectives(padded, 3, 2, 4, 4, [False] + [True] * (len(padded) - 1), False)
    )
    return {
        "ddp": {"bytes": 4 * psi, "end_of_forward": ddp, "after_step": ddp},
        "zero1": {"bytes": 4 * psi + tensors + 4, "end_of_forward": zero1, "after_step": zero1},
        "fsdp2-no-reshard": {
            "bytes": 4 * psi_p,  # each unit gathered once, reduce-scattered once: half of 2 x 4Ψp
            "end_of_forward": shards_and_moments + 4 * psi_p,  # every unit gathered
            "after_step": shards_and_moments + 2 * psi_p,
        },
        "fsdp2": {
            "bytes": zero3_bytes,  # the blocks gathered again in backward, the root not
            "end_of_forward": shards_and_moments + 4 * root_p,  # only the root stays gathered
            "after_step": shards_and_moments + 2 * psi_p,
        },
    }


@pytest.fixture(scope="module")
def sizes_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("lab02-sizes") / "sizes.json"
    args = ["lab/02_crosscheck.py", "--sizes", "96", "--steps", "3", "--report", str(out)]
    done = launcher.run_script(args, 2, limit(240))  # ranks forked as torchrun's would be
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text())


def test_sizes_every_stage_sends_and_holds_what_the_model_says(sizes_report):
    data = sizes_report
    assert list(data["sizes"]) == ["96"] and data["world_size"] == 2
    stages = data["sizes"]["96"]["stages"]
    assert {name: r["stage"] for name, r in stages.items()} == {"ddp": 0, "zero1": 1, "fsdp2-no-reshard": 2, "fsdp2": 3}
    for name, want in expected_on_rank_0(96).items():
        r = stages[name]
        assert r["bytes_sent_per_step"] == want["bytes"], name
        assert r["bytes_constant_over_steps"], name
        for point in ("end_of_forward", "after_step"):
            assert r["model_states"][point] == want[point], (name, point)
    # rank 1 holds the shorter halves: it is held against its own prediction, to the byte
    assert data["criterion_pass"] is True
    assert all(all(per_size.values()) for rank in data["exact_per_rank"] for per_size in rank.values())
    # what each stage shards, in the census by kind: ZeRO-2 holds every unit gathered at the end of
    # forward, ZeRO-3 only the root; both hold no gradient then, and only shards after the step
    kinds = {name: r["model_states_by_kind"] for name, r in stages.items()}
    assert kinds["fsdp2-no-reshard"]["end_of_forward"]["gathered"] > 4 * kinds["fsdp2"]["end_of_forward"]["gathered"]
    for name in ("fsdp2-no-reshard", "fsdp2"):
        assert kinds[name]["end_of_forward"]["gradients"] == 0 and kinds[name]["after_step"]["gathered"] == 0
    assert data["timed_steps"] == 1 and all(r["seconds_per_step"] > 0 for r in stages.values())
