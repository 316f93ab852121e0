"""The tables of Lab 06 (pipeline schedules and 2-D meshes, each against one process), in English and
Spanish, for the lab page: ``lab/results/06-*-{en,es}.txt``, one section per table
(``--8<-- "lab/results/06-pipeline-cpu-en.txt:proofs"``).

Two kinds of report, told apart by their keys:

* a pipeline report (``lab/06_pipeline.py --check --report``): sections ``proofs`` (one step
  against one process for GPipe and 1F1B, bytes per stage against the model, micro-batches held,
  step drift, the tied copies), ``bubble`` (the idle share measured against ``(p-1)/(m+p-1)``)
  and ``chart`` (both schedules as the script draws them);
* a mesh report (``lab/06_mesh.py --check --report``): sections ``mesh`` (HSDP and DP x TP: bytes
  per mesh dimension, memory per rank, one step, step drift) and ``batch`` (the effective batch
  and the learning rate moved to it).

    python lab/06_pipeline.py --render lab/results/06-pipeline-cpu.json
    python lab/06_mesh.py --render lab/results/06-mesh-cpu.json
"""

from __future__ import annotations

from pathlib import Path

from minigpt.pages import rulers
from minigpt.pages.lang import num, pct, sci, table, tr, write_tables, yes
from minigpt.parallel.bounds import FP32_DRIFT_BOUND, KERNEL_BOUNDS

SCHEDULE_NAMES = {"gpipe": "GPipe", "1f1b": "1F1B"}


def is_mesh(report: dict) -> bool:
    return "hsdp" in report and "dp_tp" in report


def bubble_model(stages: int, micro_batches: int) -> float:
    """GPipe's and 1F1B's idle share with equal stages: (p - 1) / (m + p - 1)."""
    return (stages - 1) / (micro_batches + stages - 1)


def held_model(schedule: str, stages: int, micro_batches: int) -> list[int]:
    """The most micro-batches each stage holds: GPipe m on every stage, 1F1B p - s (at most m)."""
    if schedule == "gpipe":
        return [micro_batches] * stages
    return [min(stages - s, micro_batches) for s in range(stages)]


def _dots(values: list, lang: str) -> str:
    return " · ".join(num(v, lang) for v in values)


def _drift(summary: dict, lang: str) -> str:
    return f"{sci(summary['max'], lang)} ({tr(lang, 'step', 'paso')} {summary['worst_step']})"


def _measured(r: dict, lang: str) -> str:
    n = r["world_size"]
    return tr(
        lang,
        f"\nMeasured {r['date']} with torch {r['torch']} on CPU ({r['backend']}), {n} ranks.\n",
        f"\nMedido el {r['date']} con torch {r['torch']} en CPU ({r['backend']}), {n} ranks.\n",
    )


# ----------------------------------------------------------------------------------------------
# The pipeline


