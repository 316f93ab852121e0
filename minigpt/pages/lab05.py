"""The tables of Lab 05 (tensor, sequence and context parallelism against one process), in English
and Spanish, for the lab page: ``lab/results/05-*-{en,es}.txt``, one section per table
(``--8<-- "lab/results/05-tensor-parallel-cpu-en.txt:proofs"``).

    python lab/05_tensor_parallel.py --render lab/results/05-tensor-parallel-cpu.json
    python lab/05_ring_attention.py --render lab/results/05-ring-attention-cpu.json
"""

from __future__ import annotations

from pathlib import Path

from minigpt.pages.lang import num, pct, sci, table, tr, write_tables, yes


def _drift(summary: dict, lang: str) -> str:
    return f"{sci(summary['max'], lang)} ({tr(lang, 'step', 'paso')} {summary['worst_step']})"


def proofs(r: dict, lang: str) -> str:
    """What --check held against one process and against the formulas."""
    one, t, n = r["one_step"], r["training"], r["tp"]
    f32, f64 = one["float32"], one["float64"]
    optimizer = {"adamw": "AdamW", "sgd": "SGD"}[r.get("optimizer", "adamw")]
    rows = []
    for mode, en, es in (("tp", "TP", "TP"), ("sp", "TP + SP", "TP + SP")):
        rows.append(
            [
                tr(lang, f"one step, {en}: logits and gradients, fp32", f"un paso, {es}: logits y gradientes, fp32"),
                f"{sci(f32[mode]['max_logit_diff'], lang)} / {sci(f32[mode]['max_grad_diff'], lang)}",
                "≤ 1e-5",
                yes(max(f32[mode]["max_logit_diff"], f32[mode]["max_grad_diff"]) <= 1e-5, lang),
            ]
        )
        rows.append(
            [
                tr(lang, "… the same in float64", "… lo mismo en float64"),
                f"{sci(f64[mode]['max_logit_diff'], lang)} / {sci(f64[mode]['max_grad_diff'], lang)}",
                "≤ 1e-12",
                yes(max(f64[mode]["max_logit_diff"], f64[mode]["max_grad_diff"]) <= 1e-12, lang),
            ]
        )
    rows += [
        [
            tr(lang, "bytes one rank sends per step, TP / TP + SP", "bytes que envía un rank por paso, TP / TP + SP"),
            f"{num(f32['tp']['bytes_sent'], lang)} / {num(f32['sp']['bytes_sent'], lang)}",
            tr(lang, f"formula: {num(r['bytes_model'], lang)}", f"fórmula: {num(r['bytes_model'], lang)}"),
            yes(f32["tp"]["bytes_sent"] == f32["sp"]["bytes_sent"] == r["bytes_model"], lang),
        ],
        [
            tr(lang, "parameter bytes one rank holds", "bytes de parámetros que guarda un rank"),
            num(f32["tp"]["param_bytes"], lang),
            tr(lang, f"count: {num(r['param_bytes_model'], lang)}", f"cuenta: {num(r['param_bytes_model'], lang)}"),
            yes(f32["tp"]["param_bytes"] == r["param_bytes_model"], lang),
        ],
        [
            tr(
                lang,
                f"step drift against one process, fp32, {t['steps']} {optimizer} steps",
                f"deriva por paso frente a un proceso, fp32, {t['steps']} pasos de {optimizer}",
            ),
            _drift(t["step_drift"], lang),
            "≤ 1e-5",
            yes(t["step_drift"]["max"] <= 1e-5, lang),
        ],
        [
            tr(
                lang,
                f"step drift against one process, float64, {r['float64']['steps']} steps",
                f"deriva por paso frente a un proceso, float64, {r['float64']['steps']} pasos",
            ),
            _drift(r["float64"]["step_drift"], lang),
            "≤ 1e-12",
            yes(r["float64"]["step_drift"]["max"] <= 1e-12, lang),
        ],
        [
            tr(
                lang,
                "whole parameters bit-identical on every rank",
                "parámetros enteros idénticos bit a bit en cada rank",
            ),
            yes(t["replicated_bit_identical"], lang),
            tr(lang, "after every step", "tras cada paso"),
            yes(t["replicated_bit_identical"], lang),
        ],
        [
            tr(lang, "tutor accuracy after training", "precisión del tutor tras el entrenamiento"),
            f"{pct(t['tutor_accuracy'], lang)} ({t['tutor_correct']}/{t['tutor_total']})",
            "",
            "",
        ],
    ]
    head = [
        tr(
            lang,
            f"{n} ranks{', sequence parallel' if r['sequence_parallel'] else ''}",
            f"{n} ranks{', paralelismo de secuencia' if r['sequence_parallel'] else ''}",
        ),
        tr(lang, "measured", "medido"),
        tr(lang, "bound", "cota"),
        tr(lang, "holds", "se cumple"),
    ]
    return table(head, rows) + _measured(r, lang)


