"""The Lab 04 guide shows measured tables and states a few numbers; each is tied here to the
committed measurements (lab/results/04-fsdp-cpu.json on 2 ranks and 04-fsdp-cpu-4.json on 4, written
by ``make results-04``) or to the code that computes them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from minigpt.pages import lab04
from minigpt.pages.lang import num
from minigpt.runners.lab04_fsdp import memory_model, model_bytes
from minigpt.train import TrainConfig, build_model

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "lab" / "results"
REPORTS = {2: "04-fsdp-cpu.json", 4: "04-fsdp-cpu-4.json"}
ONE_NUMBER = "04-fsdp-cpu-one-number-norm.json"
PAGES = {"en": ROOT / "lab" / "04-fsdp-from-scratch.md", "es": ROOT / "lab" / "04-fsdp-from-scratch.es.md"}


def report(world: int) -> dict:
    return json.loads((RESULTS / REPORTS[world]).read_text())


@pytest.mark.parametrize("world", REPORTS)
def test_the_committed_runs_pass_every_proof(world):
    """Every ruler holds on 2 and 4 ranks over the whole 450-step story (``--check --full``): the step
    drift with one process clipping by our norm, FSDP2 bit for bit at every step, the bytes, the
    order, the memory, the checkpoint. Beside it, reported: the drift when the one process clips
    with its own float32 norm (on 4 ranks above 1e-5 at one step, as FSDP2's own: the page's lesson)."""
    r = report(world)
    t = r["training"]
    assert r["world_size"] == world and t["steps"] == TrainConfig().steps and r["full"]
    assert r["criterion_pass"] is True and r["broken_rulers"] == [], r["broken_rulers"]
    assert r["fp32_max_step_drift"] <= 1e-5 and r["fp32_twin_clips_with"] == "run"
    assert r["fp64_max_step_drift"] <= 1e-12 and r["fp64_steps"] == 20
    assert r["same_as_pytorch"] and r["pytorch_max_diff"] == 0.0 and r["pytorch_steps"] == t["steps"]
    assert t["first_step_differing_from_fsdp2"] is None
    assert r["ranks_bit_identical"] and r["event_order_matches_fsdp2"] and r["memory_matches_model"]
    assert r["bytes_per_rank_per_step"] == r["bytes_model"] == r["bytes_fsdp2"]
    assert r["without_clipping"]["bit_identical"]
    assert set(r["checkpoint"]["loaded_at"]) == {"1", str(world)}
    assert all(d == 0.0 for d in r["checkpoint"]["loaded_at"].values())
    assert r["norms"]["ours_equals_fsdp2"]
    own = t["step_drift_own_norm"]
    assert own["max"] > r["fp32_max_step_drift"], "clipping with its own norm, the one process is further away"
    if world == 4:
        assert own["max"] > 1e-5, "on 4 ranks the own-norm drift goes over 1e-5 (FSDP2's too: bit-identical)"
    # the clipped steps are measured (max_norm = 1): the early ones, and a few late ones
    clipped = r["clipped_steps"]
    assert clipped[:10] == list(range(10)) and 0 < len(clipped) < t["steps"] and max(clipped) > 100


@pytest.mark.parametrize("world", REPORTS)
def test_the_models_in_the_reports_are_the_code_s(world):
    """The byte and memory models the runs were held to are what the code computes today, and
    the byte model is Lab 02's (its committed FSDP2 prediction at 2 ranks)."""
    r = report(world)
    assert r["bytes_model"] == model_bytes(TrainConfig(), world)
    for setting, o in r["orders"].items():
        assert o["memory_model"] == memory_model(TrainConfig(), world, setting), setting
    if world == 2:
        lab02 = json.loads((RESULTS / "02-crosscheck-cpu.json").read_text())
        assert r["bytes_model"] == lab02["variants"]["fsdp2"]["prediction"]["bytes"] == 2_922_240


@pytest.mark.parametrize("world", REPORTS)
def test_the_fragments_are_the_reports_rendered(tmp_path, world):
    copy = tmp_path / REPORTS[world]
    shutil.copy(RESULTS / REPORTS[world], copy)
    lab04.render(copy)
    for lang in ("en", "es"):
        name = f"{copy.stem}-{lang}.txt"
        assert (tmp_path / name).read_text() == (RESULTS / name).read_text(), f"re-render {REPORTS[world]}"
    assert (RESULTS / f"{copy.stem}-timeline-en.png").is_file() and (RESULTS / f"{copy.stem}-timeline-es.png").is_file()