def proofs(r: dict, lang: str) -> str:
    """What --check held against one process, against the bytes model and the held counts."""
    p, m, one, t = r["stages"], r["micro_batches"], r["one_step"], r["training"]
    rows = []
    for schedule, name in SCHEDULE_NAMES.items():
        for dtype in ("float32", "float64"):
            o = one[dtype][schedule]
            label = (
                tr(lang, f"one step, {name}: gradients / loss, fp32", f"un paso, {name}: gradientes / pérdida, fp32")
                if dtype == "float32"
                else tr(lang, "… the same in float64", "… lo mismo en float64")
            )
            bound = KERNEL_BOUNDS[dtype]
            rows.append(
                [
                    label,
                    f"{sci(o['max_grad_diff'], lang)} / {sci(o['loss_diff'], lang)}",
                    f"≤ {sci(bound, lang, 1)}",
                    yes(o["max_grad_diff"] <= bound and o["loss_diff"] <= bound, lang),
                ]
            )
    for schedule, found in r.get("torch_pipelining", {}).items():
        name = SCHEDULE_NAMES[schedule]
        rows.append(
            [
                tr(
                    lang,
                    f"one step, {name}: gradients against PyTorch's own pipeline (torch.distributed.pipelining)",
                    f"un paso, {name}: gradientes frente a la tubería de PyTorch (torch.distributed.pipelining)",
                ),
                ("0" if found["max_grad_diff"] == 0 else sci(found["max_grad_diff"], lang))
                + (tr(lang, " (bit-identical)", " (idénticos bit a bit)") if found["bit_identical"] else ""),
                f"≤ {sci(KERNEL_BOUNDS['float32'], lang, 1)}",
                yes(found["max_grad_diff"] <= KERNEL_BOUNDS["float32"], lang),
            ]
        )
    f32 = one["float32"]
    sent_ok = all(f32[s]["bytes_sent"] == r["bytes_model"] for s in SCHEDULE_NAMES) and (
        r["bytes_per_stage_per_step"] == r["bytes_model"]
    )
    rows.append(
        [
            tr(
                lang,
                "bytes each stage sends per step, fp32 (both schedules, and every training step)",
                "bytes que envía cada etapa por paso, fp32 (ambos calendarios y cada paso del entrenamiento)",
            ),
            _dots(f32[r["schedule"]]["bytes_sent"], lang),
            tr(lang, f"model: {_dots(r['bytes_model'], lang)}", f"modelo: {_dots(r['bytes_model'], lang)}"),
            yes(sent_ok, lang),
        ]
    )
    for schedule, name in SCHEDULE_NAMES.items():
        expected = held_model(schedule, p, m)
        held = f32[schedule]["peak_activations"]
        rule = f"m = {m}" if schedule == "gpipe" else "p − s"
        rows.append(
            [
                tr(
                    lang,
                    f"micro-batches each stage holds at most, {name}",
                    f"microlotes que guarda cada etapa como máximo, {name}",
                ),
                _dots(held, lang),
                f"{rule}: {_dots(expected, lang)}",
                yes(held == expected, lang),
            ]
        )
    rows += [
        [
            tr(
                lang,
                f"step drift against one process, fp32, {t['steps']} AdamW steps ({SCHEDULE_NAMES[r['schedule']]})",
                f"deriva por paso frente a un proceso, fp32, {t['steps']} pasos de AdamW "
                f"({SCHEDULE_NAMES[r['schedule']]})",
            ),
            _drift(t["step_drift"], lang),
            f"≤ {sci(FP32_DRIFT_BOUND, lang, 1)}",
            yes(t["step_drift"]["max"] <= FP32_DRIFT_BOUND, lang),
        ],
        [
            tr(
                lang,
                "the two copies of the tied matrix bit-identical",
                "las dos copias de la matriz atada idénticas bit a bit",
            ),
            yes(t["tied_copies_bit_identical"], lang),
            tr(lang, "after every step", "tras cada paso"),
            yes(t["tied_copies_bit_identical"], lang),
        ],
        [
            tr(lang, "tutor accuracy after training", "exactitud del tutor tras el entrenamiento"),
            f"{pct(t['tutor_accuracy'], lang)} ({t['tutor_correct']}/{t['tutor_total']})",
            "",
            "",
        ],
    ]
    head = [
        tr(
            lang,
            f"{p} stages, {SCHEDULE_NAMES[r['schedule']]}, m = {m}",
            f"{p} etapas, {SCHEDULE_NAMES[r['schedule']]}, m = {m}",
        ),
        tr(lang, "measured", "medido"),
        tr(lang, "bound or model", "cota o modelo"),
        tr(lang, "holds", "se cumple"),
    ]
    return table(head, rows) + _measured(r, lang)


