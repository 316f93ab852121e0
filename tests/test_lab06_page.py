"""The Lab 06 guide shows measured tables and makes a few claims; each is tied here to the committed
measurements (lab/results/06-*.json, written by ``make results-06``) and to numbers worked out in
this file from MiniGPT's shapes: the bytes each stage sends, the micro-batches each stage holds,
the bubble formula, the effective batch and the learning-rate rules."""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
import shutil
from pathlib import Path

import pytest
import torch.distributed as dist

from minigpt import grammar
from minigpt.pages import lab06
from minigpt.pages.lang import num, pct
from minigpt.train import TrainConfig

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "lab" / "results"
PIPELINE = {2: "06-pipeline-cpu.json", 4: "06-pipeline-4-cpu.json"}
MESH = "06-mesh-cpu.json"
PAGES = {"en": ROOT / "lab" / "06-pipelines-and-meshes.md", "es": ROOT / "lab" / "06-pipelines-and-meshes.es.md"}
SCHEDULES = ("gpipe", "1f1b")


def load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def bytes_by_hand(stages: int, element_size: int = 4) -> list[int]:
    """What each stage sends in one step: the whole batch's activations (64 x 32 x 96 numbers) down
    from every stage but the last, their gradients up from every stage but the first, and the
    tied matrix's gradient (609 x 96) from the first and the last."""
    cfg = TrainConfig()
    assert (cfg.batch_size, cfg.block_size, cfg.n_embd, grammar.VOCAB_SIZE) == (64, 32, 96, 609)
    activations = 64 * 32 * 96 * element_size
    tied = 609 * 96 * element_size
    out = []
    for s in range(stages):
        sent = activations * (s < stages - 1) + activations * (s > 0)
        out.append(sent + (tied if s in (0, stages - 1) else 0))
    return out


def held_by_hand(schedule: str, stages: int, m: int) -> list[int]:
    """GPipe: every forward before the first backward, so m on every stage. 1F1B: stage s runs
    p - 1 - s forwards of warm-up and one more before its first backward, then one backward per
    forward, so p - s (at most m)."""
    return [m] * stages if schedule == "gpipe" else [min(stages - s, m) for s in range(stages)]


@pytest.mark.parametrize("stages", PIPELINE)
def test_the_pipeline_runs_prove_what_the_page_says(stages):
    r = load(PIPELINE[stages])
    p, m = r["stages"], r["micro_batches"]
    assert p == stages and r["world_size"] == stages
    # the page says: two stages with 1F1B and eight micro-batches; four stages, one block each, GPipe
    assert (r["schedule"], m) == (("1f1b", 8) if stages == 2 else ("gpipe", 8))
    if stages == 4:
        assert r["blocks_per_stage"] == [1, 1, 1, 1]
    one = r["one_step"]
    for schedule in SCHEDULES:
        assert one["float32"][schedule]["max_grad_diff"] <= 1e-5 and one["float32"][schedule]["loss_diff"] <= 1e-5
        assert one["float64"][schedule]["max_grad_diff"] <= 1e-12 and one["float64"][schedule]["loss_diff"] <= 1e-12
        assert one["float32"][schedule]["bytes_sent"] == bytes_by_hand(p)
        assert one["float64"][schedule]["bytes_sent"] == bytes_by_hand(p, 8)
        assert one["float32"][schedule]["peak_activations"] == held_by_hand(schedule, p, m)
        assert lab06.held_model(schedule, p, m) == held_by_hand(schedule, p, m)
    # "the two schedules give the same gradients": each stage adds its micro-batches in one order
    for dtype in one:
        assert one[dtype]["gpipe"]["max_grad_diff"] == one[dtype]["1f1b"]["max_grad_diff"]
    assert r["bytes_model"] == r["bytes_per_stage_per_step"] == bytes_by_hand(p)
    # "held to Lab 01's criterion" over a whole training run, the tied copies bit-identical after every step
    t = r["training"]
    assert t["steps"] == TrainConfig().steps, "the committed results are a whole training run (make results-06)"
    assert t["step_drift"]["max"] <= 1e-5 and t["tied_copies_bit_identical"] and r["criterion_pass"] and r["full"]
    assert r["fp64_max_step_drift"] <= 1e-12 and r["same_as_pytorch"]
    # "PyTorch's own pipeline does the same sums in the same order: bit-identical gradients"
    assert all(r["torch_pipelining"][s] == {"max_grad_diff": 0.0, "bit_identical": True} for s in SCHEDULES)