@pytest.mark.parametrize("lang", PAGES)
def test_the_numbers_the_prose_states(lang):
    text = PAGES[lang].read_text(encoding="utf-8")
    r = report(2)
    last = r["training"]["last_step"]
    assert num(r["bytes_per_rank_per_step"], lang) in text
    # clipping's one all-reduce: one float32 per parameter (44), sent as a ring sends it on 2 ranks
    assert last["bytes_by_kind"]["all-reduce"] == 4 * r["norms"]["parameters"] == 176
    assert ("176 bytes" if lang == "en" else "176 bytes") in text and str(r["norms"]["parameters"]) in text
    steps = r["training"]["steps"]
    assert (f"{steps} AdamW steps" if lang == "en" else f"{steps} pasos de AdamW") in text


def test_the_one_number_norm_story():
    """Section 3's story, measured: with one all-reduce of one number the training leaves FSDP2 at the
    first step (its norm rounds differently); the one process clipping with that norm holds 1e-5; the
    one process clipping with its own norm does not (reported); FSDP2's order (our default) is FSDP2's
    to the bit, and its own-norm twin, reported, drifts further than the criterion's, "between a few
    millionths and about 1e-5" on two ranks: a chaotic number, 1.0e-5 in this page's run (an AVX-512
    Xeon), 6.7e-6 and 3.7e-6 there under the AVX2 and baseline kernel sets, 5.5e-6 on an AMD EPYC."""
    one_number = json.loads((RESULTS / ONE_NUMBER).read_text())
    t = one_number["training"]
    assert t["clip_norm"] == "one-number" and t["steps"] == TrainConfig().steps
    assert t["first_step_differing_from_fsdp2"] == 0 and one_number["pytorch_max_diff"] > 0
    assert one_number["criterion_pass"] and one_number["fp32_max_step_drift"] <= 1e-5
    assert t["step_drift_own_norm"]["max"] > 1e-5 > one_number["fp32_max_step_drift"]
    default = report(2)
    own = default["training"]["step_drift_own_norm"]["max"]
    assert default["same_as_pytorch"] and default["fp32_max_step_drift"] < own and 1e-6 < own < 2e-5
    said = {"en": "between a few millionths and about 1e-5", "es": "entre unas millonésimas y alrededor de 1e-5"}
    assert all(said[lang] in " ".join(_prose(lang).split()) for lang in PAGES)


def test_the_one_number_fragment_is_its_report_rendered(tmp_path):
    copy = tmp_path / ONE_NUMBER
    shutil.copy(RESULTS / ONE_NUMBER, copy)
    lab04.render(copy)
    for lang in ("en", "es"):
        name = f"{copy.stem}-{lang}.txt"
        assert (tmp_path / name).read_text() == (RESULTS / name).read_text(), f"re-render {ONE_NUMBER}"


def test_the_size_the_page_gives_our_fsdp():
    lines = sum(len(p.read_text().splitlines()) for p in (ROOT / "minigpt" / "parallel" / "fsdp_by_hand").glob("*.py"))
    assert lines < 1100, lines
    en, es = (" ".join(PAGES[lang].read_text().split()) for lang in ("en", "es"))
    assert "under 1,100 lines" in en and "menos de 1100 líneas" in es


# --- issue 29: statements the page makes about FSDP2 and about the run, and its picture ------------


def _prose(lang: str) -> str:
    """The page with its lines joined: a phrase may break across lines."""
    return " ".join(PAGES[lang].read_text(encoding="utf-8").split())