def bubble(r: dict, lang: str) -> str:
    """The idle share of a step on the wall clock (median of a few steps), per m and schedule."""
    p = r["stages"]
    ms = sorted(r["bubble"]["gpipe"], key=int)
    rows = [
        [
            num(int(m), lang),
            pct(bubble_model(p, int(m)), lang),
            pct(r["bubble"]["gpipe"][m]["measured"], lang),
            pct(r["bubble"]["1f1b"][m]["measured"], lang),
        ]
        for m in ms
    ]
    head = [
        tr(lang, f"micro-batches m ({p} stages)", f"microlotes m ({p} etapas)"),
        tr(lang, "model (p−1)/(m+p−1)", "modelo (p−1)/(m+p−1)"),
        tr(lang, "GPipe, measured", "GPipe, medido"),
        tr(lang, "1F1B, measured", "1F1B, medido"),
    ]
    note = tr(
        lang,
        "\nMeasured: 1 − (busy time of every stage) / (stages × the longest stage's step), busy = the step minus "
        "the time blocked in receives; the median over a few steps, after one to warm up.\n",
        "\nMedido: 1 − (tiempo ocupado de todas las etapas) / (etapas × el paso de la etapa más larga), ocupado = el "
        "paso menos el tiempo bloqueado en recepciones; la mediana de unos pocos pasos, tras uno de calentamiento.\n",
    )
    return table(head, rows) + note + _measured(r, lang)


def chart(r: dict, lang: str) -> str:
    """Both schedules for the report's p and m, played on Lab 02's clock (F 1 unit, B 2), as the
    script prints them: computed, not measured."""
    from minigpt.parallel.pipeline import SCHEDULES, chart as draw, check_schedule, schedule_orders

    p, m = r["stages"], r["micro_batches"]
    parts = []
    for schedule, name in SCHEDULE_NAMES.items():
        played = check_schedule(schedule_orders(SCHEDULES[schedule], p, m), m)
        parts.append(f"{name}\n{draw(played)}")
    return "```text\n" + "\n\n".join(parts) + "\n```\n"


# ----------------------------------------------------------------------------------------------
# The meshes


