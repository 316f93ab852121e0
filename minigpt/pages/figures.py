"""The figures of the theory pages and of Lab 02, drawn from the code (matplotlib, Agg backend).

Each function takes the PNG path and the language of its labels; :data:`minigpt.pages.site.FIGURES`
registers them and ``python -m minigpt.pages`` draws them into ``figures/<name>-<lang>.png`` (committed; ``docs/figures`` links there).
"""

from __future__ import annotations

from pathlib import Path

from minigpt.pages.lang import pct, tr
from minigpt.zero import analytic as za, pipeline


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
    ax.set_title(
        tr(
            lang,
            "Ψ = 7.5B parameters, mixed-precision Adam (K = 12)",
            "Ψ = 7,5B parámetros, Adam en precisión mixta (K = 12)",
        ),
        fontsize=10,
    )
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8)
    _save(fig, path)


def plot_ring_traffic(path: Path, lang: str) -> None:
    """Bytes sent per worker by a ring all-reduce against the bytes a single root receives."""
    plt = _pyplot()
    ns = list(range(2, 65))
    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=120)
    ax.plot(
        ns,
        [za.ring_factor(n) for n in ns],
        label=tr(lang, "ring all-reduce: sent per worker", "all-reduce en anillo: enviado por proceso"),
    )
    ax.plot(
        ns,
        [za.naive_root_bytes(1, n) for n in ns],
        linestyle="--",
        label=tr(lang, "one root: received by the root", "una raíz: recibido por la raíz"),
    )
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
            ax.text(
                (op.start + op.end) / 2,
                op.stage,
                str(op.micro_batch),
                ha="center",
                va="center",
                fontsize=7,
                color="white",
            )
        bubble = pipeline.measured_bubble_fraction(ops)
        peak = pipeline.peak_in_flight(ops, 0)
        name = SCHEDULE_NAMES[schedule]
        title = tr(
            lang,
            f"{name}: idle {pct(bubble, lang)}, stage 0 holds up to {peak} micro-batches",
            f"{name}: inactivo {pct(bubble, lang)}, la etapa 0 guarda hasta {peak} microlotes",
        )
        ax.set_title(title, fontsize=9)
        ax.set_yticks(range(stages))
        ax.set_yticklabels([tr(lang, f"stage {s}", f"etapa {s}") for s in range(stages)], fontsize=8)
        ax.invert_yaxis()
    axes[-1].set_xlabel(tr(lang, "time (forward = 1, backward = 2)", "tiempo (hacia delante = 1, hacia atrás = 2)"))
    fig.tight_layout()
    _save(fig, path)


def plot_zero_comm(path: Path, lang: str) -> None:
    """Bytes each device sends per step against N, per stage (Ψ = 7.5B, 16-bit communication)."""
    from minigpt.zero import comm

    plt = _pyplot()
    ns = [2**i for i in range(1, 11)]
    fig, ax = plt.subplots(figsize=(6.4, 3.8), dpi=120)
    for s, marker in zip(za.STAGES, "osD^"):
        gb = [comm.bytes_per_step(za.ZERO_PAPER_PSI, s, n) / za.GB for n in ns]
        ax.plot(ns, gb, marker=marker, markersize=4, label=za.STAGE_NAMES[s], alpha=0.8)
    ax.plot(
        ns,
        [comm.bytes_per_step(za.ZERO_PAPER_PSI, 3, n, reshard_after_forward=False) / za.GB for n in ns],
        linestyle=":",
        color="grey",
        label=tr(lang, "ZeRO-3, weights kept for backward", "ZeRO-3, pesos conservados para la pasada hacia atrás"),
    )
    ax.set_xscale("log", base=2)
    ax.set_ylim(0, None)
    ax.set_xlabel(tr(lang, "data-parallel devices N", "dispositivos de paralelismo de datos N"))
    ax.set_ylabel(tr(lang, "sent per device per step (GB)", "enviado por dispositivo y paso (GB)"))
    ax.set_title(
        tr(
            lang,
            "Ψ = 7.5B parameters, fp16 gradients and weights, ring collectives",
            "Ψ = 7,5B parámetros, gradientes y pesos en fp16, colectivas en anillo",
        ),
        fontsize=10,
    )
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    _save(fig, path)