@pytest.mark.parametrize("lang", PAGES)
def test_fsdp2_copies_around_its_collectives(lang):
    """Section 5: FSDP2 is not copy-free. The installed torch copies the shards in before each
    all-gather and the gathered buffer out after it, and the gradients into the reduce-scatter's
    input; its streams are its own. The page names each function it says does so."""
    import inspect

    from torch.distributed.fsdp._fully_shard import _fsdp_collectives as c

    assert "all_gather_copy_in" in inspect.getsource(c.foreach_all_gather)
    assert "split_with_sizes_copy" in inspect.getsource(c.foreach_all_gather_copy_out)
    assert "chunk_cat" in inspect.getsource(c.foreach_reduce_scatter_copy_in)
    assert {"all_gather_copy_in_stream", "all_gather_stream"} <= set(inspect.signature(c.foreach_all_gather).parameters)
    assert "reduce_scatter_stream" in inspect.signature(c.foreach_reduce).parameters
    text = _prose(lang)
    for name in ("all_gather_copy_in", "split_with_sizes_copy", "chunk_cat"):
        assert f"`{name}`" in text, name
    assert "copy-free" not in text and "sin copias" not in text


@pytest.mark.parametrize("lang", PAGES)
def test_the_page_does_not_say_every_step_is_clipped(lang):
    """The default run clips only the steps whose norm is above max_norm: not every step."""
    r = report(2)
    assert 0 < len(r["clipped_steps"]) < r["training"]["steps"]
    text = _prose(lang).lower()
    assert "every step is clipped" not in text and "todos los pasos se recortan" not in text


@pytest.mark.parametrize("lang", PAGES)
def test_mixed_precision_is_named_as_the_course_s_class(lang):
    """Section 4: ``fsdp_by_hand.MixedPrecision`` (passed as ``mp=``) is the course's class, and
    FSDP2's is ``MixedPrecisionPolicy`` (passed as ``mp_policy=``), with the same two fields."""
    import dataclasses
    import inspect

    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard as torch_fully_shard

    from minigpt.parallel import fsdp_by_hand

    ours = [f.name for f in dataclasses.fields(fsdp_by_hand.MixedPrecision)]
    assert ours == ["param_dtype", "reduce_dtype"]
    assert set(ours) <= {f.name for f in dataclasses.fields(MixedPrecisionPolicy)}
    assert "mp" in inspect.signature(fsdp_by_hand.fully_shard).parameters
    assert "mp_policy" in inspect.signature(torch_fully_shard).parameters
    text = _prose(lang)
    for phrase in ("`fsdp_by_hand.MixedPrecision(param_dtype=torch.bfloat16,", "`fully_shard(module, mp=...)`"):
        assert phrase in text, phrase
    assert "`MixedPrecisionPolicy`" in text and "`fully_shard(module, mp_policy=...)`" in text


def test_the_unit_life_figure_is_the_committed_schedule():
    """Section 1's picture is drawn from the committed run's last step: the root gathered once and
    kept to the end, its forward before block 0's gather and its backward the first of backward, every
    block gathered twice, every gather of backward a prefetch issued by the unit before it in
    backward order; the page says so in both languages."""
    step = report(2)["training"]["last_step"]
    life = lab04.unit_life(step)
    blocks = [f"blocks.{i}" for i in range(TrainConfig().model_config().n_layer)]
    assert life["units"] == ["root", *blocks]
    assert len(life["gathered"]["root"]) == 1 and life["gathered"]["root"][0][1] > life["backward_from"]
    root = [(e["what"], e["at"]) for e in life["events"] if e["unit"] == "root"]
    assert [what for what, _ in root] == ["all-gather", "forward", "backward", "free", "reduce-scatter"], root
    assert root[1][1] + 1 == next(e["at"] for e in life["events"] if e["unit"] == "blocks.0")
    assert root[2][1] == next(e["at"] for e in life["events"] if e["what"] == "backward") > life["backward_from"]
    # the schedule, compared item by item with FSDP2's, names the blocks' computations only
    assert [e for e in step["schedule"] if e.startswith(("forward", "backward"))] == [
        *(f"forward {b}" for b in blocks),
        *(f"backward {b}" for b in blocks[::-1]),
    ]
    assert all(len(life["gathered"][b]) == 2 for b in blocks)
    prefetched = [e["unit"] for e in life["events"] if e["prefetch"]]
    backward_gathers = [
        e["unit"] for e in life["events"] if e["what"] == "all-gather" and e["at"] >= life["backward_from"]
    ]
    assert prefetched == backward_gathers == blocks[::-1]
    order = ["root", *blocks[::-1]]  # backward: the root first, then the last block
    assert life["issued_by"] == {u: order[i] for i, u in enumerate(order[1:])}
    sentence = {
        "en": "the root's asks for block 3, block 3's for block 2",
        "es": "el de la raíz pide el bloque 3, el del bloque 3 pide el bloque 2",
    }
    for lang in PAGES:
        text = _prose(lang)
        assert f"(../figures/fsdp-unit-life-{lang}.png)" in text
        assert sentence[lang] in text


