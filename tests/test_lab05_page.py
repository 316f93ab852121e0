"""The Lab 05 guide shows measured tables and makes a few claims; each is tied here to the committed
measurements (lab/results/05-*.json, written by ``make results-05``) or to the code that computes
them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from minigpt.pages import lab05
from minigpt.pages.lang import num
from minigpt.parallel.tensor_parallel import ring_attention_bytes, tp_bytes_per_step
from minigpt.runners.lab05_tensor_parallel import param_bytes_model
from minigpt.train import TrainConfig
from minigpt.zero import analytic as za

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "lab" / "results"
TP = {
    "adamw": "05-tensor-parallel-cpu.json",
    "sgd": "05-tensor-parallel-sgd-cpu.json",
    "sp4": "05-tensor-parallel-sp-4-cpu.json",
}
RING = {2: "05-ring-attention-cpu.json", 4: "05-ring-attention-4-cpu.json"}
PAGES = {
    "en": ROOT / "lab" / "05-tensor-and-context-parallel.md",
    "es": ROOT / "lab" / "05-tensor-and-context-parallel.es.md",
}


def load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


@pytest.mark.parametrize("run", TP)
def test_the_tensor_parallel_runs_prove_what_the_page_says(run):
    """One step equals one process (fp32 and fp64, with and without SP) and PyTorch's own TP (the same
    logits, bit for bit on 2 ranks, within 1e-6 on 4), the bytes and the parameters equal the models, the whole parameters stay
    bit-identical, the float64 drift is rounding. The float32 step drift over the whole run
    (``--check --full``) is reported: with AdamW it goes over 1e-5 late in the run, and PyTorch's own
    TP, cut the same way, goes as far (section 3's lesson); the control, one process with q, k, v as
    three layers, stays at rounding level."""
    r = load(TP[run])
    one, t = r["one_step"], r["training"]
    for mode in ("tp", "sp"):
        assert max(one["float32"][mode]["max_logit_diff"], one["float32"][mode]["max_grad_diff"]) <= 1e-5
        assert max(one["float64"][mode]["max_logit_diff"], one["float64"][mode]["max_grad_diff"]) <= 1e-12
        assert one["float32"][mode]["bytes_sent"] == r["bytes_model"]
    assert r["bytes_per_rank_per_step"] == r["bytes_model"]
    assert one["float32"]["tp"]["param_bytes"] == r["param_bytes_model"]
    assert t["replicated_bit_identical"] and r["fp64_max_step_drift"] <= 1e-12
    assert t["steps"] == TrainConfig().steps and r["full"] and r["criterion_pass"]
    assert one["float32"]["sp"]["saved_activation_bytes"] < one["float32"]["tp"]["saved_activation_bytes"]
    # two ranks: one partial sum per rank, the same two numbers added in either order, bit for bit; four
    # ranks with SP: our reduce-scatter adds four partials in another order than gloo's all-reduce
    assert r["pytorch_first_step_logit_diff"] <= (0.0 if r["world_size"] == 2 else 1e-6) and r["same_as_pytorch"]
    # reported, not judged alone: ours no further than twice PyTorch's on the same run
    assert r["fp32_max_step_drift"] <= max(1e-5, 2 * r["pytorch_fp32_max_step_drift"])
    assert r["control_fp32_max_step_drift"] < 1e-6, "splitting qkv alone moves the drift by rounding only"
    if run == "sgd":  # less than AdamW's, back to rounding level as the rate decays
        adamw = load(TP["adamw"])
        assert r["optimizer"] == "sgd" and r["fp32_max_step_drift"] < adamw["fp32_max_step_drift"]
        assert t["step_drift"]["final"] < 1e-10
    if run == "adamw":
        assert r["optimizer"] == "adamw" and r["fp32_max_step_drift"] > 1e-5 and r["pytorch_fp32_max_step_drift"] > 1e-5
        # "once training is well under way": the first step over 1e-5, ours and PyTorch's
        assert t["step_drift"]["first_step_above_tolerance"] >= t["steps"] // 4
        assert t["pytorch_step_drift"]["first_step_above_tolerance"] >= t["steps"] // 4
        assert t["tutor_accuracy"] > 0.9


@pytest.mark.parametrize("run", TP)
def test_the_models_in_the_reports_are_the_code_s(run):
    """The byte formula is theory page 02's V_TP per block plus the embedding's and the loss's
    all-reduces; the parameter count is what the code computes today."""
    r, cfg = load(TP[run]), TrainConfig()
    tp = r["tp"]
    ring = 2 * (tp - 1) / tp
    per_layer = za.tensor_parallel_bytes_per_layer(cfg.block_size, cfg.batch_size, cfg.n_embd, tp, 4)
    extra = ring * (2 * cfg.batch_size * cfg.block_size * cfg.n_embd + 3 * cfg.batch_size * cfg.block_size) * 4
    assert r["bytes_model"] == cfg.n_layer * per_layer + extra
    assert r["bytes_model"] == tp_bytes_per_step(cfg.batch_size, cfg.block_size, cfg.n_embd, cfg.n_layer, tp)
    assert r["param_bytes_model"] == param_bytes_model(cfg, tp)


@pytest.mark.parametrize("world", RING)
def test_the_ring_runs_prove_what_the_page_says(world):
    """Exact against full attention; (cp-1)/cp of K and V forward and backward; the balanced split
    equalises the scores needed, while every rank computes as many as the busiest contiguous rank."""
    r = load(RING[world])
    assert r["criterion_pass"] and r["cp"] == world and r["pytorch_impl"] is None
    assert r["fp64_max_step_drift"] <= 1e-12 and r["training"]["bytes_sent_per_step"] == r["bytes_model_per_step"]
    for c in r["cases"]:
        size = 4 if c["dtype"] == "float32" else 8
        expected = ring_attention_bytes(
            r["shape"]["batch"], r["shape"]["heads"], c["seq_len"], r["shape"]["head_dim"], world, size
        )
        assert c["bytes_model"] == expected and c["bytes_forward"] == c["bytes_backward"] == [expected] * world
        # "two thirds of V_CP in all": theory page 02's count for a hand-written backward
        kv_hidden = r["shape"]["heads"] * r["shape"]["head_dim"]
        v_cp = za.context_parallel_bytes_per_layer(c["seq_len"], r["shape"]["batch"], kv_hidden, world, size)
        assert 3 * (c["bytes_forward"][0] + c["bytes_backward"][0]) == 2 * v_cp, (c, v_cp)
    for seq_len in r["shape"]["seq_lens"]:
        plain, balanced = (
            next(
                c for c in r["cases"] if c["seq_len"] == seq_len and c["dtype"] == "float32" and c["load_balanced"] is b
            )
            for b in (False, True)
        )
        assert len(set(balanced["scores_needed"])) == 1 and len(set(plain["scores_needed"])) == world
        assert max(balanced["scores_computed"]) == max(plain["scores_computed"])


@pytest.mark.parametrize("name", [*TP.values(), *RING.values()])
def test_the_fragments_are_the_reports_rendered(tmp_path, name):
    copy = tmp_path / name
    shutil.copy(RESULTS / name, copy)
    lab05.render(copy)
    for lang in ("en", "es"):
        fragment = f"{copy.stem}-{lang}.txt"
        assert (tmp_path / fragment).read_text() == (RESULTS / fragment).read_text(), f"re-render {name}"


@pytest.mark.parametrize("lang", PAGES)
def test_the_page_shows_the_tables_and_links_the_theory(lang):
    text = PAGES[lang].read_text(encoding="utf-8")
    for name in ("05-tensor-parallel-cpu", "05-tensor-parallel-sgd-cpu", "05-tensor-parallel-sp-4-cpu"):
        assert f"generated from lab/results/{name}-{lang}.txt" in text, name
    assert f"generated from lab/results/05-ring-attention-4-cpu-{lang}.txt" in text
    suffix = ".md" if lang == "en" else ".es.md"
    theory = (ROOT / "theory" / f"02-parallelism-flavours{suffix}").read_text(encoding="utf-8")
    for anchor in ("#proofs", "#memory", "#ring"):
        assert f"05-tensor-and-context-parallel{suffix}{anchor}" in theory, anchor


# --- issue 29: the numbers the prose states, tied to the model's shapes, and the page's pictures ----


def _prose(lang: str) -> str:
    """The page with its lines joined: a phrase may break across lines."""
    return " ".join(PAGES[lang].read_text(encoding="utf-8").split())


def test_the_cut_model_s_shapes_are_the_page_s():
    """Built as the lab builds it (rank 0 of a pretend two-rank group): the sequence-parallel
    gradients the step all-reduces, the vocabulary columns a rank keeps, the MLP's slices: the page
    module's numbers, worked out from the whole model's shapes, are the cut model's."""
    from minigpt.model import GPTConfig, MiniGPT
    from minigpt.parallel.tensor_parallel import TPMiniGPT
    from tests.fake_world import fake_world

    with fake_world(0, 2):
        model = TPMiniGPT(MiniGPT(GPTConfig()), sequence_parallel=True)
        floats = sum(p.numel() for p in model.sequence_parallel_parameters())
        per_rank, start = model.wte.per_rank, model.wte.start
        fc, proj = tuple(model.blocks[0].mlp.fc.weight.shape), tuple(model.blocks[0].mlp.proj.weight.shape)
    assert floats == lab05.sequence_parallel_grad_floats() == 5184
    assert lab05.vocab_columns(2)[0] == (start, start + per_rank) == (0, 305)
    shapes = lab05.mlp_shapes(2)
    assert (shapes["fc_weight"], shapes["proj_weight"]) == (fc, proj) == ((192, 96), (96, 192))


@pytest.mark.parametrize("lang", PAGES)
def test_the_sequence_parallel_all_reduce_is_counted(lang):
    """Sections 1 and 5: 5,184 floats, 20,736 bytes that a ring on two ranks sends once per rank,
    about 20.7 KB per step."""
    floats, sent = lab05.sequence_parallel_grad_floats(), lab05.sequence_parallel_grad_bytes_sent(2)
    assert sent == 4 * floats == 20_736
    text = _prose(lang)
    assert f"{num(floats, lang)} floats" in text if lang == "en" else f"{num(floats, lang)} números" in text
    assert f"{num(sent, lang)} bytes" in text
    assert (f"{num(sent / 1000, lang, 1)} KB") in text
    assert "few kilobytes" not in text and "pocos kilobytes" not in text


@pytest.mark.parametrize("lang", PAGES)
def test_the_vocabulary_parallel_loss_keeps_this_rank_s_columns(lang):
    """Section 3 (memory) and section 1's picture: each rank keeps its V/tp columns of the logits."""
    (a0, b0), (a1, b1) = lab05.vocab_columns(2)
    text = _prose(lang)
    assert f"{a0}–{b0 - 1}" in text and f"{a1}–{b1 - 1}" in text
    phrase = f"{b0 - a0} of the {b1} padded columns" if lang == "en" else f"{b0 - a0} de las {b1} columnas con relleno"
    assert phrase in text
    assert "logits' softmax are kept whole" not in text and "el softmax de los logits" not in text


@pytest.mark.parametrize("lang", PAGES)
def test_the_mlp_picture_s_shapes_are_stated(lang):
    s = lab05.mlp_shapes(2)
    text = _prose(lang)
    for value in (f"{s['fc_weight'][0]} × {s['fc_weight'][1]}", f"{s['proj_weight'][0]} × {s['proj_weight'][1]}"):
        assert value in text, value
    assert f"{s['fc_weight'][0]} " in text and f"{s['hidden']} " in text


@pytest.mark.parametrize("lang", PAGES)
def test_the_page_shows_its_figures(lang):
    text = PAGES[lang].read_text(encoding="utf-8")
    for name in lab05.FIGURES:
        assert f"(../figures/{name}-{lang}.png)" in text, name


ONLINE_SOFTMAX = r"""$$
\begin{aligned}
m' &= \max\bigl(m,\ \max_j s_j\bigr), \\
\ell' &= e^{\,m - m'}\,\ell + \sum_j e^{\,s_j - m'}, \\
a' &= e^{\,m - m'}\,a + \sum_j e^{\,s_j - m'}\,v_j .
\end{aligned}
$$"""


def test_the_online_softmax_equation_is_online_softmax_step():
    """Section 1 writes the update as an equation; computed by hand, block by block, it is what
    ``online_softmax_step`` returns, and ``a / l`` at the end is the softmax of all the scores."""
    import math

    import torch

    from minigpt.parallel.tensor_parallel.ring_attention import online_softmax_step

    for lang in PAGES:
        assert ONLINE_SOFTMAX in PAGES[lang].read_text(encoding="utf-8"), lang
    gen = torch.Generator().manual_seed(0)
    blocks = [
        (torch.randn(5, 4, generator=gen, dtype=torch.float64), torch.randn(4, 3, generator=gen, dtype=torch.float64))
        for _ in range(3)
    ]
    blocks[1][0][0, :2] = -math.inf  # a masked key or two
    m = ell = a = None
    state = (None, None, None)
    for s, v in blocks:
        if m is None:  # the first block starts the sums
            m = s.amax(-1)
            ell, a = torch.exp(s - m[:, None]).sum(-1), torch.exp(s - m[:, None]) @ v
        else:
            m_new = torch.maximum(m, s.amax(-1))
            scale = torch.exp(m - m_new)
            ell = scale * ell + torch.exp(s - m_new[:, None]).sum(-1)
            a = scale[:, None] * a + torch.exp(s - m_new[:, None]) @ v
            m = m_new
        state = online_softmax_step(*state, s, v)
    assert torch.equal(state[0], m) and torch.allclose(state[1], ell) and torch.allclose(state[2], a)
    scores, values = torch.cat([s for s, _ in blocks], -1), torch.cat([v for _, v in blocks])
    assert torch.allclose(a / ell[:, None], torch.softmax(scores, -1) @ values)


@pytest.mark.parametrize("lang", PAGES)
def test_the_ring_masks_explain_the_scores_columns(lang):
    """The picture's counts are the mechanism's (positions, block_mask) and the committed run's
    "scores needed" and "scores computed"; the page works the first ones out."""
    r = load(RING[4])
    for c in (c for c in r["cases"] if c["dtype"] == "float32"):
        found = lab05.ring_scores(c["seq_len"], r["cp"], c["load_balanced"])
        assert (found["needed"], found["computed"]) == (c["scores_needed"], c["scores_computed"]), c["seq_len"]
    plain, balanced = lab05.ring_scores(32, 4, False), lab05.ring_scores(32, 4, True)
    assert plain["needed"][0] == sum(range(1, 9)) == 36
    text = _prose(lang)
    assert " · ".join(num(n, lang) for n in plain["needed"]) in text
    assert "1 + 2 + … + 8 = 36" in text
    needed, computed = balanced["needed"][0], balanced["computed"][0]
    gives = {"en": f"gives every rank {needed}", "es": f"da {needed} a cada rank"}
    all_of = {"en": f"all {computed} scores", "es": f"las {computed} puntuaciones"}
    assert gives[lang] in text and all_of[lang] in text
    assert len(set(balanced["computed"])) == 1 and balanced["computed"][0] == max(plain["computed"])


# --- issue 29, part 2: the proofs around the rulers, and the lessons they teach ------------------


@pytest.mark.parametrize("lang", PAGES)
def test_the_page_shows_the_rulers_and_the_lessons(lang):
    """Section 3 shows the rulers (AdamW, SGD, 4 ranks with SP), the drift beside PyTorch's own TP
    and the control (AdamW and SGD) and the memory; section 4 the ring and MiniGPT trained with
    context parallelism on 2 and 4 ranks; the exercises come before the proofs."""
    text = PAGES[lang].read_text(encoding="utf-8")
    for source in (
        "05-tensor-parallel-cpu-{lang}.txt:proofs",
        "05-tensor-parallel-cpu-{lang}.txt:drift",
        "05-tensor-parallel-cpu-{lang}.txt:memory",
        "05-tensor-parallel-sgd-cpu-{lang}.txt:drift",
        "05-tensor-parallel-sgd-cpu-{lang}.txt:proofs",
        "05-tensor-parallel-sp-4-cpu-{lang}.txt:proofs",
        "05-ring-attention-4-cpu-{lang}.txt:ring",
        "05-ring-attention-cpu-{lang}.txt:rulers",
        "05-ring-attention-4-cpu-{lang}.txt:rulers",
    ):
        assert f"generated from lab/results/{source.format(lang=lang)}" in text, source
    assert text.index("{ #your-exercises }") < text.index("{ #proofs }") < text.index("05-tensor-parallel-cpu-")


@pytest.mark.parametrize("lang", PAGES)
def test_what_the_page_says_of_the_drift_and_of_pytorch(lang):
    """The drift's lesson as the committed runs measured it: one step equal to PyTorch's bit for bit;
    over the run, ours no further than twice PyTorch's and PyTorch's above 1e-5 too (AdamW), the
    control at rounding level, SGD's drift PyTorch's within a factor 2 and back to rounding at the
    end; PyTorch's context parallelism stops on CPU with the error the page quotes; the short check
    trains the first steps the page says."""
    from minigpt.runners.lab05_tensor_parallel import DEFAULT_CHECK_STEPS

    adamw, sgd = load(TP["adamw"]), load(TP["sgd"])
    for r in (adamw, sgd):
        assert r["pytorch_first_step_logit_diff"] == 0.0 and r["control_fp32_max_step_drift"] < 1e-6
        assert r["fp32_max_step_drift"] <= 2 * r["pytorch_fp32_max_step_drift"]
    assert adamw["pytorch_fp32_max_step_drift"] > 1e-5
    assert 0.5 < sgd["fp32_max_step_drift"] / sgd["pytorch_fp32_max_step_drift"] < 2
    text = _prose(lang)
    error = (
        "Operator aten._scaled_dot_product_flash_attention_for_cpu.default does not have a sharding strategy registered"
    )
    assert error in text
    for world in RING:
        r = load(RING[world])
        assert r["pytorch_impl"] is None and error in r["pytorch_impl_reason"]
        assert r["fp32_max_step_drift"] > 0 and r["criterion_pass"]
    steps = TrainConfig().steps
    said = {
        "en": f"the first {DEFAULT_CHECK_STEPS} of the run's {steps} steps",
        "es": f"los primeros {DEFAULT_CHECK_STEPS} de los {steps} pasos",
    }
    assert said[lang] in text
