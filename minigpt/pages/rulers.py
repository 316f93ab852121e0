"""A check's rulers as a table, in English and Spanish: every lab page shows its own.

The runner writes the rulers into its report (:meth:`minigpt.parallel.proof.Verdict.keys`: each
one's key, measured value, criterion and verdict); this module gives each key its words in both
languages (``{name}`` fields are filled from the report: the steps a ruler covered), and writes the
measured value and the criterion the way each language writes numbers.
"""

from __future__ import annotations

from minigpt.pages.lang import num, sci, tr

# key -> (English, Spanish): what the ruler holds
WORDS: dict[str, tuple[str, str]] = {
    "fp64_max_step_drift": (
        "float64: step drift against one process, every step of {fp64_steps}",
        "float64: deriva por paso frente a un proceso, en cada uno de {fp64_steps} pasos",
    ),
    "fp32_first_step_logit_diff": (
        "float32, first step: logits against one process",
        "float32, primer paso: logits frente a un proceso",
    ),
    "fp32_first_step_grad_diff": (
        "float32, first step: every gradient against one process",
        "float32, primer paso: cada gradiente frente a un proceso",
    ),
    "fp32_max_step_drift": (
        "float32: step drift over the run, every step of {fp32_steps}",
        "float32: deriva por paso a lo largo de la ejecución, en cada uno de {fp32_steps} pasos",
    ),
    "fp32_max_step_drift_vs_pytorch": (
        "float32 step drift, no further from one process than PyTorch's own on the same run",
        "deriva por paso en float32, no más lejos de un proceso que la de PyTorch en la misma ejecución",
    ),
    "dp_tp_fp32_max_step_drift": (
        "DP x TP: float32 step drift, no further than PyTorch's own DP x TP",
        "DP x TP: deriva por paso en float32, no más lejos que el DP x TP de PyTorch",
    ),
    "fp64_first_step_grad_diff": (
        "float64, first step: every gradient against one process",
        "float64, primer paso: cada gradiente frente a un proceso",
    ),
    "max_micro_batch_drift": (
        "step drift against one process accumulating the same micro-batches",
        "deriva por paso frente a un proceso que acumula los mismos microlotes",
    ),
    "bit_identical_to_micro_batches": (
        "bit-identical to one process accumulating the same micro-batches (2 ranks)",
        "idéntico bit a bit a un proceso que acumula los mismos microlotes (2 ranks)",
    ),
    "same_as_pytorch": (
        "the same as PyTorch's own implementation",
        "lo mismo que la implementación de PyTorch",
    ),
    "pytorch_max_diff": (
        "largest difference from PyTorch's own implementation",
        "mayor diferencia con la implementación de PyTorch",
    ),
    "pytorch_first_step_logit_diff": (
        "first step: our logits against PyTorch's own",
        "primer paso: nuestros logits frente a los de PyTorch",
    ),
    "pytorch_impl": ("PyTorch's own implementation", "la implementación de PyTorch"),
    "control_fp32_max_step_drift": (
        "the control: one process with q, k, v as three layers, its step drift",
        "el control: un proceso con q, k, v en tres capas, su deriva por paso",
    ),
    "bytes_all_reduced_per_step": (
        "bytes all-reduced per step = 4 B x parameters",
        "bytes reducidos por paso = 4 B x parámetros",
    ),
    "bytes_per_rank_per_step": (
        "bytes each rank sends per step = the model",
        "bytes que envía cada rank por paso = el modelo",
    ),
    "bytes_fsdp2": ("bytes FSDP2 sends per step = the model", "bytes que envía FSDP2 por paso = el modelo"),
    "bytes_per_stage_per_step": (
        "bytes each stage sends per step = the model",
        "bytes que envía cada etapa por paso = el modelo",
    ),
    "bytes_sent_per_step": (
        "ring attention's bytes per step = the model",
        "bytes de la atención en anillo por paso = el modelo",
    ),
    "bytes_per_dim": (
        "HSDP: bytes per mesh dimension = the model",
        "HSDP: bytes por dimensión de la malla = el modelo",
    ),
    "dp_tp.bytes_per_dim": (
        "DP x TP: bytes per mesh dimension = the model",
        "DP x TP: bytes por dimensión de la malla = el modelo",
    ),
    "bytes_constant_over_steps": ("the same bytes every step", "los mismos bytes en cada paso"),
    "one_step.tp.bytes_sent": ("TP, one step: bytes = the formula", "TP, un paso: bytes = la fórmula"),
    "one_step.sp.bytes_sent": ("SP, one step: bytes = the formula", "SP, un paso: bytes = la fórmula"),
    "one_step.tp.bytes_sent_fp64": (
        "TP, one float64 step: twice the bytes",
        "TP, un paso en float64: el doble de bytes",
    ),
    "one_step.sp.bytes_sent_fp64": (
        "SP, one float64 step: twice the bytes",
        "SP, un paso en float64: el doble de bytes",
    ),
    "one_step.gpipe.bytes_sent": (
        "GPipe, one step: bytes per stage = the model",
        "GPipe, un paso: bytes por etapa = el modelo",
    ),
    "one_step.1f1b.bytes_sent": (
        "1F1B, one step: bytes per stage = the model",
        "1F1B, un paso: bytes por etapa = el modelo",
    ),
    "param_bytes": ("parameter bytes per rank = the count", "bytes de parámetros por rank = la cuenta"),
    "peak_activations": (
        "micro-batches held at most: GPipe m, 1F1B p - s",
        "microlotes retenidos como máximo: GPipe m, 1F1B p - s",
    ),
    "event_order_matches_fsdp2": (
        "the order of gathers, computations and reduces = FSDP2's",
        "el orden de reuniones, cálculos y reducciones = el de FSDP2",
    ),
    "memory_matches_model": (
        "peak of parameters and gradients held = the model",
        "pico de parámetros y gradientes retenidos = el modelo",
    ),
    "memory_per_rank": ("HSDP: model states per rank = the model", "HSDP: estados del modelo por rank = el modelo"),
    "checkpoint_reloads_exactly": (
        "a checkpoint saved on 2 ranks loads on 1 and on all",
        "un checkpoint guardado en 2 ranks se carga en 1 y en todos",
    ),
    "ranks_bit_identical": (
        "ranks that must agree are bit-identical",
        "los ranks que deben coincidir son idénticos bit a bit",
    ),
    "replicated_bit_identical": (
        "the whole parameters bit-identical on every rank",
        "los parámetros enteros idénticos bit a bit en cada rank",
    ),
    "tied_copies_bit_identical": (
        "the tied matrix's two copies bit-identical",
        "las dos copias de la matriz atada idénticas bit a bit",
    ),
    "every_rank_agrees": (
        "every rank's own bytes and memory against its own model",
        "los bytes y la memoria de cada rank frente a su modelo",
    ),
    "attention_float32_out_diff": (
        "attention output against one process, float32",
        "salida de la atención frente a un proceso, float32",
    ),
    "attention_float32_grad_diff": (
        "attention gradients against one process, float32",
        "gradientes de la atención frente a un proceso, float32",
    ),
    "attention_float64_out_diff": (
        "attention output against one process, float64",
        "salida de la atención frente a un proceso, float64",
    ),
    "attention_float64_grad_diff": (
        "attention gradients against one process, float64",
        "gradientes de la atención frente a un proceso, float64",
    ),
    "attention_bytes_match_model": (
        "ring attention's bytes = (cp-1)/cp of K and V",
        "bytes de la atención en anillo = (cp-1)/cp de K y V",
    ),
    "load_balanced_equal_work": (
        "load-balanced: every rank the same work",
        "equilibrada: el mismo trabajo en cada rank",
    ),
    "lengths_refused": (
        "lengths the split cannot cut are refused",
        "se rechazan las longitudes que el reparto no puede cortar",
    ),
}
for _variant in ("ddp", "zero1", "fsdp2"):
    WORDS[f"{_variant}.bytes_constant_over_steps"] = (
        f"{_variant}: the same bytes every step",
        f"{_variant}: los mismos bytes en cada paso",
    )

