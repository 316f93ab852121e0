"""The Lab 07 guide shows measured tables and makes a few claims; each is tied here to the committed run
(lab/results/07-nd-parallel-cpu.json, written by ``make results-07``) and to numbers worked out in this
file: the groups from the coordinates, each dimension's bytes from the shapes of a MiniGPT-shaped model
(MiniGPT itself, and the 8B-class model of the page's table of other frameworks' configurations)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from minigpt.model import GPTConfig
from minigpt.pages import lab07
from minigpt.pages.lang import num, sci
from minigpt.train import TrainConfig

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "lab" / "results"
REPORT = "07-nd-parallel-cpu.json"
FOUR_D = "07-nd-parallel-4d-cpu.json"  # every degree 2, 16 ranks (make results-07)
PIPELINE = "07-nd-parallel-pp-cpu.json"  # --pp 2: pp 2 x dp 2 x tp 2 on 8 ranks (make results-07)
PAGES = {"en": ROOT / "lab" / "07-nd-parallel.md", "es": ROOT / "lab" / "07-nd-parallel.es.md"}
LAYOUTS = {"2 x 2 x 1 x 2": (2, 2, 1, 2), "1 x 2 x 2 x 2": (1, 2, 2, 2)}


def load() -> dict:
    return json.loads((RESULTS / REPORT).read_text())


def bytes_by_hand(model: dict, layout: tuple[int, int, int, int], batch: int) -> dict[str, int]:
    """One rank's float32 bytes per step along each dimension, for GPT-2 blocks of width E, depth L,
    H heads, a vocabulary V (padded to a multiple of tp) and sequences of N tokens."""
    R, S, C, T = layout
    E, L, H, V, N = (model[k] for k in ("n_embd", "n_layer", "n_head", "vocab", "block_size"))
    ring = lambda n: 2 * (n - 1) / n  # noqa: E731 - an all-reduce's factor
    rows, tokens = batch // (R * S), N // C
    # tp: four all-reduces of (rows, tokens, E) per block, the embedding's and the output layer's, the
    # loss's three numbers per token, the clipping norm's one number
    tp = ((4 * L + 2) * rows * tokens * E * 4 + 3 * rows * tokens * 4 + 4) * ring(T)
    # cp: every layer's K and V of this rank's H/T heads, the whole row but its own chunks, both ways
    cp = 2 * L * (C - 1) / C * 2 * rows * (H // T) * N * (E // H) * 4
    # FSDP over S x C: the TP-local units, each tensor's rows padded to a multiple of S x C
    n = S * C
    root = [(math.ceil(V / T), E), (N, E), (E,), (E,)]
    block = [
        (E,),
        (E,),
        (3 * E // T, E),
        (E, E // T),
        (E,),
        (E,),
        (4 * E // T, E),
        (4 * E // T,),
        (E, 4 * E // T),
        (E,),
    ]
    units = [root] + [block] * L
    padded = [sum(math.ceil(s[0] / n) * n * math.prod(s[1:]) for s in unit) for unit in units]
    gathers = [1] + [2] * L  # the root kept gathered for backward
    shard = sum(4 * size * (g + 1) * (n - 1) / n for size, g in zip(padded, gathers))
    # the norm's squares, one float32 per tensor, all-reduced: each of the ring's two passes sends
    # (n-1)/n of the buffer, in whole bytes
    shard += 2 * (4 * sum(len(u) for u in units) * (n - 1) // n)
    replicate = sum(4 * size / n * ring(R) for size in padded)
    return {"tp": round(tp), "cp": round(cp), "dp_shard_cp": round(shard), "dp_replicate": round(replicate)}


def minigpt_shape() -> dict:
    c = GPTConfig()
    return {
        "n_embd": c.n_embd,
        "n_layer": c.n_layer,
        "n_head": c.n_head,
        "vocab": c.vocab_size,
        "block_size": c.block_size,
    }


def test_the_run_proves_what_the_page_says():
    r = load()
    assert r["criterion_pass"] and r["world_size"] == 8 and list(r["layouts"]) == list(LAYOUTS)
    for name, layout in LAYOUTS.items():
        found = r["layouts"][name]
        want = bytes_by_hand(minigpt_shape(), layout, TrainConfig().batch_size)
        assert found["bytes_per_dim"] == found["bytes_model_per_dim"] == want, (name, found["bytes_per_dim"], want)
        assert found["whole_from_pieces"] == {"parameters": 44, "bit_identical_every_rank": True}
        memory = found["memory_per_rank"]
        assert set(memory["every_rank"]) == {memory["model"]} == {memory["measured"]}
        assert found["ranks_bit_identical"] and found["bytes_constant_over_steps"]
        assert found["rulers"]["pytorch_first_step_grad_diff"] <= found["rulers"]["pytorch_one_step_bound"]
    grads = [sci(r["layouts"][n]["rulers"]["pytorch_first_step_grad_diff"], "en") for n in LAYOUTS]
    prose = (ROOT / "lab" / "07-nd-parallel.md").read_text(encoding="utf-8")
    assert f"{grads[0]} and {grads[1]}. The bytes are not compared" in prose


def test_every_degree_above_one_holds_on_sixteen_ranks():
    """Section 3, "Every degree above 1": 2 x 2 x 2 x 2 on 16 ranks, every byte count the one worked out
    here, every ruler passing; the page quotes its seconds and its memory."""
    r = json.loads((RESULTS / FOUR_D).read_text())
    assert r["criterion_pass"] and r["world_size"] == 16 and r["broken_rulers"] == []
    found = r["layouts"]["2 x 2 x 2 x 2"]
    want = bytes_by_hand(minigpt_shape(), (2, 2, 2, 2), TrainConfig().batch_size)
    assert found["bytes_per_dim"] == found["bytes_model_per_dim"] == want
    assert found["whole_from_pieces"] == {"parameters": 44, "bit_identical_every_rank": True}
    en = (ROOT / "lab" / "07-nd-parallel.md").read_text(encoding="utf-8")
    es = (ROOT / "lab" / "07-nd-parallel.es.md").read_text(encoding="utf-8")
    seconds, gb = round(r["seconds"]), r["peak_rss_kb"] / 1e6  # kB as the page counts them: 1,000 bytes
    assert f"It took {seconds} s and {gb:.1f} GB here" in en
    assert f"Tardó {seconds} s y {gb:.1f} GB aquí".replace(".", ",") in es


def test_the_byte_model_of_the_examples_is_the_count_by_hand():
    """The page's table of other frameworks' configurations: the lab's model (the function that equals
    the measured bytes) against the count worked out here, for MiniGPT and for the 8B-class model."""
    r = load()
    for name, layout in LAYOUTS.items():
        degrees = dict(zip(("dp_replicate", "dp_shard", "cp", "tp"), layout))
        assert (
            lab07.example_bytes(minigpt_shape(), degrees, TrainConfig().batch_size)
            == r["layouts"][name]["bytes_model_per_dim"]
        )
    for _, _, degrees, batch in lab07.EXAMPLES:
        layout = tuple(degrees[d] for d in ("dp_replicate", "dp_shard", "cp", "tp"))
        assert lab07.example_bytes(lab07.EIGHT_B, degrees, batch) == bytes_by_hand(lab07.EIGHT_B, layout, batch)


def test_every_accelerate_configuration_on_the_page_is_one_accelerate_accepts():
    """Each ``ParallelismConfig(...)`` of the examples' table, read back from its text, passes
    Accelerate's rules (``resolve_accelerate``) on as many processes as its degrees multiply to, and
    gives the table's degrees."""
    import re

    from minigpt.parallel.mesh import resolve_accelerate

    seen = 0
    for _, settings, degrees, _ in lab07.EXAMPLES:
        if settings.startswith("ParallelismConfig("):
            given = {k.removesuffix("_size"): int(v) for k, v in re.findall(r"(\w+)=(\d+)", settings)}
            found = resolve_accelerate(math.prod(degrees.values()), **given)
            assert {d: found[d] for d in degrees} == degrees, settings
            seen += 1
    assert seen == 2


