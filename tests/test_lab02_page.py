"""The Lab 02 guide states measured numbers; each one is tied here to the committed measurements
(lab/results/02-crosscheck-cpu.json, written by ``torchrun --nproc_per_node=2
lab/02_crosscheck.py --report ...``, and lab/results/02-sharding-pays-cpu.json, by the same script
with ``--sizes 96,192,384``) or to the code that computes it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from minigpt.pages.lab02_crosscheck import fragment
from minigpt.pages.lang import num, sci
from minigpt.zero import memory, mlp, simulate
from tests.test_grader import lab_points

ROOT = Path(__file__).resolve().parent.parent
PAGES = {"en": ROOT / "lab" / "02-zero-simulator.md", "es": ROOT / "lab" / "02-zero-simulator.es.md"}
REPORT = json.loads((ROOT / "lab" / "results" / "02-crosscheck-cpu.json").read_text())


@pytest.fixture(scope="module")
def pages() -> dict[str, str]:
    return {lang: path.read_text(encoding="utf-8") for lang, path in PAGES.items()}


def pct(x: float, lang: str, decimals: int) -> str:
    return num(100 * x, lang, decimals) + ("%" if lang == "en" else " %")


def stated_numbers(lang: str) -> list[str]:
    """Every number the prose of section 6 and the notes state, written the page's way."""
    v = REPORT["variants"]
    psi, n = REPORT["params"], REPORT["world_size"]
    ddp, zero1, fsdp = v["ddp"], v["zero1"], v["fsdp2"]
    ddp_optimizer_extra = ddp["model_states_after_step"]["optimizer"] - 8 * psi  # AdamW's step counters
    # the first, broken, version skipped the root's all-gather: (N-1)/N of the padded root, 4 bytes each
    from minigpt.fsdp.variants import fsdp2_unit_sizes
    from minigpt.train import TrainConfig, build_model

    _, padded_units = fsdp2_unit_sizes(build_model(TrainConfig()), n)
    without_root = fsdp["prediction"]["bytes"] - (n - 1) / n * 4 * padded_units[0]
    worst_drift = max(r["step_drift"]["max"] for r in v.values())
    one = [simulate.simulate(stage, 1, steps=1, rows=32).peak_model_state[0] for stage in (0, 2, 3)]
    ds2 = memory.deepspeed_rows(2, 2851e6, gpus_per_node=8)[1].gpu / 2**30
    return [
        num(psi, lang),
        num(ddp["bytes_sent_per_step"], lang),
        num(zero1["model_states_after_step"]["optimizer"], lang),
        f"plus {zero1['bytes_sent_per_step'] - ddp['bytes_sent_per_step']}"
        if lang == "en"
        else f"más {zero1['bytes_sent_per_step'] - ddp['bytes_sent_per_step']}",
        f"{(zero1['model_states_after_step']['optimizer'] - 8 * psi // n) // 4} pieces"
        if lang == "en"
        else f"{(zero1['model_states_after_step']['optimizer'] - 8 * psi // n) // 4} piezas",
        num(fsdp["bytes_sent_per_step"], lang),
        num(fsdp["prediction"]["bytes_unpadded"], lang),
        num(fsdp["model_states_after_step"]["total"], lang),
        str(fsdp["prediction"]["padding_elements"]),
        pct(
            (fsdp["prediction"]["bytes"] - fsdp["prediction"]["bytes_unpadded"]) / fsdp["prediction"]["bytes"], lang, 3
        ),
        pct(fsdp["model_states_after_step"]["total"] / ddp["model_states_after_step"]["total"], lang, 0),
        f"{ddp_optimizer_extra} bytes",
        str(ddp_optimizer_extra // 4),
        pct(1 - without_root / fsdp["prediction"]["bytes"], lang, 1),
        (f"at most {sci(worst_drift, lang)}" if lang == "en" else f"como máximo {sci(worst_drift, lang)}"),
        (f"Measured on {REPORT['date']}" if lang == "en" else f"Medido el {REPORT['date']}"),
        *(num(x, lang) for x in one),
        num(ds2, lang, 2) + " GiB",
        str(REPORT["steps"]),
        str(lab_points("02")),
    ]


@pytest.mark.parametrize("lang", ["en", "es"])
def test_the_deepspeed_table_prints_gib_as_deepspeed_does(lang):
    """DeepSpeed's estimator divides by 2**30 (and says GB): its column must show the numbers its
    documentation prints for 2851M parameters on 8 GPUs, 71.69 and 6.09, in GiB."""
    from minigpt.pages import lab02

    table = lab02.deepspeed_compare(lang)
    for published in (71.69, 6.09):
        assert num(published, lang, 2) + " GiB" in table, (lang, published)
    assert " GB" not in table


@pytest.mark.parametrize("lang", ["en", "es"])
def test_every_number_in_the_prose_is_measured(pages, lang):
    flat = " ".join(pages[lang].split())  # sentences wrap across lines
    missing = [x for x in stated_numbers(lang) if x not in flat]
    assert not missing, f"{lang}: these measured numbers are not on the page: {missing}"


def test_the_crosscheck_table_is_rendered_from_the_measurement():
    for lang in ("en", "es"):
        assert (ROOT / "lab" / "results" / f"02-crosscheck-cpu-{lang}.txt").read_text() == fragment(REPORT, lang)


@pytest.mark.parametrize("lang", ["en", "es"])
def test_the_points_table_adds_up(pages, lang):
    import re

    rows = re.findall(r"^\| (P?2\.\d|all) \|.*\| (\d+) \|$", pages[lang], re.M)
    assert [e for e, _ in rows] == ["2.1", "2.2", "2.3", "2.4", "2.5", "P2.1", "P2.2", "all"]
    assert sum(int(p) for _, p in rows) == lab_points("02")


def test_the_adam_surprise_is_measured(pages):
    """Section 8's surprise: tests/pitfalls/rules/shard_divided_twice.py's ZeRO-2 step, which divides the summed
    shard by N once more, ends 4 steps (fp32) this far from DDP's weights on 2, 3 and 4 workers: a few
    millionths, as the page says, and never the same bits."""
    import importlib.util

    import numpy as np

    path = ROOT / "tests" / "pitfalls" / "rules" / "shard_divided_twice.py"
    spec = importlib.util.spec_from_file_location("shard_divided_twice", path)
    mistaken = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mistaken)
    shape = mlp.MLPSpec((12, 24, 20, 6))  # tests/test_lab02.py's model
    worst = []
    for n in (2, 3, 4):
        ddp = simulate.simulate(0, n, shape, steps=4, recipe_name="fp32", rows=24)
        ours = simulate.simulate(2, n, shape, steps=4, recipe_name="fp32", rows=24, step_fn=mistaken.zero2_step)
        worst.append(max(float(np.abs(a.astype(np.float64) - b).max()) for a, b in zip(ddp.weights, ours.weights)))
    assert min(worst) > 0
    low, high = f"{min(worst):.0e}".replace("e-0", "e-"), f"{max(worst):.0e}".replace("e-0", "e-")
    assert f"{low} to {high}" in pages["en"], (low, high)
    assert f"entre {low} y {high}" in pages["es"], (low, high)


