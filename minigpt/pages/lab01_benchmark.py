"""The tables and the timeline figure of Lab 01's benchmark, in English and Spanish, for the lab page
(``lab/results/01-benchmark-cpu-*``, included by the page).

    python lab/01_benchmark.py --render lab/results/01-benchmark-cpu.json
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from minigpt.pages.lang import LANGS

LABELS = {
    "en": {
        "variant": "variant",
        "median": "median step (ms)",
        "ratio": "vs PyTorch DDP (median of rounds)",
        "range": "range over rounds",
        "cap": "bucket cap (MiB)",
        "buckets": "buckets",
        "one process": "one process (whole batch)",
        "naive": "naive (per-gradient all-reduce after backward)",
        "bucketed": "hand-rolled BucketedDDP",
        "torch-ddp": "PyTorch DistributedDataParallel",
        "xlabel": "ms since the forward pass started",
        "ylabel": "bucket",
        "grads": "gradients produced (backward)",
        "reduce": "all-reduce in flight",
        "bwd": "loss.backward() returns",
        "bwd_start": "loss.backward() called",
        "title": "One step of BucketedDDP, {n} ranks",
    },
    "es": {
        "variant": "variante",
        "median": "paso, mediana (ms)",
        "ratio": "frente a DDP de PyTorch (mediana de rondas)",
        "range": "rango en las rondas",
        "cap": "tope del bucket (MiB)",
        "buckets": "buckets",
        "one process": "un proceso (lote entero)",
        "naive": "ingenua (all-reduce por gradiente tras la pasada hacia atrás)",
        "bucketed": "BucketedDDP hecho a mano",
        "torch-ddp": "DistributedDataParallel de PyTorch",
        "xlabel": "ms desde el inicio de la pasada hacia delante",
        "ylabel": "bucket",
        "grads": "gradientes calculados (pasada hacia atrás)",
        "reduce": "all-reduce en curso",
        "bwd": "loss.backward() devuelve el control",
        "bwd_start": "se llama a loss.backward()",
        "title": "Un paso de BucketedDDP, {n} ranks",
    },
}


SHAPE_LABELS = {
    "en": {
        "shape": "model",
        "parameters": "parameters (tensors)",
        "cap": "bucket cap (MiB)",
        "ratio": "hand-rolled / PyTorch DDP: median (range over rounds)",
        "buckets": "buckets",
        "version": "version of the hand-rolled DDP",
        "minigpt": "MiniGPT",
        "deep-mlp": "deep MLP",
        "wide-shallow": "wide, shallow MLP",
        "many-small": "many small layers",
    },
    "es": {
        "shape": "modelo",
        "parameters": "parámetros (tensores)",
        "cap": "tope del bucket (MiB)",
        "ratio": "hecho a mano / DDP de PyTorch: mediana (rango en las rondas)",
        "buckets": "buckets",
        "version": "versión del DDP hecho a mano",
        "minigpt": "MiniGPT",
        "deep-mlp": "MLP profundo",
        "wide-shallow": "MLP ancho y poco profundo",
        "many-small": "muchas capas pequeñas",
    },
}
VERSION_LABELS = {
    "en": {
        "first version": "first version",
        "+ buckets closed at the cap": "+ buckets closed at the cap",
        "+ one call per bucket": "+ one call per bucket (not per tensor)",
        "+ gradients as bucket views": "+ gradients as bucket views",
    },
    "es": {
        "first version": "primera versión",
        "+ buckets closed at the cap": "+ buckets cerrados al llegar al tope",
        "+ one call per bucket": "+ una llamada por bucket (no por tensor)",
        "+ gradients as bucket views": "+ gradientes como vistas del bucket",
    },
}


def number(value: float, lang: str, digits: int = 1) -> str:
    text = f"{value:.{digits}f}"
    return text.replace(".", ",") if lang == "es" else text


def ratio_cell(r: dict, lang: str) -> str:
    return f"{number(r['median'], lang, 2)} ({number(r['min'], lang, 2)}–{number(r['max'], lang, 2)})"


def render_tables(result: dict, lang: str) -> str:
    """Part 1: MiniGPT's four variants, and the bucket-cap sweep."""
    L = LABELS[lang]
    rounds = result["rounds_s"]
    rows = [f"| {L['variant']} | {L['median']} | {L['ratio']} | {L['range']} |", "| --- | ---: | ---: | ---: |"]
    for v in result["medians_s"]:  # in the order they were measured
        # the variants take turns, so a round's ratio compares runs made seconds apart
        ratios = [a / b for a, b in zip(rounds[v], rounds["torch-ddp"])]
        spread = f"{number(min(ratios), lang, 2)}–{number(max(ratios), lang, 2)}"
        rows.append(
            f"| {L[v]} | {number(1000 * result['medians_s'][v], lang)} | "
            f"{number(statistics.median(ratios), lang, 2)} | {spread} |"
        )
    rows += ["", f"| {L['cap']} | {L['buckets']} | {L['median']} |", "| ---: | ---: | ---: |"]
    for s in result["sweep"]:
        rows.append(
            f"| {number(s['bucket_cap_mb'], lang, 2)} | {s['buckets']} | {number(1000 * s['median_s'], lang)} |"
        )
    return "\n".join(rows) + "\n"


