"""The theory pages' arithmetic, tables and figures are the code's.

* The formulas of ``minigpt.zero.analytic`` against numbers from outside the code: the ZeRO
  paper's Table 1, 16 bytes per parameter, the ring's 2(N-1)/N, the pipeline simulation.
* ``python -m minigpt.pages`` writes every registered table and figure in both languages.
* Every table a page includes and every figure it shows is registered, in the page's language.
* Every worked-example number written in the prose of a page (English and Spanish) is the one the
  code computes, and the Python snippets on the pages print what their comments say.

Plain tests (no points): they check the course's own material, not the learner's work.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from minigpt.zero import analytic as za, memory, pipeline

ROOT = Path(__file__).resolve().parent.parent
THEORY = ROOT / "theory"
PAGES = ["00-motivation", "01-data-parallel-zero-fsdp", "02-parallelism-flavours", "03-fsdp-in-practice"]
LANGS = ("en", "es")


def page_path(stem: str, lang: str) -> Path:
    return THEORY / (f"{stem}.md" if lang == "en" else f"{stem}.es.md")


def page_text(stem: str, lang: str) -> str:
    return page_path(stem, lang).read_text(encoding="utf-8")


# --- the formulas against numbers from outside the code ---------------------------------------

# Rajbhandari et al. (2020), Table 1: GB per device, Psi = 7.5B, K = 12, as printed in the paper.
ZERO_TABLE_1 = {
    1: ("120", "120", "120", "120"),
    4: ("120", "52.5", "41.3", "30"),
    16: ("120", "35.6", "21.6", "7.5"),
    64: ("120", "31.4", "16.6", "1.88"),
}


@pytest.mark.parametrize("n", sorted(ZERO_TABLE_1))
def test_zero_paper_table_1(n):
    got = tuple(za.paper_round(za.model_state_bytes(7.5e9, n, stage).total / za.GB) for stage in za.STAGES)
    assert got == ZERO_TABLE_1[n]


def test_zero_memory_formulas():
    psi, n, k = 1000.0, 8, 12
    expected = {
        0: (2 + 2 + k) * psi,
        1: 2 * psi + 2 * psi + k * psi / n,
        2: 2 * psi + (2 + k) * psi / n,
        3: (2 + 2 + k) * psi / n,
    }
    for stage, total in expected.items():
        assert za.model_state_bytes(psi, n, stage, k).total == pytest.approx(total)
    with pytest.raises(ValueError, match="stage must be one of"):
        za.model_state_bytes(psi, n, 4)
    with pytest.raises(ValueError, match="n_devices must be a positive integer, got 0"):
        za.model_state_bytes(psi, 0, 1)


def test_sixteen_bytes_per_parameter_and_7b():
    assert za.bytes_per_param() == 16 == za.bytes_per_param(4, 4, 8)
    states = za.model_state_bytes(7e9)
    assert states.total == 112e9
    assert (states.params, states.grads, states.optimizer) == (14e9, 14e9, 84e9)


def test_paper_rounding():
    assert [za.paper_round(x) for x in (120.0, 41.25, 7.5, 1.875, 0.46875, 0.1171875, 30.0)] == [
        "120",
        "41.3",
        "7.5",
        "1.88",
        "0.47",
        "0.12",
        "30",
    ]


def test_ring_factors():
    assert [za.ring_factor(n) for n in (2, 4, 8)] == [1.0, 1.5, 1.75]
    assert [za.ring_factor(n, "reduce-scatter") for n in (2, 4, 8)] == [0.5, 0.75, 0.875]
    assert za.ring_factor(8, "all-gather") == 0.875
    assert za.ring_factor(1) == 0.0
    assert all(za.ring_factor(n) < 2 for n in range(1, 2000))
    assert za.ring_steps(8) == 14 and za.ring_steps(8, "all-gather") == 7
    assert za.ring_bytes_per_worker(100, 8) == 175 and za.naive_root_bytes(100, 8) == 700
    with pytest.raises(ValueError, match="op must be one of"):
        za.ring_factor(4, "broadcast")


def test_comm_volume():
    psi = 7.5e9
    assert [za.comm_volume(psi, s) for s in za.STAGES] == [2 * psi, 2 * psi, 2 * psi, 3 * psi]
    assert za.comm_volume(psi, 3, n_devices=4) == pytest.approx(3 * psi * 3 / 4)
    assert za.comm_volume(psi, 0, n_devices=8) == pytest.approx(za.ring_factor(8) * psi)


def test_activation_formulas():
    s, b, h, a = 2048, 2, 1024, 16
    sbh = s * b * h
    assert za.activation_bytes_per_layer(s, b, h, a) == pytest.approx(sbh * (34 + 5 * a * s / h))
    assert za.activation_bytes_per_layer(s, b, h, a, recompute="selective") == pytest.approx(34 * sbh)
    assert za.activation_bytes_per_layer(s, b, h, a, recompute="full") == 2 * sbh
    assert za.activation_bytes_per_layer(s, b, h, a, tensor_parallel=4) == pytest.approx(
        sbh * (10 + 24 / 4 + 5 * a * s / (h * 4))
    )
    assert za.activation_bytes_per_layer(s, b, h, a, tensor_parallel=4, sequence_parallel=True) == pytest.approx(
        sbh * (34 / 4 + 5 * a * s / (h * 4))
    )


def test_context_parallel_traffic():
    """Ring attention: a key/value block of 2sbh_kv/c elements makes c - 1 hops forward, and c - 1
    backward with its gradient beside it (one hop more for the gradient, home, in PyTorch's)."""
    s, b, h, c = 4096, 1, 4096, 8
    block = 2 * s * b * h * 2 / c  # bf16 keys and values of s/c tokens
    assert za.context_parallel_bytes_per_layer(s, b, h, c) == pytest.approx(3 * (c - 1) * block)
    assert za.context_parallel_bytes_per_layer(s, b, h, c, gradients_home=True) == pytest.approx(
        (3 * (c - 1) + 1) * block
    )
    assert za.context_parallel_bytes_per_layer(s, b, h, 1, gradients_home=True) == 0
    # forward alone is a third: 2 (c-1)/c s b h_kv elements
    assert za.context_parallel_bytes_per_layer(s, b, h, c) / 3 == pytest.approx(2 * (c - 1) / c * s * b * h * 2)


def test_sequence_parallel_divides_every_activation_by_t():
    s, b, h, a, t = 4096, 1, 4096, 32, 8
    alone = za.activation_bytes_per_layer(s, b, h, a)
    assert za.activation_bytes_per_layer(s, b, h, a, tensor_parallel=t, sequence_parallel=True) == pytest.approx(
        alone / t
    )
    # without it the 10 sbh between the tensor-parallel regions stay whole
    assert za.activation_bytes_per_layer(s, b, h, a, tensor_parallel=t) == pytest.approx(
        alone / t + 10 * s * b * h * (1 - 1 / t)
    )


def test_tensor_parallel_traffic():
    # 4 all-reduces per layer of b*s*h bf16 values, each 2(t-1)/t of the buffer
    assert za.tensor_parallel_bytes_per_layer(4096, 1, 4096, 8) == 4 * 1.75 * 4096 * 4096 * 2


@pytest.mark.parametrize("schedule", pipeline.SCHEDULES)
@pytest.mark.parametrize("stages,micro", [(1, 4), (2, 3), (4, 1), (4, 8), (8, 32), (3, 7)])
def test_pipeline_simulation_matches_bubble_formula(schedule, stages, micro):
    ops = pipeline.simulate(schedule, stages, micro)
    assert len(ops) == 2 * stages * micro
    assert pipeline.measured_bubble_fraction(ops) == pytest.approx(za.bubble_fraction(stages, micro))
    peaks = [pipeline.peak_in_flight(ops, s) for s in range(stages)]
    if schedule == "gpipe":
        assert peaks == [micro] * stages
    else:
        assert peaks == [min(stages - s, micro) for s in range(stages)]


def test_bubble_fraction():
    assert za.bubble_fraction(4, 8) == pytest.approx(3 / 11)
    assert za.bubble_fraction(1, 5) == 0
    with pytest.raises(ValueError, match="micro_batches must be a positive integer"):
        za.bubble_fraction(4, 0)


def test_hsdp_degrees():
    assert za.hsdp_degrees(16, 8) == (8, 2)
    assert za.hsdp_degrees(16, 8, shard_degree=4) == (4, 4)
    assert za.hsdp_degrees(16, 8, replicas=4) == (4, 4)
    assert za.hsdp_degrees(16, 8, 8, 2) == (8, 2)
    assert za.hsdp_degrees(32, 8, 16) == (16, 2)
    with pytest.raises(ValueError, match=r"shard_degree 8 x replicas 3 = 24, but the world size is 16"):
        za.hsdp_degrees(16, 8, 8, 3)
    with pytest.raises(ValueError, match="shard_degree 6 does not divide the world size 16"):
        za.hsdp_degrees(16, 8, shard_degree=6)
    with pytest.raises(ValueError, match="replicas 5 does not divide the world size 16"):
        za.hsdp_degrees(16, 8, replicas=5)
    with pytest.raises(ValueError, match="world size 12 is not a whole number of nodes of 8"):
        za.hsdp_degrees(12, 8)
    with pytest.raises(ValueError, match="shard_degree must be a positive integer, got 0"):
        za.hsdp_degrees(16, 8, shard_degree=0)
    shard_groups, replica_groups = za.hsdp_groups(4, 2)
    assert shard_groups == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert replica_groups == [[0, 4], [1, 5], [2, 6], [3, 7]]


def test_batch_and_learning_rate():
    assert za.effective_batch_size(8, 4, 16) == 512
    assert za.scaled_lr(3e-3, 64, 512) == pytest.approx(2.4e-2)
    assert za.scaled_lr(3e-3, 64, 512, "sqrt") == pytest.approx(3e-3 * math.sqrt(8))
    with pytest.raises(ValueError, match="rule must be one of"):
        za.scaled_lr(3e-3, 64, 512, "cubic")


def test_global_grad_norm_is_the_norm_of_the_whole_vector():
    import numpy as np

    rng = np.random.default_rng(0)
    grad = rng.standard_normal(1000)
    shards = np.array_split(grad, 7)
    local2 = [float(np.linalg.norm(s)) for s in shards]
    assert za.global_grad_norm(local2) == pytest.approx(float(np.linalg.norm(grad)))
    local_inf = [float(np.abs(s).max()) for s in shards]
    assert za.global_grad_norm(local_inf, math.inf) == pytest.approx(float(np.abs(grad).max()))
    # a replicated piece is counted once, not once per rank
    assert za.global_grad_norm([3.0, 4.0], replicated_norm=12.0) == pytest.approx(13.0)
    assert za.clip_coefficient(0.5, 1.0) == 1.0
    assert za.clip_coefficient(2.6, 1.0) == pytest.approx(1 / (2.6 + 1e-6))


def test_fsdp_memory_and_checkpoints():
    m = za.fsdp_memory(8e9, 8, unit_params=1e8)
    assert (m.sharded_params, m.sharded_grads, m.optimizer, m.gathered, m.unsharded_grad) == (4e9, 4e9, 8e9, 4e8, 2e8)
    # the unit's whole gradient before its reduce-scatter is counted, as in Lab 02's ZeRO-3 working
    # buffer: one unit for the whole 7B model on 8 devices needs 16Ψ/N + 4Ψ = 42 GB, not 28 GB
    from minigpt.pages import theory as T

    whole = za.fsdp_memory(T.PSI_7B, 8, T.PSI_7B, units_in_flight=1)
    assert whole.gathered + whole.unsharded_grad == memory.working_buffer(3, T.PSI_7B, memory.RECIPES["mixed"])
    assert whole.total == 42e9
    assert za.checkpoint_bytes(7e9) == 84e9


def test_logits_bytes():
    assert memory.logits_bytes(8, 4096, 128_256, with_grad=False) == 8 * 4096 * 128_256 * 4
    assert memory.logits_bytes(8, 4096, 128_256) == 2 * 8 * 4096 * 128_256 * 4
    assert memory.logits_bytes(2, 3, 5, bytes_per=2, with_grad=False) == 60
    with pytest.raises(ValueError, match="vocab must be a positive integer, got 0"):
        memory.logits_bytes(8, 4096, 0)


def test_the_chunked_loss_is_the_loss_and_the_whole_one_peaks_at_three_logits():
    """Theory 00, "The logits at the loss": chunked by sentences, MiniGPT's loss and gradients are the whole
    ones up to the order of the sums; the whole loss's passes peak at three [B, S, V] tensors (the kept
    log-softmax, the gradient arriving, the logits' gradient), and 16 chunks bring that below half of one."""
    from minigpt.fsdp.memory import loss_peaks
    from minigpt.logits import chunked_masked_loss

    unit = memory.logits_bytes(64, 32, 609, 4, with_grad=False)
    whole, _, sixteen = loss_peaks((1, 4, 16))
    assert 2.99 * unit < whole["peak_bytes"] < 3.01 * unit, whole["peak_bytes"] / unit
    assert sixteen["peak_bytes"] < 0.5 * unit and sixteen["loss_diff"] < 1e-5 and sixteen["grad_diff"] < 1e-7
    with pytest.raises(ValueError, match="at least 1"):
        chunked_masked_loss(*([None] * 4), 0)


def test_young_interval():
    tau, lost = memory.young_interval(10, 3600)  # a 10 s save, a failure every hour
    assert tau == pytest.approx(math.sqrt(72_000)) and lost == pytest.approx(10 / tau + tau / 7200)
    with pytest.raises(ValueError, match="both must be > 0"):
        memory.young_interval(0, 3600)


def test_tensor_parallel_on_each_link_against_the_layers_computation():
    """Theory 02: one layer of the 7B example computes in 1.55 ms on 8 GPUs at 400 TFLOP/s; its four
    all-reduces take less over NVLink, six times more over PCIe or InfiniBand HDR and over a hundred
    times more over 10 Gb/s Ethernet."""
    from minigpt.pages import theory
    from minigpt.pages.lab01_links import PAPER_LINKS
    from minigpt.parallel.links import ring_all_reduce_seconds

    compute = 6 * 12 * 4096**2 * 4096 / 8 / theory.GPU_FLOPS
    assert round(compute * 1e3, 2) == 1.55
    ratio = {
        names[0]: 4 * ring_all_reduce_seconds(4096 * 4096 * 2, 8, alpha, beta) / compute
        for names, alpha, beta in PAPER_LINKS
    }
    assert ratio["NVLink 4 (H100), per GPU"] < 1
    assert 5.5 < ratio["PCIe 4.0 x16"] < 6.5 and 5.5 < ratio["InfiniBand HDR, 200 Gb/s"] < 6.5
    assert 100 < ratio["10 Gb/s Ethernet (TCP)"] < 1000
    assert f"{ratio['PCIe 4.0 x16']:.2f} ×" in theory.tp_links("en")


def test_uneven_slices_need_their_losses_scaled():
    """Theory 01, "Uneven slices": rank r's loss times N B_r / B makes DDP's average the batch's gradient;
    without it, 40 + 24 sentences miss by 5.1 % of the largest element, 60 + 4 by half of it."""
    from minigpt.parallel.ddp import uneven_loss_scale, uneven_slices

    assert uneven_loss_scale(40, 64, 2) == 1.25 and uneven_loss_scale(24, 64, 2) == 0.75
    with pytest.raises(ValueError, match="65 of 64 rows"):
        uneven_loss_scale(65, 64, 2)
    found = {tuple(r["split"]): r for r in uneven_slices()}
    assert all(r["scaled"] < 1e-6 for r in found.values()) and found[32, 32]["plain"] < 1e-6
    assert round(100 * found[40, 24]["plain"], 1) == 5.1 and 0.45 < found[60, 4]["plain"] < 0.55


def test_data_parallel_degree_and_min_global_batch():
    assert za.data_parallel_degree(1024) == 1024 == za.min_global_batch(1024)
    assert za.data_parallel_degree(1024, tensor_parallel=8) == 128 == za.min_global_batch(1024, 8)
    assert za.min_global_batch(1024, 8, 4) == 32
    assert za.min_global_batch(1024, 8, 4, 2) == 16
    # one sequence per data-parallel rank: the smallest effective batch with micro-batch 1, no accumulation
    assert za.min_global_batch(64, 2) == za.effective_batch_size(1, 1, 32)
    # the SageMaker-style bookkeeping: processes per host x hosts / (tp x pp)
    assert za.data_parallel_degree(8 * 2, tensor_parallel=2, pipeline_parallel=2) == 4
    with pytest.raises(ValueError, match="= 24 does not divide the world size 1024"):
        za.data_parallel_degree(1024, tensor_parallel=8, pipeline_parallel=3)
    with pytest.raises(ValueError, match="tensor_parallel must be a positive integer, got 0"):
        za.min_global_batch(8, 0)


def test_zero_package_never_imports_torch():
    code = (
        "import sys; import minigpt.zero, minigpt.zero.analytic, minigpt.zero.pipeline; "
        "assert 'torch' not in sys.modules, 'minigpt.zero imported torch'"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


# --- the generator ----------------------------------------------------------------------------


def test_gpt_param_count_is_minigpts():
    from minigpt.model import GPTConfig, MiniGPT

    cfg = GPTConfig()
    model = MiniGPT(cfg)
    assert za.gpt_params(cfg.vocab_size, cfg.block_size, cfg.n_layer, cfg.n_embd) == model.num_params() == 507_552
    assert za.gpt_block_params(cfg.n_embd) == sum(p.numel() for p in model.blocks[0].parameters())


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> tuple[Path, Path, list[str]]:
    """Every table and figure written once by ``python -m minigpt.pages`` into a temporary folder: the
    tables' folder, the figures' folder and the words it printed."""
    from minigpt.pages import site

    tables_dir, figures_dir = tmp_path_factory.mktemp("tables"), tmp_path_factory.mktemp("figures")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert site.main(["--tables-dir", str(tables_dir), "--figures-dir", str(figures_dir), "--no-pages"]) == 0
    return tables_dir, figures_dir, out.getvalue().split()


def test_generator_writes_every_table_and_figure(generated):
    from minigpt.pages import site

    tables_dir, figures_dir, printed = generated
    for name in site.FRAGMENTS:
        for lang in LANGS:
            assert str(tables_dir / f"{name}-{lang}.md") in printed
    for name in site.TABLES:
        shapes = []
        for lang in LANGS:
            path = tables_dir / f"{name}-{lang}.md"
            assert str(path) in printed
            lines = path.read_text(encoding="utf-8").splitlines()
            assert lines[0].startswith("| ") and set(lines[1]) <= set("|-: ")
            shapes.append((len(lines), {line.count(" | ") for line in lines}))
        assert shapes[0] == shapes[1], f"{name}: the English and Spanish tables differ in shape"
    for name in site.FIGURES:
        for lang in LANGS:
            path = figures_dir / f"{name}-{lang}.png"
            assert str(path) in printed
            assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


PLOTTING = ("matplotlib", "pillow")  # what draws a figure and writes its PNG: their versions decide its bytes


def drawing_stack() -> dict[str, str]:
    """The versions of :data:`PLOTTING` that ``constraints.txt`` pins for the newest Python the course supports
    on Linux, read and matched with ``make check-pins``' own reader (``.ci/check_pins.py``): the ones the
    committed figures are drawn with. An older Python gets older releases (Python 3.10: matplotlib 3.10),
    which lay text out a pixel or two differently."""
    spec = importlib.util.spec_from_file_location("check_pins", ROOT / ".ci" / "check_pins.py")
    check_pins = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # its dataclasses look it up
    spec.loader.exec_module(check_pins)
    path = ROOT / "constraints.txt"
    newest = check_pins.target_markers(check_pins.PYTHONS[-1], check_pins.SYSTEMS["linux-x86_64"])
    pins = check_pins.pins_for(check_pins.read_pins(path), newest, path)
    return {name: pins[name].version for name in PLOTTING}


def test_committed_figures_are_what_the_generator_draws(generated):
    """Each figure of figures/ (which the pages show on the forge and, through docs/figures, on the site)
    is byte for byte what ``python -m minigpt.pages`` draws now from the committed results, when matplotlib
    and Pillow are the releases the figures are drawn with (:func:`drawing_stack`)."""
    from importlib.metadata import version

    from minigpt.pages import site

    wanted = drawing_stack()
    here = {name: version(name) for name in PLOTTING}
    if here != wanted:
        python = f"Python {sys.version_info.major}.{sys.version_info.minor}"
        pytest.skip(
            f"figures/ is drawn with {' and '.join(f'{n} {v}' for n, v in wanted.items())} (constraints.txt's pins "
            f"for the newest Python); this {python} has {' and '.join(f'{n} {v}' for n, v in here.items())}, which "
            "place text a pixel or two apart, so the figures are not compared byte for byte"
        )
    _, figures_dir, _ = generated
    for name in site.FIGURES:
        for lang in LANGS:
            drawn = figures_dir / f"{name}-{lang}.png"
            committed = ROOT / "figures" / drawn.name
            assert committed.is_file() and committed.read_bytes() == drawn.read_bytes(), (
                f"figures/{drawn.name} is out of date: run python -m minigpt.pages and commit it"
            )


def test_number_formats():
    from minigpt.pages import lang as T

    assert [T.num(1234567.5, "en", 1), T.num(1234567.5, "es", 1)] == ["1,234,567.5", "1 234 567,5"]
    assert [T.num(1024, "en"), T.num(1024, "es"), T.num(16384, "es")] == ["1,024", "1024", "16 384"]
    assert [T.pct(3 / 11, "en"), T.pct(3 / 11, "es")] == ["27.3%", "27,3 %"]
    assert [T.size(112e9, "en", 0), T.size(2.0302e6, "es", 2)] == ["112 GB", "2,03 MB"]
    assert [T.sci(8.4853e-3, "en", 3), T.sci(2.4e-2, "es", 3)] == ["8.49e-3", "2,40e-2"]


# --- the pages --------------------------------------------------------------------------------

# a generated table, written into the page by python -m minigpt.pages (minigpt/pages/inline.py)
# (or, for Lab 03's reading of the installed PyTorch, included when the site is built)
INCLUDE = re.compile(r"^<!-- (?:generated from|build-time include:) build/tables/([\w-]+)-(en|es)\.md ", re.M)
FIGURE = re.compile(r"!\[[^\]]+\]\(\.\./figures/([\w-]+)-(en|es)\.png\)")
LINK = re.compile(r"\]\(([^)\s]+?\.md)(#[\w-]+)?\)")


@pytest.mark.parametrize("lang", LANGS)
@pytest.mark.parametrize("stem", PAGES)
def test_pages_include_registered_tables_and_figures(stem, lang):
    from minigpt.pages import site

    text = page_text(stem, lang)
    includes, figures = INCLUDE.findall(text), FIGURE.findall(text)
    assert includes, f"{stem} ({lang}) includes no generated table"
    for name, table_lang in includes:
        assert name in site.TABLES, f"{stem}: table {name!r} is not registered in minigpt.pages.site.TABLES"
        assert table_lang == lang, f"{stem} ({lang}) includes the {table_lang} version of {name}"
    for name, figure_lang in figures:
        assert name in site.FIGURES, f"{stem}: figure {name!r} is not registered in minigpt.pages.site.FIGURES"
        assert figure_lang == lang, f"{stem} ({lang}) shows the {figure_lang} version of {name}"
    assert "--8<--" not in text, f"{stem} ({lang}) has an include line: run python -m minigpt.pages"


def test_every_registered_table_and_figure_is_used():
    from minigpt.pages import site

    text = "".join(page_text(stem, lang) for stem in PAGES for lang in LANGS)
    text += "".join(p.read_text(encoding="utf-8") for p in sorted((ROOT / "lab").glob("[0-9][0-9]-*.md")))
    used_tables = {name for name, _ in INCLUDE.findall(text)}
    used_figures = {name for name, _ in FIGURE.findall(text)}
    assert used_tables == set(site.TABLES) | set(site.FRAGMENTS)
    assert used_figures == set(site.FIGURES)


def heading_ids(path: Path) -> set[str]:
    return set(re.findall(r"^#+ .*\{ *#([\w-]+) *\}\s*$", path.read_text(encoding="utf-8"), re.M))


@pytest.mark.parametrize("lang", LANGS)
@pytest.mark.parametrize("stem", PAGES)
def test_links_resolve_and_spanish_pages_link_to_spanish_twins(stem, lang):
    path = page_path(stem, lang)
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    twin = path.name.replace(".es.md", ".md") if lang == "es" else path.name.replace(".md", ".es.md")
    for target, anchor in LINK.findall(text):
        resolved = (path.parent / target).resolve()
        assert resolved.is_file(), f"{path.name}: broken link {target}"
        if target != twin:
            assert target.endswith(".es.md") == (lang == "es"), f"{path.name}: link {target} is in the wrong language"
        if anchor and resolved.is_file():
            assert anchor[1:] in heading_ids(resolved), f"{path.name}: no heading {anchor} in {target}"


@pytest.mark.parametrize("stem", PAGES)
def test_collapsible_quizzes_match_between_languages(stem):
    en, es = (re.findall(r"^\?\?\? (\w+)", page_text(stem, lang), re.M) for lang in LANGS)
    assert en and en == es


PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.M | re.S)


@pytest.mark.parametrize("lang", LANGS)
@pytest.mark.parametrize("stem", PAGES)
def test_page_snippets_print_what_they_say(stem, lang):
    """A Python block with print(...) calls is run; each print's trailing comment is its output."""
    for code in PYTHON_BLOCK.findall(page_text(stem, lang)):
        if "print(" not in code:
            continue  # an API illustration that needs a process group or a GPU
        expected = [line.split("#", 1)[1].strip() for line in code.splitlines() if line.startswith("print(")]
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code, f"{stem}.{lang}", "exec"), {})
        assert out.getvalue().splitlines() == expected, code