# --- when sharding pays (lab/02_crosscheck.py --sizes) ---------------------------------------------

SHARDING = json.loads((ROOT / "lab" / "results" / "02-sharding-pays-cpu.json").read_text())
THEORY = {
    "en": ROOT / "theory" / "01-data-parallel-zero-fsdp.md",
    "es": ROOT / "theory" / "01-data-parallel-zero-fsdp.es.md",
}


def test_zero2_at_the_end_of_forward_is_ten_psi(pages):
    """Section 8's bullet: at the end of forward ZeRO-2 (FSDP2 without resharding) holds every weight
    gathered (4 Psi) and no gradient shard yet (2 Psi less than after the step): 10 Psi in all."""
    for size in SHARDING["sizes"].values():
        kinds, psi = size["stages"]["fsdp2-no-reshard"]["model_states_by_kind"], size["params"]
        forward, after = kinds["end_of_forward"], kinds["after_step"]
        assert round(forward["gathered"] / psi) == 4 and forward["gradients"] == 0
        assert round(after["gradients"] / psi) == 2 and round(forward["total"] / psi) == 10
        assert round(after["total"] / psi) == 8
    flat = {lang: " ".join(text.split()) for lang, text in pages.items()}
    assert r"($2\Psi$ less), ZeRO-2 also holds every weight gathered ($4\Psi$ more: $10\Psi$ in all)" in flat["en"]
    assert (
        r"($2\Psi$ menos), ZeRO-2 guarda además todos los pesos reunidos ($4\Psi$ más: $10\Psi$ en total)" in flat["es"]
    )


def test_the_sharding_measurement_is_the_model_to_the_byte():
    """The committed run: every byte rank 0 sent and held, at each width and stage, is what the
    ZeRO model's terms say (written out in tests/test_lab02_crosscheck.py), and rank 1 matched its own."""
    from tests.test_lab02_crosscheck import expected_on_rank_0

    assert SHARDING["criterion_pass"] is True and SHARDING["world_size"] == 2 and SHARDING["backend"] == "gloo"
    assert list(SHARDING["sizes"]) == ["96", "192", "384"]
    for width, entry in SHARDING["sizes"].items():
        for name, want in expected_on_rank_0(int(width)).items():
            r = entry["stages"][name]
            assert r["bytes_sent_per_step"] == want["bytes"], (width, name)
            assert r["model_states"]["end_of_forward"] == want["end_of_forward"], (width, name)
            assert r["model_states"]["after_step"] == want["after_step"], (width, name)
    assert all(all(per_size.values()) for rank in SHARDING["exact_per_rank"] for per_size in rank.values())