def test_the_figure_s_groups_are_the_coordinates():
    r = load()
    first, second = r["layouts"]["2 x 2 x 1 x 2"]["groups"], r["layouts"]["1 x 2 x 2 x 2"]["groups"]
    assert first["tp"] == [[0, 1], [2, 3], [4, 5], [6, 7]] and first["dp_replicate"] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert second["cp"] == [[0, 2], [1, 3], [4, 6], [5, 7]] and second["dp_shard_cp"] == [[0, 2, 4, 6], [1, 3, 5, 7]]


def test_the_pipeline_dimension_holds_and_the_page_counts_its_bytes():
    """Section 3, "A pipeline dimension": the committed --pp 2 run passes, rank 0's bytes and model
    states are the count by hand, and the page's arithmetic of the pp bytes is MiniGPT's."""
    from tests.test_lab07_script import pipeline_by_hand

    r = json.loads((RESULTS / PIPELINE).read_text())
    assert r["criterion_pass"] and r["world_size"] == 8 and r["same_as_pytorch"] is None
    layout = r["layouts"]["pp 2 x dp 2 x tp 2"]
    expected, states = pipeline_by_hand()
    assert layout["bytes_per_dim"] == layout["bytes_model_per_dim"] == expected
    assert layout["memory_per_rank"]["measured"] == states and layout["memory_per_rank"]["every_rank_equal_model"]
    cfg = TrainConfig()
    rows, vocab = cfg.batch_size // 2, GPTConfig().vocab_size
    activations, tied = rows * cfg.block_size * cfg.n_embd * 4, vocab * cfg.n_embd * 4
    assert activations + tied + 8 == expected["pp"] and 8 * activations + 8 == expected["tp"]
    for lang, sep in (("en", ","), ("es", " ")):
        text = PAGES[lang].read_text(encoding="utf-8")
        assert f"{rows} × {cfg.block_size} × {cfg.n_embd} × 4 = {activations:,}".replace(",", sep) in text, lang
        assert f"{vocab} × {cfg.n_embd} × 4 = {tied:,}".replace(",", sep) in text, lang
        assert f"lab/results/07-nd-parallel-pp-cpu-{lang}.txt:layouts" in text, lang