# --- the worked examples in the prose ---------------------------------------------------------


def _prose_numbers():
    """(page, function(lang) -> the exact text the page must contain)."""
    from minigpt.pages import theory as T

    def t(en, es):
        return lambda lang: en if lang == "en" else es

    def act(s, **kw):
        return za.activation_bytes_per_layer(s, 1, T.SHAPE_7B["n_embd"], T.SHAPE_7B["n_head"], **kw)

    def ten_pow(x, exponent):
        return lambda lang: (
            T.localize(f"{x / 10**exponent:.1f}", lang).replace(",", "{,}") + f" \\times 10^{{{exponent}}}"
        )

    d = T.minigpt_train_defaults()
    params = T.minigpt_params()
    flops_7b = za.training_flops(T.PSI_7B, T.TOKENS_7B)
    minigpt_tokens = d["steps"] * d["batch_size"] * d["block_size"]
    minigpt_act = d["n_layer"] * za.activation_bytes_per_layer(
        d["block_size"], d["batch_size"], d["n_embd"], d["n_head"]
    )
    grad_bytes = 4 * params
    mem7 = za.fsdp_memory(T.PSI_7B, 8, za.gpt_block_params(4096))
    whole7 = za.fsdp_memory(T.PSI_7B, 8, T.PSI_7B, units_in_flight=1)
    ckpt = za.checkpoint_bytes(T.PSI_7B)
    norm = za.global_grad_norm(T.GRAD_NORM_EXAMPLE)
    min_micro = next(m for m in range(1, 1000) if za.bubble_fraction(8, m) <= 0.1)
    batch = za.effective_batch_size(64, 2, 4)

    def gb(x, dec):
        return lambda lang: T.size(x, lang, dec, "GB")

    def paper(n, stage):
        return lambda lang: (
            T.localize(za.paper_round(za.model_state_bytes(T.PSI_ZERO_PAPER, n, stage).total / za.GB), lang) + " GB"
        )

    logits = T.LOGITS_EXAMPLE
    practice = json.loads((ROOT / "lab/results/03-practice-cpu.json").read_text(encoding="utf-8"))
    ac = practice["activation-checkpointing"]["variants"]
    plain, ckpt_run = ac["plain"], ac["checkpointed"]

    def change(key, phase=None):
        def value(v):
            return v[key] if phase is None else v[key][phase]

        return value(ckpt_run) / value(plain) - 1

    def ms(variant):
        return lambda lang: T.num(1000 * variant["median_step_s"], lang, 1) + " ms"

    def mb(variant, phase):
        return lambda lang: T.num(variant["phase_peak_bytes"][phase] / 1e6, lang, 2) + " MB"

    rank_batch = practice["meta"]["batch_size"] // practice["meta"]["world_size"]
    world, tp, pp = T.MIN_BATCH_WORLD, T.MIN_BATCH_TP, T.MIN_BATCH_PP

    p00, p01, p02, p03 = PAGES
    return [
        (p00, gb(memory.logits_bytes(**logits, with_grad=False), 2)),  # 16.81 GB
        (p00, gb(memory.logits_bytes(**logits), 2)),  # 33.62 GB
        (
            p00,
            gb(32 * za.activation_bytes_per_layer(logits["seq_len"], logits["batch"], 4096, 32, recompute="full"), 2),
        ),
        (p00, lambda lang: "$V = " + T.num(logits["vocab"], lang).replace(",", "{,}").replace(" ", "\\,") + "$"),
        # Lab 03's measured activation checkpointing, quoted on page 03
        (p03, lambda lang: T.tr(lang, "took ", "tardó un ") + T.pct(change("median_step_s"), lang, 0)),  # 15%
        (p03, lambda lang: T.pct(-change("phase_peak_bytes", "forward"), lang, 0)),  # 76%
        (p03, lambda lang: T.pct(-change("phase_peak_bytes", "backward"), lang, 0)),  # 63%
        (p03, ms(plain)),
        (p03, ms(ckpt_run)),
        (p03, mb(plain, "forward")),
        (p03, mb(ckpt_run, "forward")),
        (p03, mb(plain, "backward")),
        (p03, mb(ckpt_run, "backward")),
        (
            p03,
            lambda lang: T.size(
                memory.logits_bytes(rank_batch, d["block_size"], T.minigpt_vocab(), with_grad=False), lang, 2, "MB"
            ),
        ),
        (p03, lambda lang: f"${rank_batch} \\cdot {d['block_size']} \\cdot {T.minigpt_vocab()} \\cdot 4$"),
        (
            p03,
            lambda lang: (
                f"the {plain['all_gathers']} all-gathers and {plain['reduce_scatters']} reduce-scatters"
                if lang == "en"
                else f"los {plain['all_gathers']} all-gathers y {plain['reduce_scatters']} reduce-scatters"
            ),
        ),
        # the minimum batch: one sequence per data-parallel rank
        (p02, lambda lang: T.num(world, lang) + T.tr(lang, " devices", " dispositivos")),
        (p02, lambda lang: "= " + T.num(za.min_global_batch(world), lang) + T.tr(lang, " sequences", " secuencias")),
        (p02, lambda lang: T.num(za.min_global_batch(world) * T.SEQ_7B, lang) + " tokens"),
        (
            p02,
            lambda lang: "= " + T.num(za.min_global_batch(world, tp), lang) + T.tr(lang, " sequences", " secuencias"),
        ),
        (p02, lambda lang: T.num(za.min_global_batch(world, tp) * T.SEQ_7B, lang) + " tokens"),
        (p02, lambda lang: "= " + T.num(za.min_global_batch(world, tp, pp), lang) + "$"),
        (p02, lambda lang: T.pct(za.bubble_fraction(pp, 1), lang, 0)),  # 75%
        (p00, gb(za.model_state_bytes(T.PSI_7B).total, 0)),  # 112 GB
        (p00, gb(za.model_state_bytes(T.PSI_7B).optimizer, 0)),  # 84 GB
        (p00, gb(za.model_state_bytes(T.PSI_7B).params, 0)),  # 14 GB
        (p00, gb(act(4096), 2)),  # 3.25 GB per layer
        (p00, gb(32 * act(4096), 1)),  # 104.2 GB
        (p00, gb(act(8192), 2)),  # 11.88 GB
        (p00, lambda lang: T.num(params, lang) + T.tr(lang, " parameters", " parámetros")),
        (p00, lambda lang: T.size(za.bytes_per_param() * params, lang, 2, "MB")),  # 8.12 MB
        (p00, lambda lang: T.size(minigpt_act, lang, 1, "MB")),  # 32.0 MB
        (p00, ten_pow(flops_7b, 22)),  # 4.2 x 10^22
        (
            p00,
            lambda lang: (
                T.num(za.training_days(flops_7b, 1, T.SUSTAINED_FLOPS), lang, 1) + T.tr(lang, " days", " días")
            ),
        ),  # 1,215.3 days
        (
            p00,
            lambda lang: (
                T.num(za.training_days(flops_7b, 1024, T.SUSTAINED_FLOPS), lang, 1) + T.tr(lang, " days", " días")
            ),
        ),  # 1.2 days
        (p00, lambda lang: T.num(minigpt_tokens, lang) + T.tr(lang, " token positions", " posiciones")),
        (p00, ten_pow(za.training_flops(params, minigpt_tokens), 12)),  # 2.8 x 10^12
        (p00, gb(za.model_state_bytes(13e9).total, 0)),  # 208 GB
        (p01, lambda lang: "$S$ = " + T.size(grad_bytes, lang, 2, "MB")),  # 2.03 MB
        (p01, lambda lang: T.size(za.ring_bytes_per_worker(grad_bytes, 8), lang, 2, "MB")),  # 3.55 MB
        (p01, lambda lang: T.size(za.naive_root_bytes(grad_bytes, 8), lang, 2, "MB")),  # 14.21 MB
        (p01, lambda lang: T.num(za.ring_factor(8), lang, 2) + T.tr(lang, " times", " veces")),  # 1.75
        (p01, paper(64, 0)),
        (p01, paper(64, 1)),
        (p01, paper(64, 2)),
        (p01, paper(64, 3)),
        (p01, paper(16, 2)),  # 21.6 GB
        (
            p01,
            lambda lang: T.num(za.comm_volume(1, 3) / za.comm_volume(1, 0), lang, 1) + T.tr(lang, " times", " veces"),
        ),  # 1.5 times
        (p01, gb(2 * za.comm_volume(T.PSI_ZERO_PAPER, 0), 0)),  # 30 GB
        (p01, gb(2 * za.comm_volume(T.PSI_ZERO_PAPER, 3), 0)),  # 45 GB
        (p01, lambda lang: T.num(za.ring_bytes_per_worker(100, 8), lang) + " MB"),  # 175 MB
        (p01, lambda lang: T.num(za.naive_root_bytes(100, 8), lang) + " MB"),  # 700 MB
        (p02, lambda lang: T.size(za.tensor_parallel_bytes_per_layer(4096, 1, 4096, 8), lang, 1, "MB")),
        (p02, gb(32 * za.tensor_parallel_bytes_per_layer(4096, 1, 4096, 8), 2)),  # 7.52 GB
        (p02, lambda lang: T.pct(za.bubble_fraction(4, 8), lang)),  # 27.3%
        (p02, lambda lang: T.pct(za.bubble_fraction(4, 32), lang)),  # 8.6%
        (p02, lambda lang: T.pct(za.bubble_fraction(8, 64), lang)),  # 9.9%
        (p02, lambda lang: f"9(p-1) = {min_micro}"),
        (p02, lambda lang: T.tr(lang, f"a batch of {batch}", f"un lote de {batch}")),
        (p02, lambda lang: T.sci(za.scaled_lr(d["lr"], d["batch_size"], batch), lang, 3)),
        (p02, lambda lang: T.sci(za.scaled_lr(d["lr"], d["batch_size"], batch, "sqrt"), lang, 3)),
        (p02, gb(32 * act(4096), 1)),  # 104.2 GB
        (p02, gb(32 * act(4096, recompute="selective"), 1)),  # 18.3 GB
        (p02, gb(32 * act(4096, recompute="full"), 1)),  # 1.1 GB
        # the backward peak under full recomputation: every input plus one layer recomputed (Lab 02's count)
        (p02, gb(act(4096), 2)),  # 3.25 GB
        (p02, gb(memory.activation_bytes(32, 4096, 1, 4096, 32, checkpointing=True), 2)),  # 4.33 GB
        # sequence parallelism: tensor parallelism alone divides by 5.9, with SP by t = 8
        (p02, lambda lang: T.tr(lang, "by ", "entre ") + T.num(act(4096) / act(4096, tensor_parallel=8), lang, 1)),
        (p02, gb(32 * act(4096, tensor_parallel=8, sequence_parallel=True), 1)),  # 13.0 GB
        (p02, gb(32 * act(4096, tensor_parallel=8), 1)),  # 17.7 GB
        (p02, gb(32 * act(4096, tensor_parallel=8, sequence_parallel=True, recompute="selective"), 1)),  # 2.3 GB
        (p02, gb(32 * act(4096, tensor_parallel=8, recompute="selective"), 1)),  # 7.0 GB
        # ring attention, forward and backward, against tensor parallelism's 234.9 MB
        (p02, lambda lang: T.size(za.context_parallel_bytes_per_layer(4096, 1, 4096, 8), lang, 1, "MB")),
        (
            p02,
            lambda lang: T.size(
                za.context_parallel_bytes_per_layer(4096, 1, 4096, 8, gradients_home=True), lang, 1, "MB"
            ),
        ),
        (p02, lambda lang: f"= {za.effective_batch_size(8, 4, 4 * 4)}$"),
        (
            p02,
            t("stage 0 holds 4 instead of 8", "la etapa 0 guarda 4 en lugar de 8")
            if [pipeline.peak_in_flight(pipeline.simulate(s, 4, 8), 0) for s in ("1f1b", "gpipe")] == [4, 8]
            else t("(simulated peaks changed)", "(simulated peaks changed)"),
        ),
        (p03, lambda lang: T.num(za.gpt_block_params(4096), lang) + T.tr(lang, " parameters", " parámetros")),
        (p03, lambda lang: T.num(za.gpt_block_params(d["n_embd"]), lang) + T.tr(lang, " for MiniGPT", " para MiniGPT")),
        (p03, gb(mem7.total, 2)),  # 15.21 GB
        (p03, gb(whole7.total, 2)),  # 42.00 GB
        (p03, gb(16 * T.PSI_7B, 2)),  # 112.00 GB
        (p03, gb(4 * T.PSI_7B, 0)),  # 28 GB per rank
        (p03, gb(8 * 4 * T.PSI_7B, 0)),  # 224 GB
        (p03, gb(ckpt, 1)),  # 84.0 GB
        (p03, gb(ckpt / 8, 1)),  # 10.5 GB
        (p03, gb(ckpt / 16, 2)),  # 5.25 GB
        (p03, lambda lang: T.num(norm, lang, 2)),  # 2.60
        (p03, lambda lang: T.num(za.clip_coefficient(norm, T.GRAD_NORM_MAX), lang, 3)),  # 0.385
        (p03, lambda lang: T.num(za.clip_coefficient(T.GRAD_NORM_EXAMPLE[2], T.GRAD_NORM_MAX), lang, 3)),
    ]


