"""Lab 03's figures and tables, in English and Spanish, drawn from the lab's JSON report.

:func:`draw_timeline` draws one step of one variant: one panel per rank, one row per FSDP unit
(the root, then the blocks). On each row: the block's forward and backward computation in the
middle, its all-gathers above (from the moment the call was issued to the moment the data was
complete; hatched when issued as a prefetch) and its reduce-scatters below. The darker part of a
communication bar is *exposed*: the training thread was blocked on it. A bar with no dark part
ran in the background while the thread computed: it was overlapped.

:func:`table` is the Markdown table of every variant; :func:`render` turns a saved report into
``<stem>-en.txt`` / ``<stem>-es.txt`` and ``<stem>-timeline-<variant>-<lang>.png`` beside it.
"""

from __future__ import annotations

import json
from collections import defaultdict, deque
from pathlib import Path

from minigpt.pages.lang import num, sci, tr

COLOURS = {
    "forward": "#5c6bc0",
    "backward": "#8e24aa",
    "all-gather": "#ffb74d",
    "all-gather blocked": "#e65100",
    "reduce-scatter": "#81c784",
    "reduce-scatter blocked": "#1b5e20",
}


def intervals(events: list[dict]) -> dict[str, list[dict]]:
    """Pair a rank's point events into bars: ``{"forward": [...], "all-gather": [...], ...}``, each
    ``{"unit", "start", "end", "prefetch", "blocked"}``; ``blocked`` lists the intervals the thread
    waited (a blocking call: all of it). Pairs are matched first in, first out, per unit."""
    starts = {
        "forward start": "forward",
        "backward start": "backward",
        "all-gather issued": "all-gather",
        "reduce-scatter issued": "reduce-scatter",
        "all-reduce issued": "all-reduce",
    }
    ends = {
        "forward end": "forward",
        "backward end": "backward",
        "all-gather done": "all-gather",
        "reduce-scatter done": "reduce-scatter",
        "all-reduce done": "all-reduce",
    }
    open_bars: dict[tuple[str, str], deque] = defaultdict(deque)
    waiting: dict[tuple[str, str], deque] = defaultdict(deque)
    latest: dict[tuple[str, str], dict] = {}
    bars: dict[str, list[dict]] = defaultdict(list)
    for e in events:
        what, unit = e["what"], e["unit"]
        if what in starts:
            bar = {
                "unit": unit,
                "start": e["t"],
                "end": None,
                "prefetch": bool(e.get("prefetch")),
                "is_async": bool(e.get("is_async")),
                "blocked": [],
            }
            bars[starts[what]].append(bar)
            open_bars[(starts[what], unit)].append(bar)
            latest[(starts[what], unit)] = bar
        elif what in ends and open_bars[(ends[what], unit)]:
            bar = open_bars[(ends[what], unit)].popleft()
            bar["end"] = e["t"]
            if not bar["is_async"]:
                bar["blocked"].append((bar["start"], bar["end"]))
        elif what == "wait start":
            waiting[(e["kind"], unit)].append(e["t"])
        elif what == "wait end" and waiting[(e["kind"], unit)]:
            latest[(e["kind"], unit)]["blocked"].append((waiting[(e["kind"], unit)].popleft(), e["t"]))
    return bars


