"""Lab 07's tables and figures (the N-D mesh, each layout against one process and PyTorch), in English
and Spanish, for the lab page.

* ``lab/results/07-nd-parallel-cpu-{en,es}.txt`` (``python lab/07_nd_parallel.py --render
  lab/results/07-nd-parallel-cpu.json``): sections ``layouts`` (per layout: the bytes of each mesh
  dimension against the model, the model states per rank, the whole parameters from every rank's
  pieces, PyTorch's composition) and ``rulers`` (the check's verdict);
* the table ``nd-examples``: what other frameworks' configurations cost in bytes per dimension by the
  same model (:func:`example_bytes`), written by ``python -m minigpt.pages``;
* the figures ``nd-mesh-groups`` (the 8 ranks and the groups of every dimension, both layouts, from the
  committed run) and ``nd-bytes-per-dim`` (each dimension's bytes per step, measured and model).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from minigpt.pages import rulers
from minigpt.pages.lang import num, sci, size, table, tr, write_tables, yes

RESULTS = Path(__file__).resolve().parents[2] / "lab" / "results"
REPORT = RESULTS / "07-nd-parallel-cpu.json"
DIMS = ("tp", "cp", "dp_shard_cp", "dp_replicate")
DIM_WORDS = {
    "tp": ("tensor parallel: every layer's all-reduces", "paralelismo de tensores: los all-reduce de cada capa"),
    "cp": ("context parallel: ring attention's K and V", "paralelismo de contexto: K y V de la atención en anillo"),
    "dp_shard_cp": (
        "FSDP over dp_shard x cp: all-gathers, reduce-scatters",
        "FSDP sobre dp_shard x cp: all-gather y reduce-scatter",
    ),
    "dp_replicate": (
        "HSDP replicas: the gradient shards' all-reduce",
        "réplicas HSDP: el all-reduce de los fragmentos de gradiente",
    ),
}
COLORS = {"tp": "#4C72B0", "cp": "#DD8452", "dp_shard": "#55A868", "dp_replicate": "#C44E52", "dp_shard_cp": "#8172B2"}


def _measured(r: dict, lang: str) -> str:
    return tr(
        lang,
        f"\nMeasured {r['date']} with torch {r['torch']} on CPU ({r['backend']}), {r['world_size']} ranks, "
        f"{r['steps']} steps per layout.\n",
        f"\nMedido el {r['date']} con torch {r['torch']} en CPU ({r['backend']}), {r['world_size']} ranks, "
        f"{r['steps']} pasos por disposición.\n",
    )


def layouts(r: dict, lang: str) -> str:
    """Per layout: each dimension's bytes against the model, the model states per rank against the
    model, the parameters joined from every rank's pieces, and PyTorch's composition."""
    model = tr(lang, "model", "modelo")
    rows = []
    for name, layout in r["layouts"].items():
        sent, want = layout["bytes_per_dim"], layout["bytes_model_per_dim"]
        for dim in sent:
            rows.append(
                [
                    f"{name}: `{dim}`, "
                    + tr(lang, "bytes one rank sends per step", "bytes que envía un rank por paso"),
                    num(sent[dim], lang),
                    f"{model}: {num(want[dim], lang)}",
                    yes(sent[dim] == want[dim] and layout["bytes_every_rank_equal_model"], lang),
                ]
            )
        memory = layout["memory_per_rank"]
        if "every_rank" in memory:
            every = tr(lang, f"all {len(memory['every_rank'])} ranks", f"los {len(memory['every_rank'])} ranks")
            holds = all(m == memory["model"] for m in memory["every_rank"])
        else:  # a pipeline: each rank its own stage's model
            every = tr(lang, "rank 0; every rank its stage's", "rank 0; cada rank el de su etapa")
            holds = memory["every_rank_equal_model"]
        rows.append(
            [
                f"{name}: "
                + tr(
                    lang, "model-state bytes per rank after a step", "bytes de estados del modelo por rank tras un paso"
                ),
                num(memory["measured"], lang),
                f"{model}: {num(memory['model'], lang)}, {every}",
                yes(holds, lang),
            ]
        )
        rulers_ = layout["rulers"]
        if "whole_from_pieces" not in layout:  # a pipeline: no FSDP pieces, no PyTorch composition
            rows.append(
                [
                    f"{name}: "
                    + tr(
                        lang,
                        "same stage and tp coordinate, same bits (and both copies of the tied matrix)",
                        "misma etapa y coordenada tp, mismos bits (y las dos copias de la matriz atada)",
                    ),
                    yes(layout["ranks_bit_identical"], lang),
                    tr(lang, "every rank", "cada rank"),
                    yes(layout["ranks_bit_identical"], lang),
                ]
            )
            continue
        pieces = layout["whole_from_pieces"]
        rows.append(
            [
                f"{name}: "
                + tr(
                    lang,
                    "parameters joined from every rank's pieces (7.3), bit for bit",
                    "parámetros unidos a partir de los trozos de cada rank (7.3), bit a bit",
                ),
                num(pieces["parameters"], lang),
                tr(lang, "every rank", "cada rank"),
                yes(pieces["bit_identical_every_rank"], lang),
            ]
        )
        rows.append(
            [
                f"{name}: "
                + tr(
                    lang,
                    "first step, whole batch's logits against PyTorch's composition",
                    "primer paso, logits del lote entero frente a la composición de PyTorch",
                ),
                "0"
                if rulers_["pytorch_first_step_logit_diff"] == 0
                else sci(rulers_["pytorch_first_step_logit_diff"], lang),
                f"≤ {sci(rulers_['pytorch_one_step_bound'], lang, 1)}",
                yes(rulers_["pytorch_first_step_logit_diff"] <= rulers_["pytorch_one_step_bound"], lang),
            ]
        )
        grads = rulers_.get("pytorch_first_step_grad_diff")
        if grads is not None:
            rows.append(
                [
                    f"{name}: "
                    + tr(
                        lang,
                        "first step, every whole gradient against PyTorch's composition",
                        "primer paso, cada gradiente entero frente a la composición de PyTorch",
                    ),
                    "0" if grads == 0 else sci(grads, lang),
                    f"≤ {sci(rulers_['pytorch_one_step_bound'], lang, 1)}",
                    yes(grads <= rulers_["pytorch_one_step_bound"], lang),
                ]
            )
    head = [
        tr(lang, "layout: what", "disposición: qué"),
        tr(lang, "measured", "medido"),
        tr(lang, "model or bound", "modelo o cota"),
        tr(lang, "holds", "se cumple"),
    ]
    return table(head, rows) + _measured(r, lang)


def checked(r: dict, lang: str) -> str:
    return rulers.table(r, lang) + _measured(r, lang)


def fragment(report: dict, lang: str) -> str:
    sections = {"layouts": layouts, "rulers": checked}
    return "".join(
        f"<!-- --8<-- [start:{name}] -->\n{section(report, lang)}<!-- --8<-- [end:{name}] -->\n"
        for name, section in sections.items()
    )


def render(json_path: str | Path) -> list[Path]:
    """``X.json`` -> ``X-en.txt`` and ``X-es.txt``."""
    return write_tables(json_path, fragment)


# ----------------------------------------------------------------------------------------------
# Other frameworks' configurations, costed by the same model


def gpt_units(n_embd: int, n_layer: int, vocab: int, block_size: int, tp: int) -> list[list[tuple[int, ...]]]:
    """The TP-local parameter shapes of a MiniGPT-shaped model (GPT-2 blocks: fused q, k, v, a 4x MLP
    with biases, layer norms, learned positions, the output layer tied to the embedding), unit by
    unit as Lab 07 wraps them: the root (embeddings, final norm), then each block."""
    C, padded_vocab = n_embd, -(-vocab // tp) * tp
    root = [(padded_vocab // tp, C), (block_size, C), (C,), (C,)]
    block = [
        (C,),
        (C,),
        (3 * C // tp, C),
        (C, C // tp),
        (C,),
        (C,),
        (4 * C // tp, C),
        (4 * C // tp,),
        (C, 4 * C // tp),
        (C,),
    ]
    return [root] + [list(block) for _ in range(n_layer)]


def example_bytes(model: dict, degrees: dict[str, int], batch_rows: int) -> dict[str, int]:
    """One rank's bytes per step along each dimension (float32), by the lab's model
    (``bytes_model_per_dim``), for a MiniGPT-shaped ``model`` (``n_embd``, ``n_layer``, ``n_head``,
    ``vocab``, ``block_size``) on the mesh of ``degrees`` with a global batch of ``batch_rows`` rows."""
    from minigpt.parallel.mesh.nd import NDMesh
    from minigpt.parallel.mesh.nd_model import bytes_model_per_dim

    mesh = NDMesh(**degrees)
    cfg = SimpleNamespace(batch_size=batch_rows, block_size=model["block_size"], n_embd=model["n_embd"])
    cfg.n_layer, cfg.n_head = model["n_layer"], model["n_head"]
    units = gpt_units(model["n_embd"], model["n_layer"], model["vocab"], model["block_size"], mesh.tp)
    return bytes_model_per_dim(cfg, mesh, units)


# an 8B-class model in MiniGPT's shape (Llama 3.1 8B's width, depth, heads, vocabulary and an 8K context;
# its own blocks differ: grouped-query attention, a SwiGLU MLP of 14,336, no biases, rotary positions)
EIGHT_B = {"n_embd": 4096, "n_layer": 32, "n_head": 32, "vocab": 128_256, "block_size": 8192}
EXAMPLES = [
    # (who, their settings, our degrees, global batch in rows)
    (
        ("Accelerate's ND-parallel guide, 2 nodes of 8", "guía de paralelismo ND de Accelerate, 2 nodos de 8"),
        "ParallelismConfig(dp_replicate_size=2, dp_shard_size=2, cp_size=2, tp_size=2)",
        {"dp_replicate": 2, "dp_shard": 2, "cp": 2, "tp": 2},
        4,
    ),
    (
        ("the same 16 GPUs, TP on a whole node", "las mismas 16 GPU, TP en un nodo entero"),
        # with TP, Accelerate refuses pure replication (dp_replicate > 1, dp_shard 1): FSDP across the nodes
        "ParallelismConfig(dp_shard_size=2, tp_size=8)",
        {"dp_replicate": 1, "dp_shard": 2, "cp": 1, "tp": 8},
        4,
    ),
    (
        (
            "64 GPUs in OLMo-core's settings: HSDP with TP, 8 nodes of 8",
            "64 GPU con los ajustes de OLMo-core: HSDP con TP, 8 nodos de 8",
        ),
        "hsdp: num_replicas=8, shard_degree=4; tp: degree=2",
        {"dp_replicate": 8, "dp_shard": 4, "cp": 1, "tp": 2},
        32,
    ),
    (
        ("the same 64 GPUs, plain FSDP", "las mismas 64 GPU, FSDP simple"),
        "fsdp: shard_degree=64",
        {"dp_replicate": 1, "dp_shard": 64, "cp": 1, "tp": 1},
        64,
    ),
]


def examples(lang: str) -> str:
    rows = []
    for (en, es), settings, degrees, batch in EXAMPLES:
        got = example_bytes(EIGHT_B, degrees, batch)
        mesh = " × ".join(str(degrees[d]) for d in ("dp_replicate", "dp_shard", "cp", "tp"))
        rows.append(
            [tr(lang, en, es), f"`{settings}`", mesh, num(batch, lang)]
            + [size(got[d], lang, 1, "GB") if got[d] else "0" for d in DIMS]
        )
    head = [
        tr(lang, "configuration", "configuración"),
        tr(lang, "their settings", "sus ajustes"),
        "R × S × C × T",
        tr(lang, "rows per step", "filas por paso"),
        *(f"`{d}`" for d in DIMS),
    ]
    return table(head, rows, left=3)


TABLES = {"nd-examples": examples}


# ----------------------------------------------------------------------------------------------
# The figures, from the committed run


def _load() -> dict:
    return json.loads(REPORT.read_text(encoding="utf-8"))


def plot_groups(path: Path, lang: str) -> None:
    """Both layouts of the committed run: the 8 ranks as two nodes of four, each rank's coordinates,
    and the groups of each dimension of more than one rank as coloured links."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    report = _load()
    fig, axes = plt.subplots(1, 2, figsize=(11.5, 4.6))
    for ax, (name, layout) in zip(axes, report["layouts"].items()):
        groups, degrees = layout["groups"], layout["mesh"]
        ax.set_xlim(-0.6, 4.0)
        ax.set_ylim(-1.2, 3.3)
        ax.axis("off")
        pos = {r: (r % 4, 2.0 - 1.6 * (r // 4)) for r in range(8)}
        for node in (0, 1):
            ax.add_patch(
                FancyBboxPatch(
                    (-0.45, pos[4 * node][1] - 0.5),
                    3.9,
                    1.0,
                    boxstyle="round,pad=0.02,rounding_size=0.1",
                    facecolor="#fafafa",
                    edgecolor="#bbbbbb",
                )
            )
            ax.text(
                3.5,
                pos[4 * node][1] + 0.42,
                tr(lang, f"node {node}", f"nodo {node}"),
                fontsize=8,
                ha="right",
                color="#777777",
            )
        shown = [d for d in ("tp", "cp", "dp_shard", "dp_replicate") if degrees[d] > 1]
        offsets = {d: 0.08 * (i - (len(shown) - 1) / 2) for i, d in enumerate(shown)}
        for d in shown:
            for group in groups[d]:
                xs = [pos[r][0] + offsets[d] for r in group]
                ys = [pos[r][1] + offsets[d] for r in group]
                curve = 0.25 if d in ("dp_shard", "cp") and len({y for y in ys}) == 1 else 0.0
                if curve:
                    for a, b in zip(group, group[1:]):
                        ax.annotate(
                            "",
                            xy=(pos[b][0], pos[b][1] + 0.25),
                            xytext=(pos[a][0], pos[a][1] + 0.25),
                            arrowprops=dict(arrowstyle="-", color=COLORS[d], lw=2.2, connectionstyle="arc3,rad=-0.35"),
                        )
                else:
                    ax.plot(xs, ys, color=COLORS[d], lw=2.2, solid_capstyle="round", zorder=1)
        for r, (x, y) in pos.items():
            ax.add_patch(
                FancyBboxPatch(
                    (x - 0.33, y - 0.27),
                    0.66,
                    0.54,
                    boxstyle="round,pad=0.02,rounding_size=0.08",
                    facecolor="white",
                    edgecolor="#444444",
                    zorder=2,
                )
            )
            c = [str(v) for v in _coords(r, degrees)]
            ax.text(x, y + 0.08, f"rank {r}", ha="center", va="center", fontsize=8.5, zorder=3)
            ax.text(
                x, y - 0.13, "(" + ",".join(c) + ")", ha="center", va="center", fontsize=7, color="#555555", zorder=3
            )
        title = tr(
            lang,
            "HSDP x TP" if degrees["dp_replicate"] > 1 else "FSDP x CP x TP",
            "HSDP x TP" if degrees["dp_replicate"] > 1 else "FSDP x CP x TP",
        )
        ax.set_title(f"{title}: {name}", fontsize=10)
        legend = [(d, d) for d in shown]
        if degrees["cp"] > 1:
            legend.append(("dp_shard_cp", tr(lang, "dp_shard x cp (FSDP's group)", "dp_shard x cp (el grupo de FSDP)")))
        for i, (d, label) in enumerate(legend):
            members = " ".join("(" + ",".join(map(str, g)) + ")" for g in groups[d])
            ax.text(-0.45, -0.55 - 0.22 * i, f"{label}: {members}", fontsize=7.5, color=COLORS[d])
    fig.text(
        0.5,
        0.005,
        tr(
            lang,
            "(r, s, c, t): a rank's coordinates along dp_replicate, dp_shard, cp, tp; tp varies fastest",
            "(r, s, c, t): las coordenadas de un rank en dp_replicate, dp_shard, cp, tp; tp varía más deprisa",
        ),
        ha="center",
        fontsize=8,
        color="#555555",
    )
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight", pad_inches=0.08, metadata={"Software": None})
    plt.close(fig)


def _coords(rank: int, degrees: dict[str, int]) -> list[int]:
    out = []
    for d in ("tp", "cp", "dp_shard", "dp_replicate"):
        rank, c = divmod(rank, degrees[d])
        out.append(c)
    return out[::-1]


def plot_bytes(path: Path, lang: str) -> None:
    """Each dimension's bytes per rank per step in both layouts of the committed run: the measured bars,
    the model as a black line on each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    report = _load()
    names = list(report["layouts"])
    fig, ax = plt.subplots(figsize=(8.5, 3.9))
    width = 0.38
    for i, name in enumerate(names):
        layout = report["layouts"][name]
        for j, d in enumerate(DIMS):
            x = j + (i - 0.5) * width
            measured, model = layout["bytes_per_dim"][d] / 1e6, layout["bytes_model_per_dim"][d] / 1e6
            hatch = None if i == 0 else "//"
            ax.bar(
                x,
                measured,
                width * 0.92,
                color=COLORS[d],
                alpha=1.0 if i == 0 else 0.55,
                edgecolor="#333333",
                hatch=hatch,
            )
            ax.plot([x - width * 0.46, x + width * 0.46], [model, model], color="black", lw=1.5)
            ax.text(x, measured + 0.05, num(measured, lang, 2), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(DIMS)))
    ax.set_xticklabels([f"`{d}`".strip("`") for d in DIMS], fontsize=9)
    ax.set_ylabel(tr(lang, "MB one rank sends per step", "MB que envía un rank por paso"))
    ax.set_ylim(0, 4.3)
    kinds = ["HSDP x TP", "FSDP x CP x TP"]
    ax.legend(
        handles=[
            Patch(facecolor="#999999", edgecolor="#333333", label=f"{kinds[0]} ({names[0]})"),
            Patch(facecolor="#cccccc", edgecolor="#333333", hatch="//", label=f"{kinds[1]} ({names[1]})"),
            plt.Line2D([0], [0], color="black", lw=1.5, label=tr(lang, "the model", "el modelo")),
        ],
        fontsize=8,
        frameon=False,
        loc="upper right",
    )
    ax.set_title(
        tr(
            lang,
            "Bytes one rank sends per step, along each mesh dimension: measured and the model",
            "Bytes que envía un rank por paso, por dimensión de la malla: medidos y el modelo",
        ),
        fontsize=10,
    )
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight", pad_inches=0.08, metadata={"Software": None})
    plt.close(fig)


FIGURES = {"nd-mesh-groups": plot_groups, "nd-bytes-per-dim": plot_bytes}