@pytest.mark.parametrize("name", [REPORT, FOUR_D, PIPELINE])
def test_the_fragments_are_the_report_rendered(tmp_path, name):
    copy = tmp_path / name
    shutil.copy(RESULTS / name, copy)
    written = lab07.render(copy)
    assert [p.name for p in written] == [f"{copy.stem}-en.txt", f"{copy.stem}-es.txt"]
    for lang in ("en", "es"):
        fragment = f"{copy.stem}-{lang}.txt"
        assert (tmp_path / fragment).read_text() == (RESULTS / fragment).read_text(), f"re-render {name}"


@pytest.mark.parametrize("lang", PAGES)
def test_the_page_shows_the_tables_and_quotes_the_run(lang):
    text = PAGES[lang].read_text(encoding="utf-8")
    for source in (
        f"lab/results/07-nd-parallel-cpu-{lang}.txt:rulers",
        f"lab/results/07-nd-parallel-cpu-{lang}.txt:layouts",
        f"lab/results/checks-times-cpu-{lang}.txt:07",
        f"lab/results/checks-kernel-sets-cpu-{lang}.txt:07",
        f"build/tables/nd-examples-{lang}.md",
    ):
        assert f"generated from {source}" in text, source
    for figure in ("nd-mesh-groups", "nd-bytes-per-dim"):
        assert f"../figures/{figure}-{lang}.png" in text, figure
    r = load()
    first, second = r["layouts"]["2 x 2 x 1 x 2"], r["layouts"]["1 x 2 x 2 x 2"]
    prose = text.split("<!-- generated from")[0] + "".join(
        part.split("<!-- end of", 1)[-1] for part in text.split("<!-- generated from")[1:]
    )
    for memory in (first["memory_per_rank"]["model"], second["memory_per_rank"]["model"]):
        assert num(memory, lang) in prose, memory
    assert sci(second["rulers"]["pytorch_first_step_logit_diff"], lang) in prose
    assert first["rulers"]["pytorch_first_step_logit_diff"] == 0
    peak = r["peak_rss_kb"]
    assert num(peak, lang) in prose and num(round(peak / 1e6, 1), lang, 1) + " GB" in prose, peak


