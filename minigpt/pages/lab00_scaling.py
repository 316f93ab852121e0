"""The table of Lab 00's batch-scaling run, in English and Spanish (``lab/results/00-batch-scaling-*``),
shown on theory page 02 beside the scaling rules.

    python lab/00_batch_scaling.py --render lab/results/00-batch-scaling-cpu.json
"""

from __future__ import annotations

from minigpt.pages.lang import num, pct, sci, tr

RULES = {
    "default": ("the default", "el valor por defecto"),
    "kept": ("kept", "el mismo"),
    "sqrt": ("square root: × 2", "raíz cuadrada: × 2"),
    "linear": ("linear: × 4", "lineal: × 4"),
}


def table(report: dict, lang: str) -> str:
    rows = [
        tr(
            lang,
            "| batch | steps | learning rate | peak lr | final training loss | validation loss | exact corrections (300 sentences) |",
            "| lote | pasos | tasa de aprendizaje | lr máxima | pérdida final de entrenamiento | pérdida de validación "
            "| correcciones exactas (300 frases) |",
        ),
        "| ---: | ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for r in report["runs"]:
        en, es = RULES[r["rule"]]
        rows.append(
            f"| {r['batch']} | {r['steps']} | {tr(lang, en, es)} | {sci(r['lr'], lang, 2)} | "
            f"{num(r['final_train_loss'], lang, 3)} | {num(r['val_loss'], lang, 3)} | {pct(r['accuracy'], lang, 1)} |"
        )
    return "\n".join(rows) + "\n"
