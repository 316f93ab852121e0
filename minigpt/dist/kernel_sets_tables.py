"""The table of Lab 01's check under each kernel set, in English and Spanish, for the lab page
(``lab/results/01-kernel-sets-<config>-cpu-{en,es}.txt``, included by the page).

    python lab/01_kernel_sets.py --render lab/results/01-kernel-sets-adamw-cpu.json
"""

from __future__ import annotations

from pathlib import Path

from minigpt.lang import pct, sci, tr, write_tables

HEADER = {
    "en": ["kernel set (ATen, MKL, oneDNN)", "check", "step drift, whole batch: max (step)",
           "the same, probe in float32: max (step)", "step drift, same micro-batches", "trajectory > 1e-5 from step",
           "tutor accuracy"],
    "es": ["conjunto de kernels (ATen, MKL, oneDNN)", "comprobación", "deriva por paso, lote entero: máx. (paso)",
           "lo mismo, sonda en float32: máx. (paso)", "deriva por paso, mismos microlotes",
           "trayectoria > 1e-5 desde el paso", "exactitud del tutor"],
}
SETS = {"avx512": "avx512, AVX512, AVX512_CORE", "avx2": "avx2, AVX2, AVX2", "baseline": "default, SSE4_2, SSE41"}


def table(result: dict, lang: str) -> str:
    header = HEADER[lang]
    lines = ["| " + " | ".join(header) + " |", "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in result["rows"]:
        verdict = ("PASS" if r["passed"] else "FAIL")
        micro = sci(r["max_micro_batch_drift"], lang)
        if r["bit_identical_to_micro_batches"]:
            micro = tr(lang, "0 (bit-identical)", "0 (idénticos bit a bit)")
        lines.append("| " + " | ".join([
            SETS[r["kernel_set"]], verdict,
            f"{sci(r['max_step_drift'], lang)} ({r['worst_step']})",
            f"{sci(r['max_step_drift_float32_probe'], lang)} ({r['worst_step_float32_probe']})",
            micro, str(r["trajectory_first_step_above_tolerance"]), pct(r["tutor_accuracy"], lang),
        ]) + " |")
    return "\n".join(lines) + "\n"


def render(json_path: str | Path) -> list[Path]:
    """``X.json`` -> ``X-en.txt`` and ``X-es.txt`` (Markdown tables the lab page includes)."""
    return write_tables(json_path, table)