# Lab 07's rulers, one set per layout of the mesh: the key is "<layout>.<ruler>" ("2 x 2 x 1 x 2.bytes_per_dim")
LAYOUT_WORDS: dict[str, tuple[str, str]] = {
    "fp32_max_step_drift": (
        "float32 step drift within 1e-5, or at most 2 x PyTorch's composition's",
        "deriva por paso en float32 dentro de 1e-5, o como mucho 2 x la de la composición de PyTorch",
    ),
    "pytorch_first_step_logit_diff": (
        "first step: the whole batch's logits against PyTorch's composition",
        "primer paso: los logits del lote entero frente a la composición de PyTorch",
    ),
    "bytes_per_dim": ("rank 0's bytes per mesh dimension = the model", "bytes del rank 0 por dimensión = el modelo"),
    "bytes_every_rank_equal_model": (
        "every rank's bytes per mesh dimension = the model",
        "bytes de cada rank por dimensión = el modelo",
    ),
    "bytes_constant_over_steps": ("the same bytes every step", "los mismos bytes en cada paso"),
    "memory_per_rank": (
        "model states per rank after a step = the model, every rank",
        "estados del modelo por rank tras un paso = el modelo, en cada rank",
    ),
    "ranks_bit_identical": (
        "ranks of the same tp coordinate bit-identical, TP-whole tensors on every rank",
        "ranks de la misma coordenada tp idénticos bit a bit, tensores enteros en TP en cada rank",
    ),
    "memory_per_stage": (
        "model states per rank after a step = its stage's model, every rank",
        "estados del modelo por rank tras un paso = el modelo de su etapa, en cada rank",
    ),
    "stages_bit_identical": (
        "ranks of the same stage and tp coordinate bit-identical, both copies of the tied matrix too",
        "ranks de la misma etapa y coordenada tp idénticos bit a bit, también las dos copias de la matriz atada",
    ),
    "whole_from_pieces": (
        "every sharded parameter joined from every rank's pieces (Exercise 7.3) = the gathered state",
        "cada parámetro fragmentado unido a partir de los trozos de cada rank (ejercicio 7.3) = el estado reunido",
    ),
}


