"""Lab 03's options run (lab/03_fsdp_options.py, minigpt/fsdp/options.py) on two ranks: what FSDP1 and
FSDP2 hand the optimizer, counted here from MiniGPT's shapes; the dtypes PyTorch documents for autocast
and ``MixedPrecisionPolicy``; CPU offload refused on a CPU and its bytes counted from the shards; and the
page's tables and sentences, drawn from the committed run
(``torchrun --nproc_per_node=2 lab/03_fsdp_options.py --report lab/results/03-options-cpu.json``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from minigpt.model import GPTConfig, MiniGPT
from minigpt.pages import lab03_options as pages
from minigpt.zero import memory
from tests import launcher
from tests.limits import limit

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "lab" / "results"


def minigpt_counts(world: int = 2) -> dict:
    """What the rows must say, from MiniGPT's parameters alone."""
    model = MiniGPT(GPTConfig())
    params = list(model.parameters())
    blocks = [sum(p.numel() for p in b.parameters()) for b in model.blocks]
    root = sum(p.numel() for p in params) - sum(blocks)
    return {
        "parameters": len(params),
        "matrices": sum(p.dim() >= 2 for p in params),
        "elements": sum(p.numel() for p in params),
        # FSDP1: one flat parameter per unit (4 blocks and the root), each padded to a multiple of the world
        "fsdp1_rank0": sum(-(-n // world) for n in [*blocks, root]),
        # FSDP2: every parameter cut by rows, rank 0 gets the larger part
        "fsdp2_rank0": sum(-(-p.shape[0] // world) * (p.numel() // p.shape[0]) for p in params),
        "root_rank0": -(-root // world),
    }


def check(report: dict) -> None:
    counts = minigpt_counts(report["world_size"])
    rows = {r["wrapper"]: r for r in report["optimizer"]}
    one, flat, orig, fsdp2 = (rows[k] for k in pages.WRAPPERS_ES)
    assert (one["named_parameters"], one["decay_group"], one["state_numel_here"]) == (
        counts["parameters"],
        counts["matrices"],
        counts["elements"],
    )
    assert (flat["named_parameters"], flat["decay_group"], flat["state_tensors"]) == (5, 0, 5)
    assert flat["first"] == ["_fsdp_wrapped_module._flat_param", [counts["root_rank0"]]]
    assert flat["state_numel_here"] == counts["fsdp1_rank0"]
    assert "requires_grad=True and False" in flat["frozen_in_unit"]
    assert (orig["named_parameters"], orig["decay_group"], orig["frozen_in_unit"]) == (counts["parameters"], 0, "ok")
    assert len(orig["first"][1]) == 1 and orig["state_numel_here"] == counts["fsdp1_rank0"]
    assert orig["state_tensors"] < counts["parameters"]  # the empty pieces on rank 0 get no state
    assert (fsdp2["first_type"], fsdp2["state_type"], fsdp2["decay_group"]) == (
        "DTensor",
        "DTensor",
        counts["matrices"],
    )
    assert fsdp2["first"] == ["wte.weight", [-(-609 // report["world_size"]), 96]]
    assert fsdp2["state_numel_here"] == counts["fsdp2_rank0"]
    dtypes = {r["config"]: (r.get("input"), r.get("output"), r["reduce"], r["grad"]) for r in report["precedence"]}
    assert dtypes["fp32"] == ("float32", "float32", "float32", "float32")
    assert dtypes["policy bf16"] == ("bfloat16", "bfloat16", "bfloat16", "float32")  # reduce_dtype's default
    assert dtypes["policy bf16, reduce fp32"] == ("bfloat16", "bfloat16", "float32", "float32")
    assert dtypes["autocast bf16"] == ("float32", "bfloat16", "float32", "float32")
    assert dtypes["policy fp16 + autocast bf16"][:2] == ("float16", "bfloat16")  # autocast's dtype wins the matmul
    # the block's own policy wins for its parameters: block 0 computes and reduces in bf16, the root in fp32
    assert dtypes["root fp32, blocks bf16"] == ("bfloat16", "bfloat16", "bfloat16,float32", "float32")
    off = report["offload"]
    assert off["local_elements"] == counts["fsdp2_rank0"]
    assert (off["bytes_to_device_per_step"], off["device_bytes_saved"]) == (
        4 * off["local_elements"],
        16 * off["local_elements"],
    )
    if off["device"] == "cpu":
        assert off["tried"].startswith("RuntimeError"), off
    ck = report["checkpoint"]
    assert ck["step_seconds"] > 0 and ck["save_seconds"] > 0
    assert ck["checkpoint_bytes"] > 12 * counts["elements"]  # the weights and AdamW's two moments, in fp32
    ex = report["export"]
    assert "share memory" in ex["save_file"] and "wte.weight" in ex["save_file"]
    assert (ex["stored_tensors"], ex["state_dict_names"], len(ex["tied_stored_as"])) == (44, 45, 1)
    assert 4 * counts["elements"] < ex["file_bytes"] < 4 * counts["elements"] + 10_000  # the header: a few kB
    assert (ex["missing"], ex["unexpected"], ex["identical_logits"]) == ([], [], True)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("options")
    done = launcher.run_script(["lab/03_fsdp_options.py", "--report", str(out / "options.json")], 2, limit(180))
    return done, out


def test_two_ranks_measure_what_the_shapes_and_the_documentation_say(two_ranks):
    done, out = two_ranks
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    check(json.loads((out / "options.json").read_text()))
    for lang in ("en", "es"):
        for part in ("optimizer", "precedence", "offload", "checkpoint", "export"):
            assert "| --- |" in (out / f"03-options-{part}-{lang}.txt").read_text()


def test_the_page_shows_the_committed_run_and_its_sentences_hold():
    report = json.loads((RESULTS / "03-options-cpu.json").read_text())
    check(report)
    for lang in ("en", "es"):
        for part, text in pages.tables(report, lang).items():
            assert (RESULTS / f"03-options-{part}-{lang}.txt").read_text() == text, (part, lang)
    rows = {r["wrapper"]: r for r in report["optimizer"]}
    en = (ROOT / "lab" / "03-fsdp-prefetch.md").read_text(encoding="utf-8")
    es = (ROOT / "lab" / "03-fsdp-prefetch.es.md").read_text(encoding="utf-8")
    orig = rows["FSDP1, use_orig_params=True"]
    assert (
        f"state for {orig['state_tensors']} of the 44" in en and f"estado para {orig['state_tensors']} de los 44" in es
    )
    assert "253,776 elements, exactly half" in en and "253 776 elementos, justo la mitad" in es
    extra = rows["FSDP2"]["state_numel_here"] - rows["FSDP1, use_orig_params=False"]["state_numel_here"]
    assert f"{extra} elements more" in en and f"{extra} elementos más" in es
    assert report["offload"]["device_bytes_saved"] // 10**6 == 4  # "it would free 4 MB"
    ck = report["checkpoint"]
    tau, _ = memory.young_interval(ck["save_seconds"], 3600)  # "every few hundred steps, less than a minute apart"
    assert tau < 60 and 100 <= tau / ck["step_seconds"] < 1000, (tau, ck)
    _, lost = memory.young_interval(*pages.PAPER_SAVE)  # "loses a few percent of its time"
    assert 0.01 < lost < 0.1


def test_the_compiler_budget_run_on_the_page():
    """lab/03_compile_budget.py's committed run (compiling takes most of a minute, so the suite reads it):
    the forward pass's peak halves at 0.5 and falls to an eighth at 0, the step's peak is lowest at 0.5,
    and the page's table is the run rendered."""
    report = json.loads((RESULTS / "03-compile-budget-cpu.json").read_text())
    by = {r["budget"]: r for r in report["budgets"]}
    one, half, zero = by[1.0], by[0.5], by[0.0]
    assert 0.4 < half["forward_peak_bytes"] / one["forward_peak_bytes"] < 0.6
    assert 0.1 < zero["forward_peak_bytes"] / one["forward_peak_bytes"] < 0.15
    assert half["step_peak_bytes"] < min(one["step_peak_bytes"], zero["step_peak_bytes"])
    assert zero["step_peak_bytes"] > 0.9 * one["step_peak_bytes"] and zero["step_seconds"] > one["step_seconds"]
    assert all(15 < r["first_step_seconds"] < 30 for r in report["budgets"])  # "about 20 s each time"
    for lang in ("en", "es"):
        assert (RESULTS / f"03-compile-budget-cpu-{lang}.txt").read_text() == pages.budgets_table(report, lang)