@pytest.mark.parametrize("stages", PIPELINE)
def test_the_bubble_is_the_formula_with_one_micro_batch_and_above_it_with_more(stages):
    """Sections 5 and 7: with m = 1 the measurement comes close to (p-1)/(m+p-1); at every m above
    the number of stages both schedules measure more than the formula (the pages say "at every
    point with more micro-batches than stages")."""
    r = load(PIPELINE[stages])
    p = r["stages"]
    for schedule in SCHEDULES:
        values = r["bubble"][schedule]
        for m, v in values.items():
            assert v["model"] == pytest.approx((p - 1) / (int(m) + p - 1)) == lab06.bubble_model(p, int(m))
        assert abs(values["1"]["measured"] - values["1"]["model"]) < 0.1, (schedule, values["1"])
        above = {m: v for m, v in values.items() if int(m) > p}
        assert above and all(v["measured"] > v["model"] for v in above.values()), (schedule, values)


def test_the_mesh_run_proves_what_the_page_says():
    r = load(MESH)
    cfg = TrainConfig()
    assert r["world_size"] == 4 and r["mesh"] == {"hsdp": {"replicate": 2, "shard": 2}, "dp_tp": {"dp": 2, "tp": 2}}
    h, d = r["hsdp"], r["dp_tp"]
    assert r["bytes_per_dim"] == r["bytes_model_per_dim"] and h["bytes_constant_over_steps"]
    assert all(e["measured"] == e["model"] for e in r["memory_per_rank"]["every_rank"])
    assert d["bytes_per_dim"] == d["bytes_model_per_dim"] and d["bytes_constant_over_steps"]
    assert (
        max(r["fp32_first_step_logit_diff"], r["fp32_first_step_grad_diff"]) <= 1e-5 and d["replicated_bit_identical"]
    )
    assert h["step_drift"]["max"] <= 1e-5 and d["step_drift"]["max"] <= 1e-5 and r["criterion_pass"]
    assert r["pytorch_first_step_logit_diff"] <= 1e-6 and r["fp64_max_step_drift"] <= 1e-12
    # section 5, the batch: every mesh sees the whole batch of one process; the rules move a rate
    # tuned for one data-parallel rank's share by the number of those ranks, or by its root
    for key, dp in (("hsdp", 4), ("dp_tp", 2)):
        plan = r["batch_plans"][key]
        assert plan["effective_batch"] == cfg.batch_size
        assert plan["lr_linear"] == pytest.approx(cfg.lr * dp)
        assert plan["lr_sqrt"] == pytest.approx(cfg.lr * math.sqrt(dp))


def section(text: str, name: str) -> str:
    return re.search(rf"\[start:{name}\] -->\n(.*?)<!-- --8<-- \[end:{name}\]", text, re.S).group(1)


@pytest.mark.parametrize("stages", PIPELINE)
def test_the_pipeline_tables_show_the_numbers_worked_out_here(stages):
    r = load(PIPELINE[stages])
    p, m = r["stages"], r["micro_batches"]
    for lang in ("en", "es"):
        text = (RESULTS / f"{Path(PIPELINE[stages]).stem}-{lang}.txt").read_text()
        proofs, bubble = section(text, "proofs"), section(text, "bubble")
        assert " · ".join(num(b, lang) for b in bytes_by_hand(p)) in proofs
        for schedule in SCHEDULES:
            assert " · ".join(num(h, lang) for h in held_by_hand(schedule, p, m)) in proofs
        for m_ in r["bubble"]["gpipe"]:
            assert f"| {m_} | {pct((p - 1) / (int(m_) + p - 1), lang)} |" in bubble
        chart = section(text, "chart")
        assert chart.count("stage 0") == 2 and f"stage {p - 1}" in chart and f"F{m - 1}" in chart


def test_the_mesh_tables_show_the_report():
    r = load(MESH)
    for lang in ("en", "es"):
        text = (RESULTS / f"{Path(MESH).stem}-{lang}.txt").read_text()
        mesh = section(text, "mesh")
        for value in (*r["bytes_per_dim"].values(), *r["dp_tp"]["bytes_per_dim"].values()):
            assert num(value, lang) in mesh
        assert num(TrainConfig().batch_size, lang) in section(text, "batch")