def test_the_sharding_tables_are_rendered_from_the_measurement():
    from minigpt.pages import lab02_sharding

    for lang in ("en", "es"):
        text = (ROOT / "lab" / "results" / f"02-sharding-pays-cpu-{lang}.txt").read_text()
        assert text == lab02_sharding.fragment(SHARDING, lang)


def test_the_decision_follows_the_theory_s_order_at_every_width():
    """What the page and the theory page say the table shows: as the budget falls, DDP, then ZeRO-1,
    ZeRO-2, ZeRO-3, then none, at every width; and the band edges are the stages' fuller census points."""
    from minigpt.pages.lab02_sharding import decision_rows

    for entry in SHARDING["sizes"].values():
        bands = decision_rows(entry)
        assert [name for _, _, name in bands] == ["ddp", "zero1", "fsdp2-no-reshard", "fsdp2", None]
        stages = entry["stages"]
        for low, _, name in bands[:-1]:
            assert low == max(stages[name]["model_states"].values()), name
        # "DDP, ZeRO-1 and ZeRO-2 send the same 4Ψ to within 0.02%"; ZeRO-2 a little more than ZeRO-1
        ddp = stages["ddp"]["bytes_sent_per_step"]
        for name in ("zero1", "fsdp2-no-reshard"):
            assert 0 < stages[name]["bytes_sent_per_step"] - ddp < 2e-4 * ddp, name
        assert stages["fsdp2-no-reshard"]["bytes_sent_per_step"] > stages["zero1"]["bytes_sent_per_step"]


def sharding_numbers(lang: str) -> list[str]:
    """The numbers the prose of "When sharding pays" states, written the page's way."""
    from minigpt.pages.lab01_links import PAPER_LINKS

    links = json.loads((ROOT / "lab" / "results" / "01-links-cpu.json").read_text())
    s = {width: entry["stages"] for width, entry in SHARDING["sizes"].items()}
    extra = s["384"]["fsdp2"]["bytes_sent_per_step"] - s["384"]["fsdp2-no-reshard"]["bytes_sent_per_step"]
    gap = s["384"]["fsdp2"]["seconds_per_step"] - s["384"]["fsdp2-no-reshard"]["seconds_per_step"]
    out = [
        num(extra, lang),
        num(extra / links["link_both_ways"]["beta"] * 1e3, lang, 1) + " ms",
        num(gap * 1e3, lang, 1) + " ms",
        *sorted({num(extra / beta * 1e3, lang, 2) + " ms" for _, _, beta in PAPER_LINKS}),  # Lab 01's nominal links
    ]
    for width in ("96", "384"):
        out.append(num(s[width]["fsdp2"]["bytes_sent_per_step"] / s[width]["ddp"]["bytes_sent_per_step"], lang, 2))
        out.append(pct(1 - s[width]["fsdp2"]["peak_all_tensors"] / s[width]["ddp"]["peak_all_tensors"], lang, 0))
    return out


@pytest.mark.parametrize("lang", ["en", "es"])
def test_every_number_of_when_sharding_pays_is_measured(pages, lang):
    section = pages[lang][pages[lang].index("{ #sharding-pays }") : pages[lang].index("{ #cli }")]
    flat = " ".join(section.split())
    missing = [x for x in sharding_numbers(lang) if x not in flat]
    assert not missing, f"{lang}: these measured numbers are not in the section: {missing}"
    # what the prose says of the seconds: ZeRO-1 a little faster than DDP, FSDP2's two runs the slowest
    for entry in SHARDING["sizes"].values():
        t = {name: r["seconds_per_step"] for name, r in entry["stages"].items()}
        assert t["zero1"] < t["ddp"] < min(t["fsdp2-no-reshard"], t["fsdp2"]), t


@pytest.mark.parametrize("lang", ["en", "es"])
def test_the_theory_s_decision_points_to_the_measurement(lang):
    text = THEORY[lang].read_text(encoding="utf-8")
    section = " ".join(text[text.index("{ #decision }") : text.index("{ #check-yourself }")].split())
    assert "#sharding-pays" in section
    ratios = [
        r["stages"]["fsdp2"]["bytes_sent_per_step"] / r["stages"]["ddp"]["bytes_sent_per_step"]
        for r in SHARDING["sizes"].values()
    ]
    low, high = num(min(ratios), lang, 2), num(max(ratios), lang, 2)
    assert (f"{low} to {high}" if lang == "en" else f"entre {low} y {high}") in section
