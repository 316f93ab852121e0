"""The tables of Lab 01's equivalence check, in English and Spanish, for the lab page (§7).

* the check under each kernel set (``lab/results/01-kernel-sets-<config>-cpu-{en,es}.txt``):
  :func:`render`, from the JSON of ``python lab/01_kernel_sets.py``;

      python lab/01_kernel_sets.py --render lab/results/01-kernel-sets-adamw-cpu.json

* how one optimizer step amplifies a rounding difference (``01-amplification-{en,es}.txt``) and
  which weights make a step's drift (``01-drift-sources-adamw-{en,es}.txt``):
  :func:`amplification_tables` and :func:`sources_tables`, from ``python lab/01_drift.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

from minigpt import cli
from minigpt.pages.lang import num, pct, sci, tr, write_tables

HEADER = {
    "en": [
        "kernel set (ATen, MKL, oneDNN)",
        "check",
        "step drift, whole batch: max (step)",
        "the same, probe in float32: max (step)",
        "step drift, same micro-batches",
        "trajectory > 1e-5 from step",
        "tutor accuracy",
    ],
    "es": [
        "conjunto de kernels (ATen, MKL, oneDNN)",
        "comprobación",
        "deriva por paso, lote entero: máx. (paso)",
        "lo mismo, sonda en float32: máx. (paso)",
        "deriva por paso, mismos microlotes",
        "trayectoria > 1e-5 desde el paso",
        "exactitud del tutor",
    ],
}
SETS = {"avx512": "avx512, AVX512, AVX512_CORE", "avx2": "avx2, AVX2, AVX2", "baseline": "default, SSE4_2, SSE41"}


def table(result: dict, lang: str) -> str:
    header = HEADER[lang]
    lines = ["| " + " | ".join(header) + " |", "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in result["rows"]:
        verdict = "PASS" if r["passed"] else "FAIL"
        micro = sci(r["max_micro_batch_drift"], lang)
        if r["bit_identical_to_micro_batches"]:
            micro = tr(lang, "0 (bit-identical)", "0 (idénticos bit a bit)")
        lines.append(
            "| "
            + " | ".join(
                [
                    SETS[r["kernel_set"]],
                    verdict,
                    f"{sci(r['max_step_drift'], lang)} ({r['worst_step']})",
                    f"{sci(r['max_step_drift_float32_probe'], lang)} ({r['worst_step_float32_probe']})",
                    micro,
                    str(r["trajectory_first_step_above_tolerance"]),
                    pct(r["tutor_accuracy"], lang),
                ]
            )
            + " |"
        )
    return "\n".join(lines) + "\n"


def render(json_path: str | Path) -> list[Path]:
    """``X.json`` -> ``X-en.txt`` and ``X-es.txt`` (Markdown tables the lab page includes)."""
    return write_tables(json_path, table)


def render_check(json_path: str | Path) -> list[Path]:
    """A run's report (``lab/01_ddp.py --report X.json``) -> a check's rulers' table (``X-en.txt`` and
    ``X-es.txt``, :mod:`minigpt.pages.rulers`), or, for a run with ``--trace``, what its profiler's
    trace shows (:mod:`minigpt.pages.lab01_trace`: ``X-en.txt``, ``X-en.png`` and their Spanish twins)."""
    from minigpt.pages import lab01_trace, rulers

    report = json.loads(Path(json_path).read_text())
    if report.get("rulers"):
        return write_tables(json_path, rulers.table)
    if report.get("trace"):
        return lab01_trace.render(json_path, report)
    raise cli.BadInput(
        f"--render {json_path}: a report of a run without --check or --trace has nothing to render; "
        "give e.g. lab/results/01-check-adamw-cpu.json"
    )


AMPLIFICATION_HEADER = {
    "en": "| optimizer | dtype | at step | max gradient difference | max weight difference | ratio |",
    "es": "| optimizador | tipo | en el paso | diferencia máxima de gradiente | diferencia máxima de pesos | cociente |",
}


def amplification_tables(rows: list[dict]) -> dict[str, str]:
    """The :func:`~minigpt.parallel.equivalence.one_step_amplification` rows as a Markdown table per
    language (Spanish uses a decimal comma)."""
    tables = {}
    for lang, header in AMPLIFICATION_HEADER.items():
        lines = [header, "| --- | --- | ---: | ---: | ---: | ---: |"]
        for r in rows:
            cells = [f"{r[k]:.1e}" for k in ("grad_diff", "weight_diff", "amplification")]
            if lang == "es":
                cells = [c.replace(".", ",") for c in cells]
            lines.append(f"| {r['optimizer']} | {r['dtype']} | {r['at_step']} | " + " | ".join(cells) + " |")
        tables[lang] = "\n".join(lines) + "\n"
    return tables


SOURCES_HEADER = {
    "en": "| step | drift | tensor | drift if only it differs | numbers differing | largest difference (ulp) | the weight there |",
    "es": "| paso | deriva | tensor | deriva si solo él difiere | números distintos | mayor diferencia (ulp) | el peso ahí |",
}


def sources_tables(found: list[dict]) -> dict[str, str]:
    """The :func:`~minigpt.parallel.equivalence.drift_sources` measurements as a Markdown table per language."""
    tables = {}
    for lang, header in SOURCES_HEADER.items():
        lines = [header, "| ---: | ---: | --- | ---: | ---: | ---: | ---: |"]
        for entry in found:
            for k, r in enumerate(entry["params"]):
                cells = [
                    str(entry["step"]) if k == 0 else "",
                    sci(entry["drift"], lang) if k == 0 else "",
                    f"`{r['param']}`",
                    sci(r["drift_alone"], lang),
                    f"{num(r['numbers_differing'], lang)} / {num(r['numbers'], lang)}",
                    num(r["ulps_there"], lang),
                    num(r["weight_there"], lang, 4),
                ]
                lines.append("| " + " | ".join(cells) + " |")
        tables[lang] = "\n".join(lines) + "\n"
    return tables
