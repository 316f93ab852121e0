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


def test_the_prose_numbers_are_the_measured_ones(pages):
    """The sentences around the tables restate a few measured numbers: each one is recomputed here."""
    import statistics

    bench = result("01-benchmark-cpu.json")
    rounds, medians = bench["rounds_s"], bench["medians_s"]
    ratios = [a / b for a, b in zip(rounds["bucketed"], rounds["torch-ddp"])]
    rows = {(r["optimizer"], r["dtype"], r["at_step"]): r for r in result("01-amplification.json")}
    sgd, adamw = rows[("sgd", "float32", 0)], rows[("adamw", "float32", 0)]
    stated = [  # (English, Spanish)
        (f"takes {round(100 * (statistics.median(ratios) - 1))}% longer",
         f"tarda un {round(100 * (statistics.median(ratios) - 1))} % más"),
        (f"from {round(100 * (min(ratios) - 1))}% to {round(100 * (max(ratios) - 1))}%",
         f"entre un {round(100 * (min(ratios) - 1))} % y un {round(100 * (max(ratios) - 1))} %"),
        (f"{medians['naive'] / medians['bucketed']:.1f} times faster ({1000 * medians['naive']:.1f} ms against "
         f"{1000 * medians['bucketed']:.1f} ms)", None),
        (f"take {1000 * medians['bucketed']:.0f} ms per step", f"tardan {1000 * medians['bucketed']:.0f} ms por paso"),
        (f"takes {1000 * medians['one process']:.0f} ms for the whole batch",
         f"tarda {1000 * medians['one process']:.0f} ms con el lote entero"),
        (f"that {max(s['buckets'] for s in bench['sweep'])} tiny buckets",
         f"que {max(s['buckets'] for s in bench['sweep'])} buckets diminutos"),
        (f"a {sgd['grad_diff']:.0e} difference".replace("e-08", "e-8"), None),
        (f"about {sgd['grad_diff'] / sgd['weight_diff']:.0f} times smaller",
         f"unas {sgd['grad_diff'] / sgd['weight_diff']:.0f} veces menor"),
        (f"becomes\n{adamw['weight_diff']:.1e}".replace("e-07", "e-7"), None),
        (f"about {adamw['weight_diff'] / sgd['weight_diff']:.0f} times more",
         f"unas\n{adamw['weight_diff'] / sgd['weight_diff']:.0f} veces más"),
    ]
    messages = len(list(MiniGPT(GPTConfig()).parameters()))  # the naive DDP: one all-reduce per parameter
    stated += [(f"sends {messages} messages", f"envía {messages} mensajes"),
               (f"in {messages} small messages", f"en {messages} mensajes pequeños")]
    for english, spanish in stated:
        assert english in pages["en"], f"the English page should say {english!r}"
        if spanish:
            assert spanish in pages["es"], f"the Spanish page should say {spanish!r}"


@pytest.mark.timeout(120)
def test_accumulation_alone_diverges_at_the_same_step_as_ddp(pages):
    """The page says the trajectory drift is not DDP's doing: one process with --accum 2 leaves one
    with --accum 1 at the same step as the two-rank run left one process. Checked up to that step."""
    import torch

    from minigpt.train import TrainConfig, build_model, build_optimizer, train_step

    first = result("01-check-adamw-cpu.json")["variants"]["bucketed"]["trajectory_drift"]["first_step_above_tolerance"]
    configs = [TrainConfig(accum=1), TrainConfig(accum=2)]
    models = [build_model(c) for c in configs]
    optimizers = [build_optimizer(m, c) for m, c in zip(models, configs)]
    probe = equivalence.probe_batch()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each torchrun rank: the thread count changes the summation order too
    try:
        for step in range(first + 1):
            for model, opt, cfg in zip(models, optimizers, configs):
                train_step(model, opt, step, cfg)
            drift = equivalence.logit_drift(*models, probe)
            assert (drift > equivalence.TOLERANCE) == (step == first), f"step {step}: drift {drift:.2e}"
    finally:
        torch.set_num_threads(threads)
    assert f"from step {first} on" in pages["en"] and f"a partir del paso {first}" in pages["es"]
