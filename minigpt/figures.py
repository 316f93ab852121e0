"""The figures of the theory pages, drawn from the code (matplotlib, Agg backend).

Each function takes the PNG path and the language of its labels; :data:`minigpt.tables.FIGURES`
registers them and ``python -m minigpt.tables`` draws them into ``docs/figures/<name>-<lang>.png``.
"""

from __future__ import annotations

from pathlib import Path

from minigpt.lang import pct, tr
from minigpt.zero import analytic as za
from minigpt.zero import pipeline


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, bbox_inches="tight", metadata={"Software": None})
    _pyplot().close(fig)


def plot_zero_memory(path: Path, lang: str) -> None:
    """Model-state memory per device against N for each stage (Ψ = 7.5B, K = 12), log-log."""
    plt = _pyplot()
    ns = [2**i for i in range(0, 11)]
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    for s, marker in zip(za.STAGES, "osD^"):
        gb = [za.model_state_bytes(za.ZERO_PAPER_PSI, n, s).total / za.GB for n in ns]
        ax.plot(ns, gb, marker=marker, markersize=4, label=za.STAGE_NAMES[s])
    ax.axhline(80, color="grey", linestyle="--", linewidth=1)
    ax.text(2**7, 90, tr(lang, "an 80 GB device", "un dispositivo de 80 GB"), color="grey", fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(tr(lang, "data-parallel devices N", "dispositivos de paralelismo de datos N"))
    ax.set_ylabel(tr(lang, "model states per device (GB)", "estados del modelo por dispositivo (GB)"))
    ax.set_title(tr(lang, "Ψ = 7.5B parameters, mixed-precision Adam (K = 12)",
                    "Ψ = 7,5B parámetros, Adam en precisión mixta (K = 12)"), fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8)
    _save(fig, path)


def plot_ring_traffic(path: Path, lang: str) -> None:
    """Bytes sent per worker by a ring all-reduce against the bytes a single root receives."""
    plt = _pyplot()
    ns = list(range(2, 65))
    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=120)
    ax.plot(ns, [za.ring_factor(n) for n in ns], label=tr(lang, "ring all-reduce: sent per worker",
                                                          "all-reduce en anillo: enviado por proceso"))
    ax.plot(ns, [za.naive_root_bytes(1, n) for n in ns], linestyle="--",
            label=tr(lang, "one root: received by the root", "una raíz: recibido por la raíz"))
    ax.set_yscale("log")
    ax.set_xlabel(tr(lang, "workers N", "procesos N"))
    ax.set_ylabel(tr(lang, "traffic, in multiples of the buffer S", "tráfico, en múltiplos del búfer S"))
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    _save(fig, path)


SCHEDULE_NAMES = {"gpipe": "GPipe", "1f1b": "1F1B"}


def plot_pipeline_schedule(path: Path, lang: str) -> None:
    """GPipe and 1F1B for p = 4 stages and m = 8 micro-batches, as simulated."""
    plt = _pyplot()
    stages, micro = 4, 8
    fig, axes = plt.subplots(2, 1, figsize=(8.0, 3.6), dpi=120, sharex=True)
    for ax, schedule in zip(axes, pipeline.SCHEDULES):
        ops = pipeline.simulate(schedule, stages, micro)
        for op in ops:
            color = "#4c78a8" if op.kind == "F" else "#f58518"
            ax.barh(op.stage, op.end - op.start, left=op.start, color=color, edgecolor="white")
            ax.text((op.start + op.end) / 2, op.stage, str(op.micro_batch), ha="center",
                    va="center", fontsize=7, color="white")
        bubble = pipeline.measured_bubble_fraction(ops)
        peak = pipeline.peak_in_flight(ops, 0)
        name = SCHEDULE_NAMES[schedule]
        title = tr(lang, f"{name}: idle {pct(bubble, lang)}, stage 0 holds up to {peak} micro-batches",
                   f"{name}: inactivo {pct(bubble, lang)}, la etapa 0 guarda hasta {peak} microlotes")
        ax.set_title(title, fontsize=9)
        ax.set_yticks(range(stages))
        ax.set_yticklabels([tr(lang, f"stage {s}", f"etapa {s}") for s in range(stages)], fontsize=8)
        ax.invert_yaxis()
    axes[-1].set_xlabel(tr(lang, "time (forward = 1, backward = 2)",
                           "tiempo (hacia delante = 1, hacia atrás = 2)"))
    fig.tight_layout()
    _save(fig, path)