def test_worked_examples_in_the_prose_are_the_codes():
    missing = []
    for stem, expected in _prose_numbers():
        for lang in LANGS:
            text = expected(lang)
            if text not in page_text(stem, lang):
                missing.append(f"{page_path(stem, lang).name}: {text!r}")
    assert not missing, "numbers the code computes but the pages do not say:\n" + "\n".join(missing)


# --- issue 29: statements of pages 02 and 03, tied to the code and to the installed PyTorch -------


def _prose(stem: str, lang: str) -> str:
    """A page with its lines joined: a phrase may break across lines."""
    return " ".join(page_text(stem, lang).split())


@pytest.mark.parametrize("lang", LANGS)
def test_the_10sbh_term_is_norm_inputs_outputs_and_dropout_masks(lang):
    """Page 02: the activations tensor parallelism leaves whole are the two layer norms' inputs
    (4 sbh) and outputs (4 sbh) and the two dropout masks (2 sbh): the constant of Korthikanti et
    al.'s sbh(10 + 24/t + 5as/(ht)), as minigpt.zero.analytic computes it."""
    s, b, h, a = 4096, 1, 4096, 32
    one, two = (za.activation_bytes_per_layer(s, b, h, a, tensor_parallel=t) for t in (1, 2))
    assert 2 * two - one == 10 * s * b * h == (4 + 4 + 2) * s * b * h
    text = _prose("02-parallelism-flavours", lang)
    for term in (r"$4\,sbh$", r"$2\,sbh$", r"$10\,sbh$", "Korthikanti et al., 2022"):
        assert term in text, term
    assert text.count(r"$4\,sbh$") == 2
    assert (
        "the dropout masks, the residual stream" not in text
        and "las máscaras de dropout, el flujo residual" not in text
    )