# --- issue 29, part 2: the page's order, and the clipping story told from the measurement ---------


@pytest.mark.parametrize("lang", PAGES)
def test_the_page_shows_the_proofs_it_tells(lang):
    """Section 3 shows the rulers on 2 and 4 ranks, the clipping measured, the norms and the
    one-number run, each a generated block of the committed results; the spoiler table (the
    reference's file and line for each piece) comes after the exercises."""
    text = PAGES[lang].read_text(encoding="utf-8")
    for source in (
        "04-fsdp-cpu-{lang}.txt:proofs",
        "04-fsdp-cpu-{lang}.txt:clipping",
        "04-fsdp-cpu-{lang}.txt:norms",
        "04-fsdp-cpu-{lang}.txt:orders",
        "04-fsdp-cpu-{lang}.txt:precision",
        "04-fsdp-cpu-{lang}.txt:speed",
        "04-fsdp-cpu-4-{lang}.txt:proofs",
        "04-fsdp-cpu-one-number-norm-{lang}.txt:one-number",
    ):
        assert f"generated from lab/results/{source.format(lang=lang)}" in text, source
    spoiler = text.index(f"generated from build/tables/fsdp-side-by-side-{lang}.md")
    assert text.index("{ #your-exercises }") < text.index("{ #proofs }") < spoiler


@pytest.mark.parametrize("lang", PAGES)
def test_the_clipping_story_is_the_measurement(lang):
    """Section 3's clipping: the number of clipped steps the prose states is the run's; "most of the
    first fifty, and a few late ones"; the twin clipping by the run's norm is the criterion and holds,
    the one clipping by its own norm drifts further, its worst step a late clipped one (in the
    one-number run too); float64 "about 1e-15"."""
    r = report(2)
    clipped, steps = r["clipped_steps"], r["training"]["steps"]
    text = _prose(lang)
    stated = {
        "en": f"{len(clipped)} of the {steps} steps are clipped",
        "es": f"se recortan {len(clipped)} de los {steps}",
    }
    assert stated[lang] in text
    assert sum(s < 50 for s in clipped) > 25 and 0 < sum(s > 50 for s in clipped) <= 10  # "a few late ones"
    assert r["fp32_twin_clips_with"] == "run" and r["fp32_max_step_drift"] <= 1e-5
    for run in (r, json.loads((RESULTS / ONE_NUMBER).read_text())):
        own = run["training"]["step_drift_own_norm"]
        assert own["max"] > run["fp32_max_step_drift"] and own["worst_step"] in run["clipped_steps"]
        assert own["worst_step"] > 50, "a late clipped step"
        assert 1e-16 < run["fp64_max_step_drift"] < 1e-14


@pytest.mark.parametrize("lang", PAGES)
def test_the_page_s_peak_costs_are_the_run_s(lang):
    """The memory section's two costs are the committed run's peaks, subtracted: prefetching two blocks
    (half a block) and not resharding after forward (one block), and each recipe's step count."""
    r = report(2)
    peaks = {name: o["peak_held"] for name, o in r["orders"].items()}
    block = 4 * sum(p.numel() for p in build_model(TrainConfig()).blocks[0].parameters())  # float32 bytes
    two = peaks["backward prefetch 2"] - peaks["implicit"]
    keep = peaks["no reshard after forward"] - peaks["implicit"]
    assert (2 * two, keep) == (block, block), (two, keep, block)
    text = _prose(lang)
    assert f"({num(two, lang)} bytes)" in text and f"({num(keep, lang)} bytes)" in text, (two, keep)
    steps = {"en": "Five steps of each recipe", "es": "Cinco pasos de cada receta"}[lang]
    assert r["mixed_precision"]["steps"] == 5 and steps in text
