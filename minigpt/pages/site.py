"""Every generated table, fragment and figure of the site, and the command that writes them.

The registries gather what the page modules of this package make:

* ``TABLES``: name -> ``function(lang) -> str``, a Markdown table with headers in that language
  and numbers written its way ("1,024.5" / "1024,5", "27.3%" / "27,3 %"): the theory pages'
  (:mod:`minigpt.pages.theory`) and Lab 02's (:mod:`minigpt.pages.lab02`);
* ``FRAGMENTS``: page fragments that are not tables (Lab 03's annotated reading,
  :mod:`minigpt.pages.lab03_reading`);
* ``FIGURES``: name -> ``function(png_path, lang)``, a matplotlib plot (Agg backend) labelled in
  that language (:mod:`minigpt.pages.figures` for the theory pages and Lab 02; the lab modules'
  ``FIGURES`` for Labs 04 to 06, drawn from the code and from the committed runs in ``lab/results/``).

``python -m minigpt.pages`` writes ``build/tables/<name>-<lang>.md`` and the committed figures
``figures/<name>-<lang>.png`` (``docs/figures`` is a link to them) for both languages, then
writes every table and fragment into the pages that show it (:mod:`minigpt.pages.inline`), so that
a page read on the forge shows them too. A page asks for a table with the line
``--8<-- "build/tables/<name>-en.md"`` (turned into a generated block on the next run) and shows a
figure with ``![...](../figures/<name>-en.png)``. The lab pages' measured tables come from the
results JSON instead (``lab/results/``), each rendered by its lab script's ``--render``.
``--check`` changes nothing and exits 1 when a page's generated blocks are out of date.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from minigpt import cli
from minigpt.pages import figures, inline, lab02, lab03_reading, lab04, lab05, lab06, lab07, theory
from minigpt.pages.lang import LANGS

TABLES: dict[str, Callable[[str], str]] = {
    "memory-per-parameter": theory.memory_per_parameter,
    "activations-vs-sequence": theory.activations_vs_sequence,
    "training-time": theory.training_time,
    "ring-allreduce": theory.ring_allreduce,
    "uneven-batches": theory.uneven_batches,
    "zero-memory": theory.zero_memory,
    "zero-stages": theory.zero_stages,
    "pipeline-bubble": theory.pipeline_bubble,
    "tp-links": theory.tp_links,
    "hsdp-layouts": theory.hsdp_layouts,
    "hsdp-groups": theory.hsdp_groups,
    "activation-recompute": theory.activation_recompute,
    "batch-lr-scaling": theory.batch_lr_scaling,
    "logits-peak": theory.logits_peak,
    "fsdp-memory": theory.fsdp_memory,
    "checkpoint-sizes": theory.checkpoint_sizes,
    "grad-norm-shards": theory.grad_norm_shards,
    "minigpt-parameters": theory.minigpt_parameter_shapes,  # Lab 00's page: the shapes the labs shard
    **lab02.TABLES,  # Lab 02's page
    **lab04.TABLES,  # Lab 04's page
    **lab07.TABLES,  # Lab 07's page: other frameworks' configurations, costed by the lab's bytes model
}

# Page fragments that are not tables, written beside them (build/tables/<name>-<lang>.md).
FRAGMENTS: dict[str, Callable[[str], str]] = {"fsdp-reading": lab03_reading.render_markdown}  # Lab 03's page

FIGURES: dict[str, Callable[[Path, str], None]] = {
    "zero-memory-per-device": figures.plot_zero_memory,
    "ring-traffic": figures.plot_ring_traffic,
    "pipeline-schedule": figures.plot_pipeline_schedule,
    "zero-comm-per-step": figures.plot_zero_comm,
    "hsdp-tradeoff": figures.plot_hsdp_tradeoff,
    "zero-sim-timeline": figures.plot_sim_timeline,
    **lab04.FIGURES,  # Lab 04's page: a unit's life in one step (the committed run's schedule)
    **lab05.FIGURES,  # Lab 05's page: the cut MLP, the vocabulary-parallel loss, ring attention's masks
    **lab06.FIGURES,  # Lab 06's page: the bubble against m (model and committed runs), the 2 x 2 mesh
    **lab07.FIGURES,  # Lab 07's page: the 8 ranks' groups in both layouts, the bytes per mesh dimension
}


def write_all(tables_dir: Path, figures_dir: Path | None) -> list[Path]:
    """Write every table (and figure, unless ``figures_dir`` is None) in both languages."""
    written = []
    tables_dir.mkdir(parents=True, exist_ok=True)
    for name, make in {**TABLES, **FRAGMENTS}.items():
        for lang in LANGS:
            path = tables_dir / f"{name}-{lang}.md"
            path.write_text(make(lang), encoding="utf-8")
            written.append(path)
    if figures_dir is not None:
        for name, draw in FIGURES.items():
            for lang in LANGS:
                path = figures_dir / f"{name}-{lang}.png"
                draw(path, lang)
                written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = cli.ArgumentParser(prog="python -m minigpt.pages", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--tables-dir",
        type=Path,
        default=Path("build/tables"),
        help="where the Markdown tables go (default: build/tables)",
    )
    parser.add_argument(
        "--figures-dir",
        type=Path,
        default=Path("figures"),
        help="where the PNG figures go (default: figures, committed; docs/figures links to it)",
    )
    parser.add_argument("--no-figures", action="store_true", help="write the tables only")
    parser.add_argument("--no-pages", action="store_true", help="leave the pages' generated blocks as they are")
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if a page's generated blocks are out of date"
    )
    args = parser.parse_args(argv)
    if args.check:
        out_of_date = inline.stale({**TABLES, **FRAGMENTS})
        for page in out_of_date:
            print(f"{page}: generated blocks out of date; run python -m minigpt.pages")
        return 1 if out_of_date else 0
    try:
        cli.output_dir(args.tables_dir, "--tables-dir")
        if not args.no_figures:
            cli.output_dir(args.figures_dir, "--figures-dir")
    except cli.BadInput as exc:
        return cli.refuse(parser.prog, str(exc))
    for path in write_all(args.tables_dir, None if args.no_figures else args.figures_dir):
        print(path)
    if not args.no_pages:
        for page in inline.update({**TABLES, **FRAGMENTS}):
            print(f"{page}: generated blocks rewritten")
    return 0
