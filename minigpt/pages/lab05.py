"""The tables of Lab 05 (tensor, sequence and context parallelism against one process), in English
and Spanish, for the lab page: ``lab/results/05-*-{en,es}.txt``, one section per table
(``--8<-- "lab/results/05-tensor-parallel-cpu-en.txt:proofs"``).

    python lab/05_tensor_parallel.py --render lab/results/05-tensor-parallel-cpu.json
    python lab/05_ring_attention.py --render lab/results/05-ring-attention-cpu.json
"""

from __future__ import annotations

from pathlib import Path

from minigpt.pages import rulers
from minigpt.pages.lang import num, pct, sci, table, tr, write_tables


def _drift(summary: dict, lang: str) -> str:
    return f"{sci(summary['max'], lang)} ({tr(lang, 'step', 'paso')} {summary['worst_step']})"


def proofs(r: dict, lang: str) -> str:
    """The check's rulers (:mod:`minigpt.pages.rulers`)."""
    return rulers.table(r, lang) + _measured(r, lang)


def drift(r: dict, lang: str) -> str:
    """The float32 step drift over the run: ours, PyTorch's own TP on the same run, and the control
    (one process whose fused qkv is three layers), each against its own one-process twin."""
    t = r["training"]
    optimizer = {"adamw": "AdamW", "sgd": "SGD"}[r.get("optimizer", "adamw")]
    rows = [[tr(lang, "ours (TPMiniGPT)", "el nuestro (TPMiniGPT)"), _drift(t["step_drift"], lang)]]
    if "pytorch_step_drift" in t:
        rows.append(
            [
                tr(lang, "PyTorch's `parallelize_module`", "`parallelize_module` de PyTorch"),
                _drift(t["pytorch_step_drift"], lang),
            ]
        )
    if "control_step_drift" in t:
        rows.append(
            [
                tr(lang, "one process, qkv split into three layers", "un proceso, qkv partida en tres capas"),
                _drift(t["control_step_drift"], lang),
            ]
        )
    rows.append(
        [
            tr(lang, "tutor accuracy after the run (ours)", "exactitud del tutor tras la ejecución (el nuestro)"),
            f"{pct(t['tutor_accuracy'], lang)} ({t['tutor_correct']}/{t['tutor_total']})",
        ]
    )
    head = [
        tr(
            lang,
            f"{r['tp']} ranks{', sequence parallel' if r['sequence_parallel'] else ''}: float32 step drift, "
            f"{t['steps']} {optimizer} steps",
            f"{r['tp']} ranks{', paralelismo de secuencia' if r['sequence_parallel'] else ''}: deriva por paso en "
            f"float32, {t['steps']} pasos de {optimizer}",
        ),
        tr(lang, "max (step)", "máx. (paso)"),
    ]
    return table(head, rows, left=1)


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


def ring_training(r: dict, lang: str) -> str:
    """MiniGPT trained context-parallel: the check's rulers."""
    return rulers.table(r, lang)


def fragment(report: dict, lang: str) -> str:
    if "cases" in report:
        sections = {"ring": ring, **({"rulers": ring_training} if "rulers" in report else {})}
    else:
        sections = {"proofs": proofs, "drift": drift, "memory": memory}
    return "".join(
        f"<!-- --8<-- [start:{name}] -->\n{section(report, lang)}<!-- --8<-- [end:{name}] -->\n"
        for name, section in sections.items()
    )


def render(json_path: str | Path) -> list[Path]:
    """``X.json`` -> ``X-en.txt`` and ``X-es.txt``."""
    return write_tables(json_path, fragment)