@pytest.mark.parametrize("lang", PAGES)
def test_the_mistake_on_purpose_is_the_committed_run(lang):
    """The Surprises section's --drop-cp-factor: the CP shares averaged instead of summed, measured."""
    r = json.loads((RESULTS / "07-nd-parallel-no-cp-factor-cpu.json").read_text())
    assert r["drop_cp_factor"] and not r["criterion_pass"] and list(r["layouts"]) == ["1 x 2 x 2 x 2"]
    assert set(r["broken_rulers"]) == {
        "fp64_max_step_drift",
        "fp32_first_step_grad_diff",
        "1 x 2 x 2 x 2.fp32_max_step_drift",
    }
    layout = r["layouts"]["1 x 2 x 2 x 2"]
    assert layout["step_drift"]["norm_rel_diff"] > 0.99  # the one process's norm: twice ours (relative difference 1)
    text = PAGES[lang].read_text(encoding="utf-8")
    surprises = text[text.index("{ #surprises }") : text.index("{ #grading }")]
    quoted = [
        sci(r["fp32_first_step_logit_diff"], lang),
        num(r["fp32_first_step_grad_diff"], lang, 3),
        num(r["fp64_max_step_drift"], lang, 2),
        num(r["fp32_max_step_drift"], lang, 2),
        f"{r['steps']} ",
    ]
    assert all(q in surprises for q in quoted), [q for q in quoted if q not in surprises]


@pytest.mark.parametrize("lang", PAGES)
def test_the_hsdp_paragraph_quotes_the_examples_table(lang):
    """The sizes the paragraph after the examples' table reasons with (plain FSDP's, the HSDP layout's
    shard, TP and replicate bytes) are cells of that generated table, and its ratio is theirs."""
    table = lab07.examples(lang)
    text = PAGES[lang].read_text(encoding="utf-8").split("<!-- end of build/tables/nd-examples-")[1]
    text = text.split("## 5.")[0]
    comma = (lambda v: v.replace(".", ",")) if lang == "es" else (lambda v: v)
    for size in ("80.5", "30.8", "17.4", "6.2"):
        assert f"| {comma(size)} GB |" in table and f"{comma(size)} GB" in text, size
    ratio = comma(f"{30.8 / 80.5:.2f}")  # the two cells' ratio, as the paragraph writes it
    assert f"= {ratio} = {comma('30.8')} / {comma('80.5')}" in text, ratio
    # on the same 16 GPUs, TP over a node sends more in `tp` alone than the guide's layout in all four
    (_, _, guide, rows), (_, _, whole_node, _) = lab07.EXAMPLES[:2]
    tp = lab07.example_bytes(lab07.EIGHT_B, whole_node, rows)["tp"]
    every = sum(lab07.example_bytes(lab07.EIGHT_B, guide, rows).values())
    assert tp > every and f"{comma(f'{tp / 1e9:.1f}')} GB" in text and f"{comma(f'{every / 1e9:.1f}')} GB" in text
