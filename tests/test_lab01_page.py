"""The Lab 01 guide states measured numbers; each one is tied here to the committed measurement it
came from (lab/results/*.json, written by the lab's own scripts) or to the code.

    torchrun --nproc_per_node=2 lab/01_ddp.py --check --report lab/results/01-check-adamw-cpu.json
    torchrun --nproc_per_node=2 lab/01_ddp.py --check --dtype float64 --report lab/results/01-check-float64-cpu.json
    torchrun --nproc_per_node=2 lab/01_ddp.py --check --optimizer sgd --lr 0.1 --min-lr 0 --report lab/results/01-check-sgd-cpu.json
    torchrun --nproc_per_node=2 lab/01_benchmark.py --out lab/results
    python -m minigpt.dist.equivalence lab/results
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from minigpt.dist import benchmark, equivalence
from minigpt.dist.ddp import assign_buckets
from minigpt.dist.train_ddp import DEFAULT_BUCKET_CAP_MB
from minigpt.model import GPTConfig, MiniGPT

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "lab" / "results"
PAGES = {"en": ROOT / "lab" / "01-ddp-from-scratch.md", "es": ROOT / "lab" / "01-ddp-from-scratch.es.md"}


def result(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def es(text: str) -> str:
    """How the Spanish page writes a decimal number."""
    return text.replace(".", ",")


@pytest.fixture(scope="module")
def pages() -> dict[str, str]:
    return {lang: path.read_text(encoding="utf-8") for lang, path in PAGES.items()}


def test_the_included_tables_are_what_the_code_renders_from_the_measurements():
    bench = result("01-benchmark-cpu.json")
    rows = result("01-amplification.json")
    for lang in ("en", "es"):
        assert (RESULTS / f"01-benchmark-cpu-{lang}.txt").read_text() == benchmark.render_tables(bench, lang)
        assert (RESULTS / f"01-amplification-{lang}.txt").read_text() == equivalence.amplification_tables(rows)[lang]
        assert (RESULTS / f"01-benchmark-cpu-timeline-{lang}.png").stat().st_size > 10_000


def test_the_expected_output_is_the_committed_default_run(pages):
    report = result("01-check-adamw-cpu.json")
    assert report["passed"] and report["steps"] == 450 and report["world_size"] == 2
    bucketed = report["variants"]["bucketed"]
    expected = [
        f"{report['max_logit_drift']:.2e} ({bucketed['step_drift']['worst_step']})",
        f"{bucketed['trajectory_drift']['max']:.2e}, {bucketed['trajectory_drift']['first_step_above_tolerance']} | True",
        f"check PASS: max logit drift {report['max_logit_drift']:.2e}",
        f"tutor accuracy {100 * report['tutor_accuracy']:.1f}% ({report['tutor_correct']}/{report['tutor_total']}",
        f"loss {report['final_loss']:.4f}",
    ]
    for text in expected:
        for lang, page in pages.items():
            assert text in page, f"{PAGES[lang].name} should show {text!r}"
    first = bucketed["trajectory_drift"]["first_step_above_tolerance"]
    assert f"1e-5 at step {first}" in pages["en"]
    assert f"{report['bytes_all_reduced_per_step']:,}" in pages["en"]


def test_the_bucket_layout_on_the_page_is_the_code(pages):
    buckets = assign_buckets(MiniGPT(GPTConfig()), int(DEFAULT_BUCKET_CAP_MB * 2**20))
    sizes = [sum(p.numel() * 4 for _, p in b) for b in buckets]
    line = ", ".join(f"{s / 2**10:.0f} KiB" for s in sizes)
    for page in pages.values():
        assert f"{len(sizes)} buckets of at most {DEFAULT_BUCKET_CAP_MB:g} MiB: {line}" in page
    assert MiniGPT(GPTConfig()).num_params() * 4 == result("01-check-adamw-cpu.json")["bytes_all_reduced_per_step"]


def test_float64_and_sgd_numbers_are_the_measured_ones(pages):
    f64, sgd = result("01-check-float64-cpu.json"), result("01-check-sgd-cpu.json")
    assert f64["dtype"] == "float64" and sgd["optimizer"] == "sgd"
    stated = {
        "f64-max": f"{f64['max_logit_drift']:.1e}",
        "f64-traj": f"{f64['variants']['bucketed']['trajectory_drift']['max']:.1e}",
        "f64-first": f"step {f64['variants']['bucketed']['trajectory_drift']['first_step_above_tolerance']},",
        "sgd-max": f"{sgd['max_logit_drift']:.1e}",
        "sgd-first": str(sgd["variants"]["bucketed"]["trajectory_drift"]["first_step_above_tolerance"]),
    }
    for name, text in stated.items():
        assert text in pages["en"], f"the English page should state {name} = {text}"
        spanish = es(text).replace("step", "paso")
        assert spanish in pages["es"], f"the Spanish page should state {name} = {spanish}"
    assert f64["max_logit_drift"] < 1e-12  # "about 1e-14": twelve orders below the float32 run


def test_the_page_says_where_the_benchmark_ran(pages):
    bench = result("01-benchmark-cpu.json")
    for page in pages.values():
        assert bench["date"] in page and bench["torch"] in page


@pytest.mark.parametrize("readme", ["README.md", "README.es.md"])
def test_the_readme_quotes_the_committed_lab01_run(readme):
    report = result("01-check-adamw-cpu.json")
    text = (ROOT / readme).read_text(encoding="utf-8")
    assert f"check PASS: max logit drift {report['max_logit_drift']:.2e}" in text
    assert (f"tutor accuracy {100 * report['tutor_accuracy']:.1f}% "
            f"({report['tutor_correct']}/{report['tutor_total']} held-out test sentences)") in text
    assert "lab/01_ddp.py --check" in text