def mesh(r: dict, lang: str) -> str:
    """HSDP and DP x TP on the same ranks: bytes per mesh dimension and memory against the models,
    one step and the step drift against one process."""
    h, d = r["hsdp"], r["dp_tp"]
    hm, dm = r["mesh"]["hsdp"], r["mesh"]["dp_tp"]
    every = r["memory_per_rank"]["every_rank"]
    hsdp_name = tr(
        lang,
        f"HSDP, replicate {hm['replicate']} × shard {hm['shard']}",
        f"HSDP, {hm['replicate']} réplicas × grado de fragmentación {hm['shard']}",
    )
    dptp_name = f"DP {dm['dp']} × TP {dm['tp']}"
    model = tr(lang, "model", "modelo")
    rows = []
    for dim, en, es in (
        (
            "shard",
            "bytes one rank sends per step, `shard` dimension",
            "bytes que envía un rank por paso, dimensión `shard`",
        ),
        (
            "replicate",
            "bytes one rank sends per step, `replicate` dimension",
            "bytes que envía un rank por paso, dimensión `replicate`",
        ),
    ):
        rows.append(
            [
                f"{hsdp_name}: {tr(lang, en, es)}",
                num(r["bytes_per_dim"][dim], lang),
                f"{model}: {num(r['bytes_model_per_dim'][dim], lang)}",
                yes(r["bytes_per_dim"][dim] == r["bytes_model_per_dim"][dim] and h["bytes_constant_over_steps"], lang),
            ]
        )
    rows += [
        [
            f"{hsdp_name}: "
            + tr(lang, "model-state bytes per rank after a step", "bytes de estados del modelo por rank tras un paso"),
            _dots([e["measured"] for e in every], lang),
            f"{model}: {_dots([e['model'] for e in every], lang)}",
            yes(all(e["measured"] == e["model"] for e in every), lang),
        ],
        [
            f"{hsdp_name}: "
            + tr(
                lang,
                f"step drift against one process, fp32, {r['steps']} steps",
                f"deriva por paso frente a un proceso, fp32, {r['steps']} pasos",
            ),
            _drift(h["step_drift"], lang),
            f"≤ {sci(FP32_DRIFT_BOUND, lang, 1)}",
            yes(h["step_drift"]["max"] <= FP32_DRIFT_BOUND, lang),
        ],
    ]
    for dim, en, es in (
        ("tp", "bytes one rank sends per step, `tp` dimension", "bytes que envía un rank por paso, dimensión `tp`"),
        ("dp", "bytes one rank sends per step, `dp` dimension", "bytes que envía un rank por paso, dimensión `dp`"),
    ):
        rows.append(
            [
                f"{dptp_name}: {tr(lang, en, es)}",
                num(d["bytes_per_dim"][dim], lang),
                f"{model}: {num(d['bytes_model_per_dim'][dim], lang)}",
                yes(d["bytes_per_dim"][dim] == d["bytes_model_per_dim"][dim] and d["bytes_constant_over_steps"], lang),
            ]
        )
    one = d["rulers"]
    rows += [
        [
            f"{dptp_name}: " + tr(lang, "one step: logits / gradients, fp32", "un paso: logits / gradientes, fp32"),
            f"{sci(one['fp32_first_step_logit_diff'], lang)} / {sci(one['fp32_first_step_grad_diff'], lang)}",
            f"≤ {sci(FP32_DRIFT_BOUND, lang, 1)}",
            yes(max(one["fp32_first_step_logit_diff"], one["fp32_first_step_grad_diff"]) <= FP32_DRIFT_BOUND, lang),
        ],
        [
            f"{dptp_name}: "
            + tr(
                lang,
                f"step drift against one process, fp32, {r['steps']} steps",
                f"deriva por paso frente a un proceso, fp32, {r['steps']} pasos",
            ),
            _drift(d["step_drift"], lang),
            tr(
                lang,
                f"≤ {sci(FP32_DRIFT_BOUND, lang, 1)} or 2 × PyTorch's ({sci(r['pytorch_fp32_max_step_drift'], lang)})",
                f"≤ {sci(FP32_DRIFT_BOUND, lang, 1)} o 2 × la de PyTorch ({sci(r['pytorch_fp32_max_step_drift'], lang)})",
            ),
            yes(d["step_drift"]["max"] <= max(FP32_DRIFT_BOUND, 2 * r["pytorch_fp32_max_step_drift"]), lang),
        ],
        [
            f"{dptp_name}: "
            + tr(
                lang,
                "whole parameters bit-identical on every rank",
                "parámetros enteros idénticos bit a bit en cada rank",
            ),
            yes(d["replicated_bit_identical"], lang),
            tr(lang, "after every step", "tras cada paso"),
            yes(d["replicated_bit_identical"], lang),
        ],
    ]
    head = [
        tr(lang, f"{r['world_size']} ranks", f"{r['world_size']} ranks"),
        tr(lang, "measured", "medido"),
        tr(lang, "bound or model", "cota o modelo"),
        tr(lang, "holds", "se cumple"),
    ]
    return table(head, rows) + _measured(r, lang)