@pytest.mark.parametrize("name", [*PIPELINE.values(), MESH])
def test_the_fragments_are_the_reports_rendered(tmp_path, name):
    copy = tmp_path / name
    shutil.copy(RESULTS / name, copy)
    written = lab06.render(copy)
    assert [p.name for p in written] == [f"{copy.stem}-en.txt", f"{copy.stem}-es.txt"]
    for lang in ("en", "es"):
        fragment = f"{copy.stem}-{lang}.txt"
        assert (tmp_path / fragment).read_text() == (RESULTS / fragment).read_text(), f"re-render {name}"


@pytest.mark.parametrize("lang", PAGES)
def test_the_page_shows_the_tables_and_the_theory_links_it(lang):
    text = PAGES[lang].read_text(encoding="utf-8")
    for source in (
        "06-pipeline-cpu-{lang}.txt:chart",
        "06-pipeline-cpu-{lang}.txt:proofs",
        "06-pipeline-4-cpu-{lang}.txt:proofs",
        "06-pipeline-cpu-{lang}.txt:bubble",
        "06-pipeline-4-cpu-{lang}.txt:bubble",
        "06-mesh-cpu-{lang}.txt:mesh",
        "06-mesh-cpu-{lang}.txt:batch",
    ):
        assert f"generated from lab/results/{source.format(lang=lang)}" in text, source
    suffix = ".md" if lang == "en" else ".es.md"
    theory = (ROOT / "theory" / f"02-parallelism-flavours{suffix}").read_text(encoding="utf-8")
    for anchor in ("#bubble", "#mesh"):
        assert f"06-pipelines-and-meshes{suffix}{anchor}" in theory, anchor


@pytest.mark.parametrize("lang", PAGES)
def test_the_degrees_table_is_what_resolve_hsdp_gives(lang):
    """Section 2's degrees come before the exercises, so the page shows calls and what they give, not
    code that imports the reference: each row is what the reference's ``resolve_hsdp`` returns, or the
    error it raises, word for word."""
    from minigpt.parallel.mesh import resolve_hsdp

    text = PAGES[lang].read_text(encoding="utf-8")
    rows = re.findall(r"^\| `(resolve_hsdp\([^`]*\))` \| `([^`]*)` \|$", text, re.M)
    assert len(rows) == 3, rows
    for call, shown in rows:
        try:
            got = repr(eval(call, {"resolve_hsdp": resolve_hsdp}))
        except ValueError as exc:
            got = f"ValueError: {exc}"
        assert got == shown, (call, got)


@pytest.mark.parametrize("lang", PAGES)
def test_the_page_snippets_print_what_they_say(lang):
    """Section 6's other launchers: each print's trailing comment is its output."""
    blocks = re.findall(r"^```python\n(.*?)^```", PAGES[lang].read_text(encoding="utf-8"), re.M | re.S)
    assert blocks
    for code in blocks:
        expected = [line.split("#", 1)[1].strip() for line in code.splitlines() if line.lstrip().startswith("print(")]
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code, f"lab06.{lang}", "exec"), {})
        assert out.getvalue().splitlines() == expected, code


# --- issue 29: what the page says about the bubble, the learning rate and the mesh, and its pictures ---


def _prose(path: Path) -> str:
    """A page with its lines joined: a phrase may break across lines."""
    return " ".join(path.read_text(encoding="utf-8").split())


THEORY_02 = {
    "en": ROOT / "theory" / "02-parallelism-flavours.md",
    "es": ROOT / "theory" / "02-parallelism-flavours.es.md",
}


