"""The tables of Lab 02's cross-check (model against measurement), for the console and, in English
and Spanish, for the lab page (``lab/results/02-crosscheck-cpu-{en,es}.txt``, included by the page).

    python lab/02_crosscheck.py --render lab/results/02-crosscheck-cpu.json
"""

from __future__ import annotations

from pathlib import Path

from minigpt.pages.lang import num, sci, tr, write_tables

NAMES = {
    "ddp": ("Lab 01 DDP (ring)", "DDP del laboratorio 01 (anillo)"),
    "zero1": ("ZeRO-1 optimizer", "optimizador ZeRO-1"),
    "fsdp2": ("FSDP2 (fully_shard)", "FSDP2 (fully_shard)"),
}


def _signed_pct(x: float, lang: str) -> str:
    text = num(100 * x, lang, 3)
    return ("+" if x >= 0 else "") + text + ("%" if lang == "en" else " %")


def predicted_states(r: dict) -> float:
    return r["prediction"]["model_states"]


def rows(report: dict, lang: str) -> list[list[str]]:
    out = []
    for name, r in report["variants"].items():
        en, es = NAMES[name]
        out.append(
            [
                tr(lang, en, es),
                str(r["stage"]),
                num(r["bytes_sent_per_step"], lang),
                num(r["prediction"]["bytes"], lang),
                _signed_pct(r["bytes_relative_difference"], lang),
                num(r["model_states_after_step"]["total"], lang),
                num(predicted_states(r), lang),
                _signed_pct(r["model_states_relative_difference"], lang),
                num(r["peak_bytes_during_step"] / 1e6, lang, 2) + " MB",
                sci(r["step_drift"]["max"], lang),
            ]
        )
    return out


def headers(lang: str) -> list[str]:
    return [
        tr(lang, "run", "ejecución"),
        tr(lang, "ZeRO stage", "etapa ZeRO"),
        tr(lang, "bytes sent per rank per step", "bytes enviados por rank y paso"),
        tr(lang, "model", "modelo"),
        tr(lang, "difference", "diferencia"),
        tr(lang, "model states after the step (bytes)", "estados del modelo tras el paso (bytes)"),
        tr(lang, "model", "modelo"),
        tr(lang, "difference", "diferencia"),
        tr(lang, "peak during the step, all tensors", "pico durante el paso, todos los tensores"),
        tr(lang, "max step drift", "deriva máx. por paso"),
    ]


def markdown(report: dict, lang: str) -> str:
    head = headers(lang)
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join(["---"] + ["---:"] * (len(head) - 1)) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows(report, lang)]
    return "\n".join(lines) + "\n"


def console_table(report: dict) -> str:
    head = headers("en")
    body = rows(report, "en")
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    fmt = lambda row: "  ".join(x.ljust(w) if i == 0 else x.rjust(w) for i, (x, w) in enumerate(zip(row, widths)))  # noqa: E731
    verdict = {True: "PASS", False: "FAIL", None: "not checked"}[report.get("criterion_pass")]
    return "\n".join(
        [
            f"[rank 0] Ψ = {report['params']:,} parameters, world size {report['world_size']} "
            f"({report['backend']}, {report['device']}), {report['steps']} steps per run; "
            f"check against one process and PyTorch's ZeRO-1: {verdict}",
            fmt(head),
            "  ".join("-" * w for w in widths),
            *map(fmt, body),
        ]
    )


def fragment(report: dict, lang: str) -> str:
    """The model-against-measurement table, then the check's rulers (:mod:`minigpt.pages.rulers`)."""
    from minigpt.pages import rulers

    return markdown(report, lang) + ("\n" + rulers.table(report, lang) if report.get("rulers") else "")


def render_files(json_path: str) -> list[Path]:
    """The tables of a report of ``lab/02_crosscheck.py``: the check's, or those of ``--sizes``
    (:mod:`minigpt.pages.lab02_sharding`)."""
    import json

    if "sizes" in json.loads(Path(json_path).read_text(encoding="utf-8")):
        from minigpt.pages import lab02_sharding

        return write_tables(json_path, lab02_sharding.fragment)
    return write_tables(json_path, fragment)