def words(key: str) -> tuple[str, str]:
    """A ruler's words: its own, or, for Lab 07's ``"<layout>.<ruler>"``, the layout's name and the ruler's."""
    if key in WORDS:
        return WORDS[key]
    layout, _, ruler = key.partition(".")
    en, es = LAYOUT_WORDS[ruler]
    return f"{layout}: {en}", f"{layout}: {es}"


HEADER = {
    "en": "| ruler | what it holds | measured | criterion | verdict |",
    "es": "| regla | qué comprueba | medido | criterio | veredicto |",
}
VERDICT = {True: ("PASS", "PASS"), False: ("FAIL", "FAIL"), None: ("reported", "informado")}


# the words a runner reports as a value (``verdict.reported(key, "none on CPU", ...)``), in each language
REPORTED_WORDS = {"none on CPU": {"en": "none on CPU", "es": "ninguna en CPU"}}


def value(v, lang: str) -> str:
    """A measured value the way ``lang`` writes it."""
    if isinstance(v, bool):
        return tr(lang, "true", "verdadero") if v else tr(lang, "false", "falso")
    if isinstance(v, int):
        return num(v, lang)
    if isinstance(v, float):
        return "0" if v == 0 else sci(v, lang)
    if v is None:
        return tr(lang, "none", "ninguna")
    if isinstance(v, str):
        return REPORTED_WORDS.get(v, {}).get(lang, v)
    return str(v)


def criterion(text: str, lang: str) -> str:
    """The runner's criterion (``<= 1e-09``, ``= 2,922,240``, ``must be true``, ``reported, ...``)."""
    if text.startswith("<= "):
        return "≤ " + value(float(text[3:]), lang)
    if text.startswith("= "):
        body = text[2:]
        try:
            return "= " + value(int(body.replace(",", "")), lang)
        except ValueError:
            return "= " + body
    if text == "must be true":
        return tr(lang, "true", "verdadero")
    return tr(lang, "reported, not a criterion", "informado, no es criterio")


def table(report: dict, lang: str) -> str:
    """The Markdown table of ``report``'s rulers."""
    fields = {k: v for k, v in report.items() if isinstance(v, (int, float, str))}
    lines = [HEADER[lang], "| --- | --- | ---: | --- | --- |"]
    for r in report["rulers"]:
        en, es = words(r["key"])
        wanted = criterion(r["criterion"], lang)
        if r["criterion"].startswith("= ") and r["pass"] is True and isinstance(r["value"], int):
            wanted = "= " + value(r["value"], lang)  # an equality that held: every digit of what it equals
        lines.append(
            f"| `{r['key']}` | {tr(lang, en, es).format(**fields)} | {value(r['value'], lang)} | "
            f"{wanted} | {tr(lang, *VERDICT[r['pass']])} |"
        )
    return "\n".join(lines) + "\n"