def _theory03_plan(lang: str) -> str:
    blocks = PYTHON_BLOCK.findall(page_text("03-fsdp-in-practice", lang))
    return next(code for code in blocks if "fully_shard(model" in code and "strategy" in code)


@pytest.mark.parametrize("lang", LANGS)
def test_page_03_leaves_the_root_at_fsdp2_s_default(lang):
    """Page 03's plan passes reshard_after_forward=True to the blocks only. Run on a pretend
    two-rank group, the installed FSDP2 then keeps the root gathered after forward (no
    post-forward reshard) and frees the blocks; the same True given to the root would free it too.
    And fully_shard wraps nothing: it swaps each unit's class, FSDPBlock, FSDPMiniGPT."""
    import inspect

    from torch.distributed.fsdp import fully_shard

    from minigpt.model import GPTConfig, MiniGPT
    from tests.fake_world import fake_world

    code = _theory03_plan(lang)
    root_call = [line for line in code.splitlines() if line.startswith("fully_shard(model")]
    assert len(root_call) == 1 and "reshard_after_forward" not in root_call[0] and "**" not in root_call[0]
    assert inspect.signature(fully_shard).parameters["reshard_after_forward"].default is None

    def reshards(module) -> bool:
        state = module._get_fsdp_state()
        return state._fsdp_param_group.post_forward_mesh_info is not None

    with fake_world(0, 2):
        model = MiniGPT(GPTConfig())
        exec(compile(code, f"03-fsdp-in-practice.{lang}", "exec"), {"model": model})
        model._get_fsdp_state()._lazy_init()
        assert not reshards(model) and all(reshards(b) for b in model.blocks)
        assert (type(model).__name__, type(model.blocks[0]).__name__) == ("FSDPMiniGPT", "FSDPBlock")
        assert type(model).__mro__[2] is MiniGPT and not hasattr(model, "module")  # no wrapper
    with fake_world(0, 2):
        model = MiniGPT(GPTConfig())
        for block in model.blocks:
            fully_shard(block, reshard_after_forward=True)
        fully_shard(model, reshard_after_forward=True)  # True given to the root as well: it reshards too
        model._get_fsdp_state()._lazy_init()
        assert reshards(model)
    text = _prose("03-fsdp-in-practice", lang)
    assert "`FSDPBlock`" in text and "`FSDPMiniGPT`" in text
    assert "appears as a wrapper" not in text and "aparece como un envoltorio" not in text


@pytest.mark.parametrize("lang", LANGS)
def test_the_checkpointed_step_is_quoted_after_the_plain_one(lang):
    """Page 03: the step's medians go from the plain run to the checkpointed one, as its peaks do."""
    from minigpt.pages import theory as T

    practice = json.loads((ROOT / "lab/results/03-practice-cpu.json").read_text(encoding="utf-8"))
    runs = practice["activation-checkpointing"]["variants"]
    plain, ckpt = (T.num(1000 * runs[v]["median_step_s"], lang, 1) + " ms" for v in ("plain", "checkpointed"))
    assert runs["checkpointed"]["median_step_s"] > runs["plain"]["median_step_s"]
    phrase = f"{plain} to {ckpt}" if lang == "en" else f"de {plain} a {ckpt}"
    assert phrase in _prose("03-fsdp-in-practice", lang), phrase