def test_the_bubble_formula_is_no_bound():
    """Section 4 and theory 02: the committed measurements lie above (p-1)/(m+p-1) at some points
    and below it at others, so neither page calls the formula a bound the measurement stays above
    (or below); the figure's points are the reports' numbers."""
    above = below = 0
    for name in PIPELINE.values():
        r = load(name)
        points = lab06.bubble_points(r)
        for schedule in SCHEDULES:
            for m, measured, model in points[schedule]:
                assert (measured, model) == (
                    r["bubble"][schedule][str(m)]["measured"],
                    r["bubble"][schedule][str(m)]["model"],
                )
                above += measured > model
                below += measured < model
    assert above and below, (above, below)
    # theory 02: with more than one micro-batch, above at every point but one, a tenth of a point below
    gaps = [
        model - measured
        for name in PIPELINE.values()
        for points in lab06.bubble_points(load(name)).values()
        for m, measured, model in points
        if m > 1 and measured < model
    ]
    assert len(gaps) == 1 and round(100 * gaps[0], 1) == 0.1, gaps
    flat = {lang: " ".join(path.read_text(encoding="utf-8").split()) for lang, path in THEORY_02.items()}
    assert "above the formula at every point but one, which falls a tenth of a point below it" in flat["en"]
    assert "en todos los puntos menos uno, que cae una décima de punto por debajo" in flat["es"]
    for pages in (PAGES, THEORY_02):
        for path in pages.values():
            text = _prose(path).lower()
            for wrong in (
                "lower bound",
                "the measured bubble stays above the formula",
                "the measured bubble is larger than",
                "is a bound for",
                "cota inferior",
                "la burbuja medida queda por encima de la fórmula",
                "la burbuja medida es mayor que",
                "es una cota para",
            ):
                assert wrong not in text, (path.name, wrong)
    for lang in PAGES:
        assert f"(../figures/pipeline-bubble-measured-{lang}.png)" in PAGES[lang].read_text(encoding="utf-8")


@pytest.mark.parametrize("lang", PAGES)
def test_the_square_root_rule_is_said_as_theory_02_says_it(lang):
    phrase = {
        "en": "the one analysed for adaptive optimizers such as Adam",
        "es": "es la que se ha analizado para optimizadores adaptativos como Adam",
    }[lang]
    lab, theory = _prose(PAGES[lang]), _prose(THEORY_02[lang])
    assert phrase in lab and phrase in theory
    assert "usual one for Adam" not in lab and "habitual para Adam" not in lab


@pytest.mark.parametrize("lang", PAGES)
def test_the_formulas_the_page_names_are_theory_02_s(lang):
    """A quantity the lab page names in its formulas (V_{\\text{...}}, M_{\\text{...}}) is written the
    same way in theory page 02 of the same language."""
    names = set(re.findall(r"[VM]_\{\\text\{[^}]+\}\}", PAGES[lang].read_text(encoding="utf-8")))
    assert names, "the page names theory 02's quantities"
    theory = THEORY_02[lang].read_text(encoding="utf-8")
    assert all(name in theory for name in names), sorted(n for n in names if n not in theory)


def test_the_mesh_figure_s_groups_are_the_device_mesh_s():
    """Section 5's picture: the groups of each reading of the 2 x 2 mesh, as the page module works
    them out from the committed run's degrees, are the ones ``init_device_mesh`` builds (asked on
    every rank of a pretend four-rank group); the page names them."""
    from torch.distributed.device_mesh import init_device_mesh

    from tests.fake_world import fake_world

    r = load(MESH)
    for key, dims in lab06.MESH_DIMS.items():
        degrees = {dim: r["mesh"][key][dim] for dim in dims}
        drawn = lab06.mesh_groups(degrees)
        for rank in range(r["world_size"]):
            with fake_world(rank, r["world_size"]):
                mesh = init_device_mesh("cpu", tuple(degrees.values()), mesh_dim_names=dims)
                for dim in dims:
                    group = dist.get_process_group_ranks(mesh.get_group(dim))
                    assert group in drawn[dim], (key, dim, rank, group, drawn[dim])
    hsdp = lab06.mesh_groups({"replicate": 2, "shard": 2})
    for lang, words in (("en", ("ranks {} and {}", ", ")), ("es", ("los ranks {} y {}", ", "))):
        text = _prose(PAGES[lang])
        for dim in ("shard", "replicate"):
            listed = words[1].join(words[0].format(*g) for g in hsdp[dim])
            assert listed in text, (lang, listed)
        assert f"(../figures/device-mesh-2x2-{lang}.png)" in text