def _measured(r: dict, lang: str) -> str:
    return tr(
        lang,
        f"\nMeasured {r['date']} with torch {r['torch']} ({r['backend']}, CPU).\n",
        f"\nMedido el {r['date']} con torch {r['torch']} ({r['backend']}, CPU).\n",
    )


def memory(r: dict, lang: str) -> str:
    """Per rank: the parameters and the activations autograd saves for backward (one forward of the
    lab's batch), one process against TP and TP + SP."""
    f32 = r["one_step"]["float32"]
    one = f32["one_process_saved_bytes"]
    rows = [
        [
            tr(lang, "one process", "un proceso"),
            num(f32["one_process_param_bytes"], lang),
            num(one, lang),
            pct(1.0, lang),
        ],
    ]
    for mode, name in (("tp", "TP"), ("sp", "TP + SP")):
        saved = f32[mode]["saved_activation_bytes"]
        rows.append([name, num(f32[mode]["param_bytes"], lang), num(saved, lang), pct(saved / one, lang)])
    head = [
        tr(lang, f"{r['tp']} ranks", f"{r['tp']} ranks"),
        tr(lang, "parameter bytes per rank", "bytes de parámetros por rank"),
        tr(lang, "saved activation bytes per rank", "bytes de activaciones guardadas por rank"),
        tr(lang, "of one process's", "de las de un proceso"),
    ]
    return table(head, rows)


def ring(r: dict, lang: str) -> str:
    """Ring attention against full attention, per length and layout (float32)."""
    rows = []
    for c in r["cases"]:
        if c["dtype"] != "float32":
            continue
        layout = tr(lang, "load-balanced", "equilibrada") if c["load_balanced"] else tr(lang, "contiguous", "contigua")
        rows.append(
            [
                f"{c['seq_len']}, {layout}",
                f"{sci(c['max_out_diff'], lang)} / {sci(c['max_grad_diff'], lang)}",
                f"{num(c['bytes_forward'][0], lang)} / {num(c['bytes_backward'][0], lang)}",
                num(c["bytes_model"], lang),
                " · ".join(num(x, lang) for x in c["scores_needed"]),
                " · ".join(num(x, lang) for x in c["scores_computed"]),
            ]
        )
    f64 = max(max(c["max_out_diff"], c["max_grad_diff"]) for c in r["cases"] if c["dtype"] == "float64")
    head = [
        tr(lang, "T, layout", "T, disposición"),
        tr(lang, "output / gradients vs full attention", "salida / gradientes frente a la atención completa"),
        tr(lang, "bytes sent forward / backward", "bytes enviados hacia delante / hacia atrás"),
        tr(lang, "(cp−1)/cp of K and V", "(cp−1)/cp de K y V"),
        tr(lang, "scores needed, per rank", "puntuaciones necesarias, por rank"),
        tr(lang, "scores computed, per rank", "puntuaciones calculadas, por rank"),
    ]
    note = tr(
        lang,
        f"\n{r['cp']} ranks; B {r['shape']['batch']}, H {r['shape']['heads']}, D {r['shape']['head_dim']}; scores per "
        f"query head and sequence. float64: every difference ≤ {sci(f64, lang)}.\n",
        f"\n{r['cp']} ranks; B {r['shape']['batch']}, H {r['shape']['heads']}, D {r['shape']['head_dim']}; puntuaciones "
        f"por cabeza y secuencia. float64: toda diferencia ≤ {sci(f64, lang)}.\n",
    )
    return table(head, rows) + note + _measured(r, lang)


def fragment(report: dict, lang: str) -> str:
    sections = {"ring": ring} if "cases" in report else {"proofs": proofs, "memory": memory}
    return "".join(
        f"<!-- --8<-- [start:{name}] -->\n{section(report, lang)}<!-- --8<-- [end:{name}] -->\n"
        for name, section in sections.items()
    )


def render(json_path: str | Path) -> list[Path]:
    """``X.json`` -> ``X-en.txt`` and ``X-es.txt``."""
    return write_tables(json_path, fragment)