def batch(r: dict, lang: str) -> str:
    """Each mesh's batch plan: what one optimizer step sees, and the learning rate a rank's tuning
    would move to it (the runs keep the base rate: their twin trains the same batch)."""
    rows = []
    for key, name in (
        ("hsdp", tr(lang, "HSDP (every rank data-parallel)", "HSDP (todos los ranks en paralelismo de datos)")),
        ("dp_tp", tr(lang, "DP × TP (the `dp` groups)", "DP × TP (los grupos `dp`)")),
    ):
        plan = r["batch_plans"][key]
        dp = r["world_size"] if key == "hsdp" else r["mesh"]["dp_tp"]["dp"]
        rows.append(
            [
                name,
                num(dp, lang),
                num(plan["effective_batch"] // dp, lang),
                num(plan["effective_batch"], lang),
                num(plan["lr_linear"] / dp, lang, 4),
                num(plan["lr_linear"], lang, 4),
                num(plan["lr_sqrt"], lang, 4),
            ]
        )
    head = [
        tr(lang, "mesh", "malla"),
        tr(lang, "data-parallel ranks", "ranks de datos"),
        tr(lang, "sequences per rank", "secuencias por rank"),
        tr(lang, "effective batch", "lote efectivo"),
        tr(lang, "lr tuned for one rank", "tasa de aprendizaje ajustada para un rank"),
        tr(lang, "lr, linear rule", "tasa de aprendizaje, regla lineal"),
        tr(lang, "lr, sqrt rule", "tasa de aprendizaje, regla de la raíz"),
    ]
    return table(head, rows)


def checked(r: dict, lang: str) -> str:
    """The check's rulers (:mod:`minigpt.pages.rulers`)."""
    return rulers.table(r, lang) + _measured(r, lang)


def fragment(report: dict, lang: str) -> str:
    if is_mesh(report):
        sections = {"mesh": mesh, "batch": batch, "rulers": checked}
    else:
        sections = {"proofs": proofs, "bubble": bubble, "chart": chart, "rulers": checked}
    return "".join(
        f"<!-- --8<-- [start:{name}] -->\n{section(report, lang)}<!-- --8<-- [end:{name}] -->\n"
        for name, section in sections.items()
    )


def render(json_path: str | Path) -> list[Path]:
    """``X.json`` -> ``X-en.txt`` and ``X-es.txt``."""
    return write_tables(json_path, fragment)


# ----------------------------------------------------------------------------------------------
# The page's figures, from the committed runs

RESULTS = Path(__file__).resolve().parents[2] / "lab" / "results"
PIPELINE_REPORTS = {2: RESULTS / "06-pipeline-cpu.json", 4: RESULTS / "06-pipeline-4-cpu.json"}
MESH_REPORT = RESULTS / "06-mesh-cpu.json"
STAGE_COLORS = {2: "#4C72B0", 4: "#DD8452"}


def _load(path: Path) -> dict:
    import json

    return json.loads(path.read_text())


def bubble_points(report: dict) -> dict:
    """``{schedule: [(m, measured, model), ...]}`` from a pipeline report's ``bubble`` section, by m."""
    return {
        schedule: sorted((int(m), v["measured"], v["model"]) for m, v in report["bubble"][schedule].items())
        for schedule in SCHEDULE_NAMES
    }


def plot_bubble(path: Path, lang: str) -> None:
    """The bubble against the number of micro-batches: (p-1)/(m+p-1) as a curve, the committed
    runs' measurements (2 and 4 stages, GPipe and 1F1B) as points."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.2, 4.0))
    ax = fig.add_subplot()
    markers = {"gpipe": "o", "1f1b": "^"}
    for p, report_path in PIPELINE_REPORTS.items():
        points = bubble_points(_load(report_path))
        color = STAGE_COLORS[p]
        ms = [m for m, _, _ in points["gpipe"]]
        curve = [1 + i / 20 for i in range(20 * (max(ms) - 1) + 1)]
        ax.plot(curve, [100 * bubble_model(p, m) for m in curve], color=color, linewidth=1.5, zorder=1)
        ax.text(
            max(ms) * 1.04,
            100 * bubble_model(p, max(ms)),
            tr(lang, f"p = {p}, model", f"p = {p}, modelo"),
            color=color,
            fontsize=8,
            va="center",
        )
        for schedule, name in SCHEDULE_NAMES.items():
            shift = 0.97 if schedule == "gpipe" else 1.03  # side by side, not on top of each other
            ax.scatter(
                [m * shift for m, _, _ in points[schedule]],
                [100 * measured for _, measured, _ in points[schedule]],
                marker=markers[schedule],
                facecolor=color if schedule == "gpipe" else "white",
                edgecolor=color,
                s=36,
                zorder=3,
                label=tr(lang, f"p = {p}, {name}, measured", f"p = {p}, {name}, medido"),
            )
    ax.set_xscale("log", base=2)
    ax.set_xticks(ms, [str(m) for m in ms])
    ax.set_xlim(0.8, max(ms) * 1.6)
    ax.set_ylim(0, 80)
    ax.set_xlabel(tr(lang, "micro-batches m", "microlotes m"))
    ax.set_ylabel(tr(lang, "bubble (% of the step idle)", "burbuja (% del paso inactivo)"))
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7.5, loc="lower left", ncol=2)
    ax.set_title(
        tr(
            lang,
            "The model (p−1)/(m+p−1) and the bubble measured by Lab 06's check",
            "El modelo (p−1)/(m+p−1) y la burbuja medida por la comprobación del laboratorio 06",
        ),
        fontsize=9.5,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight", pad_inches=0.08, metadata={"Software": None})


TIMELINE_M = 8  # the micro-batches of the timelines the page draws: the default run's
KIND_COLORS = {"F": "#4C72B0", "B": "#DD8452"}


def timelines(report: dict, m: int = TIMELINE_M) -> dict[str, list[list[tuple[str, int, float, float]]]]:
    """``{schedule: [stage 0's operations, stage 1's, ...]}``, each operation ``(kind, micro-batch,
    start_s, end_s)`` in the order the stage ran it: the median step of the bubble's measurement at
    ``m`` micro-batches (``bubble.<schedule>.<m>.timeline``), seconds from the step's common start."""
    return {
        schedule: [
            [(kind, int(i), float(a), float(b)) for kind, i, a, b in stage]
            for stage in report["bubble"][schedule][str(m)]["timeline"]
        ]
        for schedule in SCHEDULE_NAMES
    }


def draw_stages(
    ax,
    stages: list[list[tuple[str, int, float, float]]],
    lang: str,
    unit: str = "ms",
    span: float | None = None,
    waited: list[float] | None = None,
) -> None:
    """One row per stage, one bar per operation (forward blue, backward orange, its micro-batch
    written inside when the bar is wide enough): the measured timelines of the page, and the
    notebook's schedules as ``check_schedule`` plays them (``unit`` "" for its clock's units).
    ``waited``: each stage's seconds blocked in receives, written at the end of its row."""
    scale = 1000.0 if unit == "ms" else 1.0
    span = (span or max((end for ops in stages for _, _, _, end in ops), default=1.0)) * scale
    for s, ops in enumerate(stages):
        for kind, i, start, end in ops:
            width = (end - start) * scale
            ax.barh(s, width, left=start * scale, height=0.7, color=KIND_COLORS[kind], edgecolor="white", linewidth=0.6)
            if width > span / 60:
                ax.text(start * scale + width / 2, s, str(i), ha="center", va="center", fontsize=6.5, color="white")
        if waited is not None:
            end = max(e for _, _, _, e in ops) * scale
            ms = num(1000 * waited[s], lang)
            ax.text(end + span / 80, s, tr(lang, f"waited {ms} ms", f"esperó {ms} ms"), va="center", fontsize=7)
    ax.set_yticks(range(len(stages)), [tr(lang, f"stage {s}", f"etapa {s}") for s in range(len(stages))], fontsize=8)
    ax.set_ylim(len(stages) - 0.5, -0.5)
    ax.set_xlim(0, span * (1.2 if waited is not None else 1.01))
    ax.tick_params(axis="x", labelsize=7.5)
    ax.grid(True, axis="x", alpha=0.3)


def plot_timelines(path: Path, lang: str) -> None:
    """The measured GPipe and 1F1B steps of the committed runs (2 and 4 stages, m = 8): every
    stage's forwards and backwards on the wall clock, from the median step's timestamps."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10.0, 5.6))
    axes = fig.subplots(
        len(PIPELINE_REPORTS), len(SCHEDULE_NAMES), gridspec_kw={"height_ratios": list(PIPELINE_REPORTS)}
    )
    for row, (p, report_path) in zip(axes, PIPELINE_REPORTS.items()):  # a row per pipeline: 2 stages, then 4
        report = _load(report_path)
        found = timelines(report)
        span = max(end for stages in found.values() for ops in stages for _, _, _, end in ops)
        for ax, (schedule, stages) in zip(row, found.items()):  # GPipe left, 1F1B right, on the same clock
            draw_stages(ax, stages, lang, span=span, waited=report["bubble"][schedule][str(TIMELINE_M)]["waited_s"])
            measured = report["bubble"][schedule][str(TIMELINE_M)]["measured"]
            ax.set_title(
                tr(
                    lang,
                    f"{SCHEDULE_NAMES[schedule]}, {p} stages, m = {TIMELINE_M}: bubble {pct(measured, lang)}",
                    f"{SCHEDULE_NAMES[schedule]}, {p} etapas, m = {TIMELINE_M}: burbuja {pct(measured, lang)}",
                ),
                fontsize=9,
            )
    for ax in axes[-1]:
        ax.set_xlabel(
            tr(
                lang,
                "ms from the step's common start (the median step)",
                "ms desde el inicio común del paso (el paso mediano)",
            ),
            fontsize=8,
        )
    kinds_legend(fig, lang)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight", pad_inches=0.08, metadata={"Software": None})


def kinds_legend(fig, lang: str) -> None:
    """The two colours of a timeline (forward, backward), under the figure."""
    from matplotlib.patches import Patch

    fig.legend(
        handles=[
            Patch(
                color=KIND_COLORS["F"],
                label=tr(lang, "forward of micro-batch i", "pasada hacia delante del microlote i"),
            ),
            Patch(
                color=KIND_COLORS["B"],
                label=tr(lang, "backward of micro-batch i", "pasada hacia atrás del microlote i"),
            ),
        ],
        loc="lower center",
        ncol=2,
        fontsize=8,
        bbox_to_anchor=(0.5, -0.02),
    )


def schedule_figure(played: dict[str, list], lang: str):
    """The notebook's chart: ``{name: ops as check_schedule plays them}`` (a forward one unit of its
    clock, a backward two), one panel per schedule, drawn like the page's measured timelines."""
    from matplotlib.figure import Figure

    fig = Figure(
        figsize=(9.0, 1.2 + 1.3 * len(played) * max(1 + max(op.stage for op in ops) for ops in played.values()) / 4)
    )
    axes = fig.subplots(len(played), 1, squeeze=False)[:, 0]
    for ax, (name, ops) in zip(axes, played.items()):
        stages = [[] for _ in range(1 + max(op.stage for op in ops))]
        for op in sorted(ops, key=lambda op: op.start):
            stages[op.stage].append((op.kind, op.micro_batch, op.start, op.end))
        draw_stages(ax, stages, lang, unit="")
        ax.set_title(name, fontsize=9)
    axes[-1].set_xlabel(
        tr(
            lang,
            "time (a forward 1 unit, a backward 2)",
            "tiempo (una pasada hacia delante 1 unidad, una hacia atrás 2)",
        ),
        fontsize=8,
    )
    kinds_legend(fig, lang)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return fig