def render_shapes(result: dict, lang: str) -> str:
    """Part 2: the hand-rolled DDP over PyTorch's, per model and bucket cap."""
    S = SHAPE_LABELS[lang]
    caps = [c["bucket_cap_mb"] for c in next(iter(result["shapes"].values()))["caps"]]
    rows = [
        f"| {S['shape']} | {S['parameters']} | " + " | ".join(f"{number(c, lang, 2)} MiB" for c in caps) + " |",
        "| --- | ---: | " + " | ".join("---:" for _ in caps) + " |",
    ]
    for name, shape in result["shapes"].items():
        params = f"{shape['parameters']:,}".replace(",", "," if lang == "en" else " ")
        rows.append(
            f"| {S[name]} | {params} ({shape['tensors']}) | "
            + " | ".join(ratio_cell(c["ratio"], lang) for c in shape["caps"])
            + " |"
        )
    return "\n".join(rows) + "\n"


def render_versions(result: dict, lang: str) -> str:
    """Part 3: each version of the hand-rolled DDP over PyTorch's, per model."""
    S, V = SHAPE_LABELS[lang], VERSION_LABELS[lang]
    names = list(result["ablation"])
    rows = [
        f"| {S['version']} | " + " | ".join(S[n] for n in names) + " |",
        "| --- | " + " | ".join("---:" for _ in names) + " |",
    ]
    for version in VERSION_LABELS[lang]:  # the versions in the order they were built up
        rows.append(
            f"| {V[version]} | "
            + " | ".join(ratio_cell(result["ablation"][n][version]["ratio"], lang) for n in names)
            + " |"
        )
    return "\n".join(rows) + "\n"


def render_timeline(result: dict, lang: str, path: Path) -> None:
    from matplotlib.figure import Figure  # a bare figure: no pyplot state, a notebook keeps its backend

    L, t = LABELS[lang], result["timeline"]
    fig = Figure(figsize=(8, 0.6 * len(t["buckets"]) + 2.4))
    ax = fig.subplots()
    for b in t["buckets"]:
        y = b["bucket"]
        ax.barh(
            y + 0.18,
            1000 * (b["last_ready_s"] - b["first_ready_s"]) + 0.05,
            left=1000 * b["first_ready_s"],
            height=0.32,
            color="#5c6bc0",
            label=L["grads"] if y == 0 else None,
        )
        ax.barh(
            y - 0.18,
            1000 * (b["done_s"] - b["launched_s"]),
            left=1000 * b["launched_s"],
            height=0.32,
            color="#ef6c00",
            label=L["reduce"] if y == 0 else None,
        )
    ax.axvline(1000 * t["backward_start_s"], color="grey", linestyle=":", linewidth=1, label=L["bwd_start"])
    ax.axvline(1000 * t["backward_end_s"], color="black", linestyle="--", linewidth=1, label=L["bwd"])
    ax.set_yticks([b["bucket"] for b in t["buckets"]])
    ax.invert_yaxis()
    ax.set_xlabel(L["xlabel"])
    ax.set_ylabel(L["ylabel"])
    ax.set_title(L["title"].format(n=result["world_size"]))
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2, fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def render(json_path: str | Path) -> list[Path]:
    """``X.json`` -> ``X-en.txt``, ``X-es.txt`` (part 1), ``X-shapes-*.txt``, ``X-versions-*.txt``
    (Markdown tables the page includes) and ``X-timeline-en.png``, ``-es.png``."""
    json_path = Path(json_path)
    result = json.loads(json_path.read_text())
    written = []
    for lang in LANGS:
        pieces = {
            "": render_tables(result, lang) if "rounds_s" in result else None,
            "-shapes": render_shapes(result, lang) if "shapes" in result else None,
            "-versions": render_versions(result, lang) if "ablation" in result else None,
        }
        for suffix, text in pieces.items():
            if text is not None:
                path = json_path.with_name(f"{json_path.stem}{suffix}-{lang}.txt")
                path.write_text(text)
                written.append(path)
        if "timeline" in result:
            figure = json_path.with_name(f"{json_path.stem}-timeline-{lang}.png")
            render_timeline(result, lang, figure)
            written.append(figure)
    return written
