"""The Lab 03 guide states measured numbers; each one is tied here to the committed measurements
(lab/results/03-prefetch-cpu.json and 03-practice-cpu.json, written by the lab's scripts) or to
the code, in both languages.

    torchrun --nproc_per_node=2 lab/03_fsdp_prefetch.py --quiet --report lab/results/03-prefetch-cpu.json
    python lab/03_fsdp_prefetch.py --render lab/results/03-prefetch-cpu.json
    torchrun --nproc_per_node=2 lab/03_fsdp_practice.py --steps 20 --report lab/results/03-practice-cpu.json
    python lab/03_fsdp_practice.py --render lab/results/03-practice-cpu.json
"""

from __future__ import annotations

import json
import math
import re

import pytest

from minigpt.fsdp import annotations
from minigpt.pages.lab03_practice import render_tables
from minigpt.pages.lab03_prefetch import table as prefetch_tables
from minigpt.pages.lang import num, sci
from tests.launcher import ROOT
from tests.test_grader import lab_points

PAGES = {"en": ROOT / "lab" / "03-fsdp-prefetch.md", "es": ROOT / "lab" / "03-fsdp-prefetch.es.md"}
RESULTS = ROOT / "lab" / "results"
PREFETCH = json.loads((RESULTS / "03-prefetch-cpu.json").read_text())
PRACTICE = json.loads((RESULTS / "03-practice-cpu.json").read_text())


def stated_numbers(lang: str) -> list[str]:
    v = PREFETCH["variants"]

    def sent(name: str) -> int:
        return sum(v[name]["sent_bytes_per_step"][0].values())

    calls = v["fsdp2-implicit"]["calls_per_step"]
    worst = max(x["max_step_drift"] for x in v.values())
    times = [1000 * x["median_step_s"] for x in v.values()]
    sgd = PRACTICE["clipping"]["optimizers"]["sgd"]["drift_per_step"]
    return [
        str(sum(len(s.annotations) for s in annotations.SECTIONS)),
        str(lab_points("03")),
        num(sent("fsdp2-implicit"), lang),
        num(sent("fsdp2-no-reshard"), lang),
        num(sent("fsdp1-backward-pre"), lang),
        f"{calls['all-gather']} all-gathers",
        f"{calls['reduce-scatter']} reduce-scatters",
        sci(math.ceil(worst * 1e7) / 1e7, lang),  # "1.3e-6", rounded up: "within" it
        str(int(min(times))),
        str(int(round(max(times)))),
        num(sgd["local"][0], lang, 2),
        sci(sgd["global"][0], lang),
        str(PREFETCH["steps"]),
        PREFETCH["date"],
        *loading_numbers(lang),
    ]


def loading_numbers(lang: str) -> list[str]:
    """The numbers the paragraphs on loading, export and the failed save state."""
    first = PRACTICE["loading"]["fsdp_first"]
    broadcast = PRACTICE["loading"]["broadcast_from_rank0"]
    held = first["per_rank"][0]["held_bytes"]
    return [
        f"{num(held['built on meta'], lang)} bytes",
        num(held["to_empty"], lang),
        num(first["full_bytes"], lang),
        f"{num(broadcast['per_rank'][1]['read_bytes'], lang)} bytes",
        f"{num(PRACTICE['failed-save']['timeout_s'], lang)} s",
    ]


def test_the_claims_on_loading_export_and_the_failed_save():
    """What the paragraphs say in words: equal exactly, half of the padded model, rank 1 reads
    nothing and peaks lower, the consolidated file gives the same logits, the line names the rank."""
    loading = PRACTICE["loading"]
    for mode in ("fsdp_first", "broadcast_from_rank0"):
        assert loading[mode]["max_difference"] == 0.0, mode
        for mine in loading[mode]["per_rank"]:
            assert mine["held_bytes"]["built on meta"] == mine["held_bytes"]["sharded on meta"] == 0
            assert mine["held_bytes"]["loaded"] < loading[mode]["full_bytes"]
    shard = loading["fsdp_first"]["per_rank"][0]["held_bytes"]["to_empty"]
    assert 2 * shard == loading["fsdp_first"]["full_bytes"] + 96 * 4  # half the model with its padding row
    broadcast = loading["broadcast_from_rank0"]["per_rank"]
    assert broadcast[1]["read_bytes"] == 0 and broadcast[0]["read_bytes"] == loading["fsdp_first"]["full_bytes"]
    assert broadcast[1]["load_peak_bytes"] < broadcast[0]["load_peak_bytes"]
    export = PRACTICE["export"]
    assert export["identical_logits"] is True and export["max_logit_difference"] == 0.0
    failed = PRACTICE["failed-save"]
    line = failed["ranks"][0]["line"]
    assert failed["timeout_s"] == 5.0 and failed["failing_rank"] == 1
    assert line.startswith("[rank 0] error:") and "collective timeout 5 s" in line


@pytest.fixture(scope="module")
def pages() -> dict[str, str]:
    return {lang: path.read_text(encoding="utf-8") for lang, path in PAGES.items()}


@pytest.mark.parametrize("lang", ["en", "es"])
def test_every_number_in_the_prose_is_measured(pages, lang):
    text = " ".join(pages[lang].split())  # a number and its word may be on two lines
    missing = [x for x in stated_numbers(lang) if x not in text]
    assert not missing, f"{lang}: not on the page: {missing}"


def test_padding_and_the_variants_agree_with_the_page(pages):
    v = PREFETCH["variants"]
    diff = sum(v["fsdp2-implicit"]["sent_bytes_per_step"][0].values()) - sum(
        v["fsdp1-backward-pre"]["sent_bytes_per_step"][0].values()
    )
    # 96 padding elements of 4 bytes in the root's one all-gather and one reduce-scatter, of which
    # a rank sends (N-1)/N = 1/2
    assert diff == 96 * 4 * 2 // 2
    assert len(v) == 10 and all(x["prediction_matches"] for x in v.values())
    for lang in ("en", "es"):
        assert "96" in pages[lang] and "609" in pages[lang] and "610" in pages[lang]


def test_the_included_tables_are_rendered_from_the_measurements():
    for lang in ("en", "es"):
        assert (RESULTS / f"03-prefetch-cpu-{lang}.txt").read_text() == prefetch_tables(PREFETCH, lang)
        assert (RESULTS / f"03-practice-cpu-{lang}.txt").read_text() == render_tables(PRACTICE, lang)
        for name in PREFETCH["variants"]:
            assert (RESULTS / f"03-prefetch-cpu-timeline-{name}-{lang}.png").stat().st_size > 10_000


@pytest.mark.parametrize("lang", ["en", "es"])
def test_every_timeline_is_on_the_page_and_the_points_add_up(pages, lang):
    for name in PREFETCH["variants"]:
        assert f"results/03-prefetch-cpu-timeline-{name}-{lang}.png" in pages[lang], name
    rows = re.findall(r"^\| (P?3\.\d|all) \|.*\| (\d+) \|$", pages[lang], re.M)
    assert [e for e, _ in rows] == ["3.1", "3.2", "3.3", "P3.1", "P3.2", "all"] and sum(
        int(p) for _, p in rows
    ) == lab_points("03")