def schedule_png(played: dict[str, list], lang: str) -> bytes:
    """:func:`schedule_figure` as PNG bytes, for ``IPython.display.Image`` in a notebook."""
    import io

    out = io.BytesIO()
    schedule_figure(played, lang).savefig(out, format="png", dpi=100, bbox_inches="tight", metadata={"Software": None})
    return out.getvalue()


MESH_DIMS = {  # the report's key -> (dimension of the rows, of the columns), as init_device_mesh names them
    "hsdp": ("replicate", "shard"),
    "dp_tp": ("dp", "tp"),
}


def mesh_groups(degrees: dict[str, int]) -> dict[str, list[list[int]]]:
    """The rank groups of a 2-D mesh ``{outer: R, inner: S}`` (in that order) laid out as
    ``init_device_mesh`` lays out ``arange(R * S).reshape(R, S)``: a group of the inner dimension is
    a row (consecutive ranks), a group of the outer one a column. From Lab 02's
    :func:`minigpt.zero.analytic.hsdp_groups`, which lays out HSDP's shard and replica groups so."""
    from minigpt.zero import analytic as za

    (outer, rows), (inner, per_row) = degrees.items()
    rows_groups, column_groups = za.hsdp_groups(per_row, rows)
    return {inner: rows_groups, outer: column_groups}