def draw_timeline(name: str, result: dict, report: dict, lang: str, path: Path) -> None:
    """The last step of variant ``name`` (its entry ``result`` in the report) as a PNG. Drawn on a
    bare ``Figure`` (no pyplot), so it leaves the caller's matplotlib backend alone (a notebook
    keeps its inline plots)."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    ranks = result["last_step_events"]
    units = ["root", *[f"blocks.{i}" for i in range(report["n_layer"])]]
    fig = Figure(figsize=(10, 1.0 + 2.3 * len(ranks)))
    axes = fig.subplots(len(ranks), 1, sharex=True, squeeze=False)
    for rank, (ax, events) in enumerate(zip(axes[:, 0], ranks)):
        bars = intervals(events)
        for kind, offset, height in (
            ("forward", 0.0, 0.34),
            ("backward", 0.0, 0.34),
            ("all-gather", -0.3, 0.22),
            ("reduce-scatter", 0.3, 0.22),
        ):
            for bar in bars.get(kind, []):
                if bar["unit"] not in units or bar["end"] is None:
                    continue
                y = units.index(bar["unit"]) + offset
                ax.barh(
                    y,
                    1000 * (bar["end"] - bar["start"]) + 0.02,
                    left=1000 * bar["start"],
                    height=height,
                    color=COLOURS[kind],
                    hatch="////" if bar["prefetch"] else None,
                    edgecolor="white",
                    linewidth=0,
                )
                for start, end in bar["blocked"] if kind in ("all-gather", "reduce-scatter") else []:
                    ax.barh(
                        y,
                        1000 * (end - start) + 0.02,
                        left=1000 * start,
                        height=height * 0.4,
                        color=COLOURS[f"{kind} blocked"],
                    )
        backward_called = next((e["t"] for e in events if e["what"] == "loss.backward()"), None)
        if backward_called is not None:
            ax.axvline(1000 * backward_called, color="black", linestyle="--", linewidth=1)
        ax.set_yticks(range(len(units)), units, fontsize=8)
        ax.set_ylim(len(units) - 0.4, -0.6)
        ax.set_ylabel(f"rank {rank}")
        ax.grid(True, axis="x", alpha=0.3)
    axes[-1, 0].set_xlabel(tr(lang, "ms since the step started", "ms desde el inicio del paso"))
    n = report["world_size"]
    axes[0, 0].set_title(
        tr(
            lang,
            f"{name}: one training step on {n} rank(s) ({result['description']['en']})",
            f"{name}: un paso de entrenamiento en {n} rank(s) ({result['description']['es']})",
        ),
        fontsize=9,
    )
    legend = [
        Patch(color=COLOURS["forward"], label=tr(lang, "forward: the block computes", "forward: el bloque calcula")),
        Patch(color=COLOURS["backward"], label=tr(lang, "backward: the block computes", "backward: el bloque calcula")),
        Patch(
            color=COLOURS["all-gather"],
            label=tr(lang, "all-gather: issued to complete (above)", "all-gather: de lanzado a completo (arriba)"),
        ),
        Patch(
            facecolor=COLOURS["all-gather"],
            hatch="////",
            edgecolor="white",
            label=tr(lang, "all-gather issued as a prefetch", "all-gather lanzado como precarga (prefetch)"),
        ),
        Patch(color=COLOURS["reduce-scatter"], label=tr(lang, "reduce-scatter (below)", "reduce-scatter (abajo)")),
        Patch(
            color=COLOURS["all-gather blocked"],
            label=tr(lang, "dark: the thread is blocked (exposed)", "oscuro: el hilo espera (comunicación expuesta)"),
        ),
        Line2D(
            [],
            [],
            color="black",
            linestyle="--",
            label=tr(lang, "loss.backward() called", "se llama a loss.backward()"),
        ),
    ]
    fig.legend(handles=legend, loc="lower center", ncol=4, fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.09, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90, metadata={"Software": None})


def compact_order(units: list[str], phases: list[str]) -> str:
    """``["root", "blocks.0", ...]`` with their phases -> ``"R 0 1 2 3 | 3 2 1 0"`` (forward | backward)."""

    def short(unit: str) -> str:
        return "R" if unit == "root" else unit.removeprefix("blocks.")

    forward = [short(u) for u, p in zip(units, phases) if p == "forward"]
    backward = [short(u) for u, p in zip(units, phases) if p == "backward"]
    return f"{' '.join(forward) or '-'} \\| {' '.join(backward) or '-'}"


def table(report: dict, lang: str) -> str:
    """Every variant of a report as a Markdown table (rank 0's counts and bytes; the ranks agree)."""
    header = tr(
        lang,
        "| variant | all-gathers | reduce-scatters | all-reduces | sent per rank (kB) "
        "| median step (ms) | median exposed communication (ms) | max step drift "
        "| all-gather order (forward \\| backward) |",
        "| variante | all-gathers | reduce-scatters | all-reduces | enviado por rank (kB) "
        "| paso, mediana (ms) | comunicación expuesta, mediana (ms) | deriva máxima por paso "
        "| orden de los all-gather (forward \\| backward) |",
    )
    rows = [header, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for name, r in report["variants"].items():
        calls = r["calls_per_step"]
        sent = sum(r["sent_bytes_per_step"][0].values())
        rows.append(
            f"| {name} | {calls['all-gather']} | {calls['reduce-scatter']} | {calls['all-reduce']} | "
            f"{num(sent / 1000, lang, 1)} | {num(1000 * r['median_step_s'], lang, 1)} | "
            f"{num(1000 * r['median_exposed_s'], lang, 2)} | {sci(r['max_step_drift'], lang)} | "
            f"{compact_order(r['all_gather_order'][0], r['all_gather_phases'][0])} |"
        )
    return "\n".join(rows) + "\n"


def render(json_path: Path) -> list[Path]:
    """``X.json`` -> ``X-en.txt``, ``X-es.txt`` and ``X-timeline-<variant>-<lang>.png`` beside it."""
    report = json.loads(json_path.read_text())
    written = []
    for lang in ("en", "es"):
        text = json_path.with_name(f"{json_path.stem}-{lang}.txt")  # a fragment the page includes
        text.write_text(table(report, lang))
        written.append(text)
        for name, result in report["variants"].items():
            figure = json_path.with_name(f"{json_path.stem}-timeline-{name}-{lang}.png")
            draw_timeline(name, result, report, lang, figure)
            written.append(figure)
    return written
