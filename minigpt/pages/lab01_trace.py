"""Lab 01's run read from the PyTorch profiler's trace, in English and Spanish: a table of the traced
steps and a figure of backward and the all-reduces, both drawn from the trace's events
(:func:`minigpt.profiler.steps`, kept in the run's report under ``trace``).

    torchrun --nproc_per_node=2 lab/01_ddp.py --quiet --trace out/lab01-trace --report lab/results/01-trace-cpu.json
    python lab/01_ddp.py --render lab/results/01-trace-cpu.json
"""

from __future__ import annotations

from pathlib import Path

from minigpt.pages.lang import LANGS

LABELS = {
    "en": {
        "header": "| traced step | step (ms) | backward (ms) | all-reduces | their time (ms) | under backward | after it (ms) |",
        "whole": "the step (forward, backward, optimizer)",
        "backward": "backward (training thread)",
        "reduce": "all-reduce (gloo's thread)",
        "xlabel": "ms since the step started (the trace's events)",
        "step": "step {s}",
        "title": "Lab 01 in the profiler's trace: {n} ranks, rank 0",
    },
    "es": {
        "header": "| paso trazado | paso (ms) | pasada hacia atrás (ms) | all-reduce | su tiempo (ms) | bajo la pasada hacia atrás | después (ms) |",
        "whole": "el paso (hacia delante, hacia atrás, optimizador)",
        "backward": "pasada hacia atrás (hilo del entrenamiento)",
        "reduce": "all-reduce (hilo de gloo)",
        "xlabel": "ms desde el inicio del paso (eventos de la traza)",
        "step": "paso {s}",
        "title": "Laboratorio 01 en la traza del perfilador: {n} ranks, rank 0",
    },
}


def number(value: float, lang: str, digits: int = 1) -> str:
    text = f"{value:.{digits}f}"
    return text.replace(".", ",") if lang == "es" else text


def table(report: dict, lang: str) -> str:
    """One row per traced step: its length, backward's, the all-reduces and how much of them backward hid."""
    lines = [LABELS[lang]["header"], "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for s in report["trace"]["steps"]:
        share = f"{number(100 * s['hidden_share'], lang, 0)}{' %' if lang == 'es' else '%'}"
        cells = [
            str(s["step"]),
            number(s["step_ms"], lang),
            number(s["backward_ms"][1] - s["backward_ms"][0], lang),
            str(len(s["collectives"])),
            number(s["collective_ms"], lang),
            share,
            number(s["exposed_ms"], lang),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def figure(report: dict, lang: str, path: Path) -> None:
    """Each traced step on two lanes: backward's span on the training thread, and every all-reduce on
    gloo's thread, from the step's start."""
    from matplotlib.figure import Figure  # a bare figure: no pyplot state, a notebook keeps its backend

    L, steps = LABELS[lang], report["trace"]["steps"]
    fig = Figure(figsize=(8, 1.0 * len(steps) + 1.5))
    ax = fig.subplots()
    ticks, names = [], []
    for i, s in enumerate(steps):
        y = 2 * i
        ax.barh(y + 0.4, s["step_ms"], left=0, height=1.7, color="#eeeeee", label=L["whole"] if i == 0 else None)
        start, end = s["backward_ms"]
        ax.barh(y, end - start, left=start, height=0.7, color="#5c6bc0", label=L["backward"] if i == 0 else None)
        ax.plot([end, end], [y - 0.45, y + 1.25], color="black", linestyle=":", linewidth=0.8)
        for k, c in enumerate(s["collectives"]):
            ax.barh(
                y + 0.8,
                c["end_ms"] - c["start_ms"],
                left=c["start_ms"],
                height=0.5,
                color="#ef6c00",
                edgecolor="white",
                label=L["reduce"] if i == 0 and k == 0 else None,
            )
        ticks.append(y + 0.4)
        names.append(L["step"].format(s=s["step"]))
    ax.set_yticks(ticks, names)
    ax.set_xlim(0, max(s["step_ms"] for s in steps))
    ax.invert_yaxis()
    ax.set_xlabel(L["xlabel"])
    ax.set_title(L["title"].format(n=report["world_size"]))
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3, fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def render(json_path: str | Path, report: dict) -> list[Path]:
    """``X.json`` with a ``trace`` -> ``X-en.txt``, ``X-es.txt`` and ``X-en.png``, ``X-es.png``."""
    json_path, written = Path(json_path), []
    for lang in LANGS:
        text = json_path.with_name(f"{json_path.stem}-{lang}.txt")
        text.write_text(table(report, lang))
        png = json_path.with_name(f"{json_path.stem}-{lang}.png")
        figure(report, lang, png)
        written += [text, png]
    return written