MESH_WORDS = {  # dimension -> (what runs along it, en / es)
    "shard": (
        "all-gather of the weights, reduce-scatter of the gradients",
        "all-gather de los pesos, reduce-scatter de los gradientes",
    ),
    "replicate": ("all-reduce of each gradient shard", "all-reduce de cada fragmento del gradiente"),
    "tp": ("all-reduces of the activations, every layer", "all-reduce de las activaciones, en cada capa"),
    "dp": ("all-reduce of the gradients (DDP), once per step", "all-reduce de los gradientes (DDP), una vez por paso"),
}


def plot_mesh(path: Path, lang: str) -> None:
    """The committed mesh run's two readings of four ranks as a 2 x 2 grid: HSDP's shard groups
    (rows) and replicate groups (columns), DP x TP's tp groups (rows) and dp groups (columns)."""
    from matplotlib.figure import Figure
    from matplotlib.patches import FancyBboxPatch

    report = _load(MESH_REPORT)
    fig = Figure(figsize=(8.2, 3.9))
    axes = fig.subplots(1, 2)
    titles = {"hsdp": "HSDP", "dp_tp": "DP × TP"}
    row_color, column_color = "#4C72B0", "#DD8452"
    for ax, (key, (outer, inner)) in zip(axes, MESH_DIMS.items()):
        degrees = {outer: report["mesh"][key][outer], inner: report["mesh"][key][inner]}
        groups = mesh_groups(degrees)
        ax.set_xlim(-0.2, 4.6)
        ax.set_ylim(4.1, -0.6)
        ax.axis("off")
        ax.set_title(
            f"{titles[key]}: " + tr(lang, f"mesh ({outer!r}, {inner!r})", f"malla ({outer!r}, {inner!r})"), fontsize=9.5
        )
        for i, group in enumerate(groups[inner]):  # rows
            y = 0.4 + 1.3 * i
            ax.add_patch(
                FancyBboxPatch(
                    (0.05, y - 0.42),
                    2.5,
                    0.84,
                    boxstyle="round,pad=0.02,rounding_size=0.15",
                    facecolor="none",
                    edgecolor=row_color,
                    linewidth=2,
                )
            )
            ax.text(
                2.7,
                y,
                tr(
                    lang,
                    f"{inner} group {i}:\nranks {group[0]}, {group[1]}",
                    f"grupo {inner} {i}:\nranks {group[0]}, {group[1]}",
                ),
                va="center",
                fontsize=8,
                color=row_color,
            )
            for j, rank in enumerate(group):
                x = 0.6 + 1.4 * j
                ax.add_patch(
                    FancyBboxPatch(
                        (x - 0.38, y - 0.3),
                        0.76,
                        0.6,
                        boxstyle="round,pad=0.02,rounding_size=0.1",
                        facecolor="#f2f2f2",
                        edgecolor="#555555",
                    )
                )
                ax.text(x, y, f"rank {rank}", ha="center", va="center", fontsize=8.5)
        for j, group in enumerate(groups[outer]):  # columns
            x = 0.6 + 1.4 * j
            ax.add_patch(
                FancyBboxPatch(
                    (x - 0.5, -0.12),
                    1.0,
                    2.05,
                    boxstyle="round,pad=0.02,rounding_size=0.15",
                    facecolor="none",
                    edgecolor=column_color,
                    linewidth=2,
                    linestyle="--",
                )
            )
            ax.text(
                x,
                2.2,
                tr(
                    lang,
                    f"{outer} group {j}:\nranks {group[0]}, {group[1]}",
                    f"grupo {outer} {j}:\nranks {group[0]}, {group[1]}",
                ),
                ha="center",
                va="top",
                fontsize=8,
                color=column_color,
            )
        ax.text(0.05, 3.15, f"{inner}: " + tr(lang, *MESH_WORDS[inner]), fontsize=7.5, color=row_color, va="top")
        ax.text(0.05, 3.55, f"{outer}: " + tr(lang, *MESH_WORDS[outer]), fontsize=7.5, color=column_color, va="top")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight", pad_inches=0.08, metadata={"Software": None})


FIGURES = {
    "pipeline-bubble-measured": plot_bubble,
    "pipeline-timelines-measured": plot_timelines,
    "device-mesh-2x2": plot_mesh,
}
