"""The tables of Lab 01's link measurements, in English and Spanish (``lab/results/01-links-*``):
the fitted link and Lab 01's buckets, the hierarchical ring's bytes, and the same formulas on paper
for the links of real clusters.

    python lab/01_links.py --render lab/results/01-links-cpu.json
"""

from __future__ import annotations

import json
from pathlib import Path

from minigpt.pages.lang import LANGS, num, size, tr
from minigpt.parallel import links

# Nominal figures, not measurements: a one-way latency and a per-direction bandwidth of each kind of link.
PAPER_LINKS = (
    (("10 Gb/s Ethernet (TCP)", "Ethernet de 10 Gb/s (TCP)"), 30e-6, 1.25e9),
    (("InfiniBand HDR, 200 Gb/s", "InfiniBand HDR, 200 Gb/s"), 3e-6, 25e9),
    (("PCIe 4.0 x16", "PCIe 4.0 x16"), 5e-6, 25e9),
    (("NVLink 4 (H100), per GPU", "NVLink 4 (H100), por GPU"), 3e-6, 450e9),
)
# (names, gradient bytes, ranks): MiniGPT's fp32 gradient on Lab 01's two ranks; a 1B-parameter model in bf16 on 8
PAPER_MODELS = (
    (("MiniGPT, fp32", "MiniGPT, fp32"), 2_030_208, 2),
    (("10⁹ parameters, bf16", "10⁹ parámetros, bf16"), 2 * 10**9, 8),
)


def _ms(seconds: float, lang: str) -> str:
    return num(seconds * 1e3, lang, 3)


def link_table(result: dict, lang: str) -> str:
    """Both fits (every size measured and predicted, one way and both ways at once), then Lab 01's buckets
    against the ring's time predicted from each fit."""
    one, both = result["link"], result["link_both_ways"]
    rows = [
        tr(
            lang,
            "| message | one way, measured (ms) | one way, α + n/β (ms) | both ways at once, measured (ms) | both ways, α + n/β (ms) |",
            "| mensaje | un sentido, medido (ms) | un sentido, α + n/β (ms) | ambos sentidos a la vez, medido (ms) | ambos sentidos, α + n/β (ms) |",
        ),
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    for k, n in enumerate(one["sizes"]):
        cells = [size(n, lang, 1)]
        for fit in (one, both):
            cells += [_ms(fit["seconds"][k], lang), _ms(links.message_seconds(n, fit["alpha"], fit["beta"]), lang)]
        rows.append("| " + " | ".join(cells) + " |")
    rows += [
        "",
        tr(lang, "| link | α | β |", "| enlace | α | β |"),
        "| --- | ---: | ---: |",
    ]
    for fit, name in (
        (one, tr(lang, "one way", "un sentido")),
        (both, tr(lang, "both ways at once", "ambos sentidos a la vez")),
    ):
        rows.append(f"| {name} | {num(fit['alpha'] * 1e6, lang, 1)} µs | {num(fit['beta'] / 1e9, lang, 2)} GB/s |")
    rows += [
        "",
        tr(
            lang,
            "| Lab 01 bucket | bytes | ring all-reduce, 2 ranks, measured (ms) | its reduce-scatter (ms) | its all-gather (ms) "
            "| predicted, one-way fit (ms) | predicted, both-ways fit (ms) | measured / both-ways prediction |",
            "| bucket del laboratorio 01 | bytes | all-reduce en anillo, 2 ranks, medido (ms) | su reduce-scatter (ms) "
            "| su all-gather (ms) | predicho, ajuste de un sentido (ms) | predicho, ajuste de ambos sentidos (ms) "
            "| medido / predicción de ambos sentidos |",
        ),
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for k, b in enumerate(result["buckets"]):
        one_way, both_ways = b["predicted"]["link"], b["predicted"]["link_both_ways"]
        cells = [str(k), num(b["bytes"], lang), _ms(b["measured"], lang)]
        cells += [_ms(b["halves"][half], lang) for half in ("reduce_scatter", "all_gather")]
        cells += [_ms(one_way, lang), _ms(both_ways, lang), num(b["measured"] / both_ways, lang, 2)]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def nodes_table(result: dict, lang: str) -> str:
    """Flat against hierarchical on the simulated nodes: exactness, bytes across nodes, steps across."""
    nodes = result["nodes"]
    world, node_size, m = result["world_size"], nodes["node_size"], nodes["nodes"]
    model = nodes["model"]
    yes = tr(lang, "yes", "sí")
    no = "no"
    flat_exact = all(r["flat_exact"] for r in nodes["ranks"])
    hier_exact = all(r["hierarchical_exact"] for r in nodes["ranks"])
    rows = [
        tr(
            lang,
            f"| {world} ranks, {m} nodes of {node_size} | flat ring | hierarchical |",
            f"| {world} ranks, {m} nodos de {node_size} | anillo plano | jerárquico |",
        ),
        "| --- | ---: | ---: |",
        tr(lang, "| the exact sum on every rank |", "| la suma exacta en cada rank |")
        + f" {yes if flat_exact else no} | {yes if hier_exact else no} |",
        tr(lang, "| bytes across nodes, measured |", "| bytes entre nodos, medidos |")
        + f" {num(nodes['flat_crossing'], lang)} | {num(nodes['hierarchical_crossing'], lang)} |",
        tr(lang, "| bytes across nodes, model |", "| bytes entre nodos, modelo |")
        + f" {num(model['flat_total'], lang)} | {num(model['hierarchical_total'], lang)} |",
        tr(lang, "| sent across by one rank, model |", "| enviados entre nodos por un rank, modelo |")
        + f" {num(model['flat_link'], lang)} | {num(model['hierarchical_link'], lang)} |",
        tr(
            lang,
            "| ring steps that wait for a link between nodes |",
            "| pasos del anillo que esperan un enlace entre nodos |",
        )
        + f" {2 * (world - 1)} | {2 * (m - 1)} |",
    ]
    return "\n".join(rows) + "\n"


def paper_table(lang: str) -> str:
    """The α–β formula on nominal links (not measured here): one ring all-reduce of each model's gradient."""
    head = tr(lang, "| link | α | β |", "| enlace | α | β |")
    rows = [
        head + "".join(f" {names[LANGS.index(lang)]}, {n} ranks |" for names, _, n in PAPER_MODELS),
        "| --- | ---: | ---: |" + " ---: |" * len(PAPER_MODELS),
    ]
    for names, alpha, beta in PAPER_LINKS:
        cells = [names[LANGS.index(lang)], f"{num(alpha * 1e6, lang)} µs", f"{num(beta / 1e9, lang, 2)} GB/s"]
        for _, nbytes, world in PAPER_MODELS:
            cells.append(f"{num(links.ring_all_reduce_seconds(nbytes, world, alpha, beta) * 1e3, lang, 2)} ms")
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def render(json_path: str | Path) -> list[Path]:
    """Write ``01-links-{link,nodes,paper}-{en,es}.txt`` beside the JSON; return the paths."""
    path = Path(json_path)
    result = json.loads(path.read_text())
    written = []
    for lang in LANGS:
        for part, text in (
            ("link", link_table(result, lang)),
            ("nodes", nodes_table(result, lang)),
            ("paper", paper_table(lang)),
        ):
            target = path.parent / f"01-links-{part}-{lang}.txt"
            target.write_text(text)
            written.append(target)
    return written