def plot_hsdp_tradeoff(path: Path, lang: str) -> None:
    """HSDP on 64 devices (8 nodes of 8): memory per device against the traffic inside the shard
    group and across replicas, as the shard degree S goes from 1 (DDP-like) to 64 (ZeRO-3)."""
    from minigpt.zero import comm, memory

    plt = _pyplot()
    world, per_node, psi = 64, 8, 7 * 10**9
    degrees = [2**i for i in range(0, 7)]
    mem, inside, across = [], [], []
    for s in degrees:
        mem.append(memory.device_memory(psi, s, 3).device / za.GB)
        t = comm.traffic(comm.step_collectives(psi, 3, s, world // s))
        inside.append(t.inside / za.GB)
        across.append(t.across / za.GB)
    fig, ax = plt.subplots(figsize=(6.4, 3.8), dpi=120)
    ax.plot(
        degrees,
        mem,
        marker="o",
        color="#4c78a8",
        label=tr(lang, "model states per device", "estados del modelo por dispositivo"),
    )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(tr(lang, "shard degree S (replicas = 64 / S)", "grado de fragmentación S (réplicas = 64 / S)"))
    ax.set_ylabel(tr(lang, "GB per device", "GB por dispositivo"))
    ax.axvline(per_node, color="grey", linestyle="--", linewidth=1)
    ax.text(per_node * 1.08, max(mem) * 0.6, tr(lang, "S = one node", "S = un nodo"), color="grey", fontsize=8)
    twin = ax.twinx()
    twin.plot(
        degrees,
        inside,
        marker="s",
        color="#f58518",
        label=tr(lang, "sent inside the shard group", "enviado dentro del grupo"),
    )
    twin.plot(
        degrees, across, marker="^", color="#54a24b", label=tr(lang, "sent across replicas", "enviado entre réplicas")
    )
    twin.set_ylabel(tr(lang, "GB sent per device per step", "GB enviados por dispositivo y paso"))
    handles = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    ax.legend(
        handles, [h.get_label() for h in handles], fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=3
    )
    ax.set_title(
        tr(
            lang,
            "HSDP, Ψ = 7B, ZeRO-3 inside each shard group, 8 nodes x 8 devices",
            "HSDP, Ψ = 7B, ZeRO-3 dentro de cada grupo, 8 nodos x 8 dispositivos",
        ),
        fontsize=10,
    )
    ax.grid(True, alpha=0.3)
    _save(fig, path)


SIM_COLORS = {"weights": "#4c78a8", "gradients": "#f58518", "optimizer": "#54a24b", "working": "#e45756"}


def plot_sim_timeline(path: Path, lang: str) -> None:
    """What worker 0 of the numpy simulation holds at each moment of one step, per stage
    (4 workers, the MLP 16-32-32-8, fp32): model states stacked by kind."""
    from minigpt.zero import simulate

    plt = _pyplot()
    kinds = {
        "weights": tr(lang, "weights", "pesos"),
        "gradients": tr(lang, "gradients", "gradientes"),
        "optimizer": tr(lang, "optimizer state", "estado del optimizador"),
        "working": tr(lang, "working buffer", "búfer de trabajo"),
    }
    fig, axes = plt.subplots(1, 4, figsize=(11.0, 3.4), dpi=120, sharey=True)
    for ax, stage in zip(axes, za.STAGES):
        run = simulate.simulate(stage, 4, steps=2, rows=32)
        bottom = [0.0] * len(run.timeline)
        xs = range(len(run.timeline))
        for kind, label in kinds.items():
            heights = [e.held[kind] / 1e3 for e in run.timeline]
            ax.bar(xs, heights, bottom=bottom, color=SIM_COLORS[kind], label=label, width=0.8)
            bottom = [b + h for b, h in zip(bottom, heights)]
        ax.set_xticks(list(xs))
        ax.set_xticklabels([_sim_label(e, lang) for e in run.timeline], rotation=90, fontsize=6)
        ax.set_title(
            f"{za.STAGE_NAMES[stage]}: {tr(lang, 'peak', 'pico')} {run.peak_model_state[0] / 1e3:.1f} kB", fontsize=9
        )
    axes[0].set_ylabel(tr(lang, "held by worker 0 (kB)", "en manos del proceso 0 (kB)"))
    handles, labels = axes[0].get_legend_handles_labels()
    fig.tight_layout()
    fig.legend(handles, labels, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=4)
    _save(fig, path)


def _sim_label(event, lang: str) -> str:
    words = {
        "forward": ("forward", "adelante"),
        "backward": ("backward", "atrás"),
        "update": ("update", "actualización"),
        "all-gather": ("all-gather", "all-gather"),
    }
    first, _, rest = event.label.partition(" ")
    text = tr(lang, *words.get(first, (first, first))) + (f" {rest}" if rest else "")
    if event.collective and not event.label.startswith("all-gather"):
        op = event.collective.split(" ")[0]
        text += f" + {op}"
    return text