def test_the_timeline_figure_is_the_committed_steps():
    """Section 1's measured timelines (``pipeline-timelines-measured``) are the committed runs' median
    steps at m = 8: every stage ran 2m operations, one forward and one backward of each micro-batch,
    in the order its schedule's list gives (``schedule_orders``), one after the other on its clock;
    the page shows the figure in both languages."""
    from minigpt.parallel.pipeline import SCHEDULES as ORDERS, schedule_orders

    m = lab06.TIMELINE_M
    assert "pipeline-timelines-measured" in lab06.FIGURES and lab06.PIPELINE_REPORTS.keys() == PIPELINE.keys()
    for stages, name in PIPELINE.items():
        r = load(name)
        found = lab06.timelines(r)
        assert found.keys() == set(SCHEDULES)
        for schedule in SCHEDULES:
            committed = r["bubble"][schedule][str(m)]["timeline"]
            assert [[list(op) for op in ops] for ops in found[schedule]] == committed
            orders = schedule_orders(ORDERS[schedule], stages, m)
            assert len(found[schedule]) == stages == len(r["bubble"][schedule][str(m)]["waited_s"])
            for s, ops in enumerate(found[schedule]):
                assert len(ops) == 2 * m, (name, schedule, s)
                assert [(kind, i) for kind, i, _, _ in ops] == [tuple(op) for op in orders[s]], (name, schedule, s)
                assert all(start <= end for _, _, start, end in ops)
                assert all(a[3] <= b[2] for a, b in zip(ops, ops[1:])), "a stage runs one operation at a time"
    for lang in PAGES:
        assert f"(../figures/pipeline-timelines-measured-{lang}.png)" in PAGES[lang].read_text(encoding="utf-8")


# --- issue 29, part 2: the page's order, the rulers and the numbers its prose states -------------


@pytest.mark.parametrize("lang", PAGES)
def test_the_page_shows_the_rulers_and_says_what_they_measured(lang):
    """The rulers of both pipelines and of the meshes are shown after the exercises; the prose's
    numbers are the reports': the short check's steps, the mesh run's steps, eight micro-batches in
    the timelines, the same float32 drift on two stages (1F1B) and four (GPipe), DP x TP's first step
    PyTorch's bit for bit and its drift within 1e-5."""
    from minigpt.runners.lab06_pipeline import DEFAULT_CHECK_STEPS

    text = PAGES[lang].read_text(encoding="utf-8")
    for source in (
        "06-pipeline-cpu-{lang}.txt:rulers",
        "06-pipeline-4-cpu-{lang}.txt:rulers",
        "06-mesh-cpu-{lang}.txt:rulers",
    ):
        assert f"generated from lab/results/{source.format(lang=lang)}" in text, source
    assert (
        text.index("{ #your-exercises }")
        < text.index("{ #proofs }")
        < text.index("06-pipeline-cpu-" + lang + ".txt:rulers")
    )
    for heading in ("{ #mesh }", "{ #degrees }"):  # what exercises 6.3 and 6.4 need comes before the proofs
        assert text.index(heading) < text.index("{ #your-exercises }"), heading
    prose = _prose(PAGES[lang])
    two, four, mesh = load(PIPELINE[2]), load(PIPELINE[4]), load(MESH)
    steps = TrainConfig().steps
    said = {
        "en": (
            f"the first {DEFAULT_CHECK_STEPS} of the run's {steps} steps",
            f"the run's {mesh['steps']} steps",
            "eight micro-batches",
        ),
        "es": (
            f"los primeros {DEFAULT_CHECK_STEPS} de los {steps} pasos",
            f"los {mesh['steps']} pasos de la ejecución",
            "ocho microlotes",
        ),
    }
    for phrase in said[lang]:
        assert phrase in prose, phrase
    assert lab06.TIMELINE_M == 8 == two["micro_batches"] == four["micro_batches"]
    assert (two["schedule"], four["schedule"]) == ("1f1b", "gpipe")
    assert (
        two["fp32_max_step_drift"] == four["fp32_max_step_drift"] and two["fp32_worst_step"] == four["fp32_worst_step"]
    )
    assert two["fp32_twin_clips_with"] == four["fp32_twin_clips_with"] == mesh["fp32_twin_clips_with"] == "run"
    assert mesh["pytorch_first_step_logit_diff"] == 0.0 and mesh["dp_tp"]["step_drift"]["max"] <= 1e-5
    assert mesh["dp_tp"]["step_drift"]["max"] <= max(1e-5, 2 * mesh["pytorch_fp32_max_step_drift"])
