"""Predict, then run: numbers a learner works out before running a lab, graded against what the code measures.

Each question (:data:`QUESTIONS`) names one number a lab's mechanism decides: the bytes a ring sends, the
buckets a cap makes, ZeRO's traffic, FSDP's all-gathers and peak memory, tensor and context parallelism's
bytes, a pipeline's bubble, a mesh's groups. The learner writes an answer in ``lab/exercises/predictions.py``
(or in the lab's notebook), before running anything; :mod:`minigpt.runners.predictions` runs the course's
own code on this machine and counts the same thing. :func:`judge` compares the two (exactly, or within the
question's tolerance where the number is a fraction), and the explanation is shown once an answer has been
given and graded, right or wrong: it is the lesson of the question.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Question:
    lab: str
    title: dict[str, str]  # en, es
    ask: dict[str, str]  # the question, with every fact it needs
    why: dict[str, str]  # the explanation, shown after grading
    tolerance: float = 0.0  # absolute; 0: exactly (integers, lists of ranks)


# ----------------------------------------------------------------------------------------------
# The questions


def _q(lab, title_en, title_es, ask_en, ask_es, why_en, why_es, tolerance=0.0) -> Question:
    return Question(
        lab, {"en": title_en, "es": title_es}, {"en": ask_en, "es": ask_es}, {"en": why_en, "es": why_es}, tolerance
    )


QUESTIONS: dict[str, Question] = {
    "P1.1": _q(
        "01",
        "the ring's bytes on 4 ranks",
        "los bytes del anillo con 4 ranks",
        "Your ring all-reduce (Exercise 1.1) runs on 4 ranks over one float32 buffer of MiniGPT's 507,552 "
        "gradients (2,030,208 bytes). How many bytes does rank 0 send, in all?",
        "Tu all-reduce en anillo (ejercicio 1.1) corre con 4 ranks sobre un búfer float32 con los 507 552 "
        "gradientes de MiniGPT (2 030 208 bytes). ¿Cuántos bytes envía el rank 0 en total?",
        "A ring all-reduce is a reduce-scatter then an all-gather, each N-1 steps of one chunk of S/N: each rank "
        "sends 2 (N-1)/N x S = 1.5 x 2,030,208 bytes on 4 ranks. It approaches 2 S as N grows, whatever the "
        "number of ranks: why the ring scales.",
        "Un all-reduce en anillo es un reduce-scatter y luego un all-gather, cada uno N-1 pasos de un trozo de "
        "S/N: cada rank envía 2 (N-1)/N x S = 1,5 x 2 030 208 bytes con 4 ranks. Tiende a 2 S al crecer N, sea "
        "cual sea el número de ranks: por eso el anillo escala.",
    ),
    "P1.2": _q(
        "01",
        "buckets at a cap of 0.25 MiB",
        "buckets con un tope de 0,25 MiB",
        "BucketedDDP groups MiniGPT's parameters (Lab 00 lists their shapes) into buckets, last parameter "
        "first, closing a bucket once it reaches the cap. With bucket_cap_mb = 0.25, how many buckets?",
        "BucketedDDP agrupa los parámetros de MiniGPT (el laboratorio 00 da sus formas) en buckets, empezando "
        "por el último, y cierra un bucket en cuanto alcanza el tope. Con bucket_cap_mb = 0,25, ¿cuántos buckets?",
        "The cap is 262,144 bytes and a bucket closes with the tensor that crosses it, so each holds a little "
        "more, about 297 KB here: six such buckets, then a seventh, partial one with the first block's layer norm "
        "and the two embeddings. 2,030,208 / 262,144 is 7.7, but buckets overshoot the cap: 7, not 8. At 0.5 MiB "
        "there are 4: fewer, larger messages, each paying a message's fixed cost once.",
        "El tope es de 262 144 bytes y un bucket se cierra con el tensor que lo cruza, así que cada uno guarda un "
        "poco más, unos 297 KB aquí: seis buckets así, y luego un séptimo, incompleto, con la normalización del "
        "primer bloque y los dos embeddings. 2 030 208 / 262 144 es 7,7, pero los buckets pasan del tope: 7, no "
        "8. Con 0,5 MiB hay 4: menos mensajes y más grandes, cada uno con el coste fijo de un mensaje una vez.",
    ),
    "P2.1": _q(
        "02",
        "ZeRO-2's bytes against DDP's",
        "los bytes de ZeRO-2 frente a los de DDP",
        "Lab 02's simulator trains its MLP (widths 16, 32, 32, 8: three units of W and b, 1,864 float32 "
        "numbers) on 8 workers. With ZeRO-2 (stage 2), how many bytes does worker 0 send in one step?",
        "El simulador del laboratorio 02 entrena su MLP (anchos 16, 32, 32, 8: tres unidades de W y b, 1864 "
        "números float32) con 8 procesos. Con ZeRO-2 (etapa 2), ¿cuántos bytes envía el proceso 0 en un paso?",
        "ZeRO-2 reduce-scatters each gradient and all-gathers the updated weights: two halves of a ring "
        "all-reduce, 2 x 7/8 x 1,864 x 4 bytes, exactly what DDP sends. Sharding the gradients and the "
        "optimizer state costs no communication at all.",
        "ZeRO-2 hace reduce-scatter de cada gradiente y all-gather de los pesos actualizados: las dos mitades de "
        "un all-reduce en anillo, 2 x 7/8 x 1864 x 4 bytes, exactamente lo que envía DDP. Fragmentar los "
        "gradientes y el estado del optimizador no cuesta comunicación alguna.",
    ),
    "P2.2": _q(
        "02",
        "ZeRO-3's bytes",
        "los bytes de ZeRO-3",
        "The same MLP on the same 8 workers with ZeRO-3 (stage 3: the weights sharded too). How many bytes "
        "does worker 0 send in one step?",
        "El mismo MLP con los mismos 8 procesos y ZeRO-3 (etapa 3: también los pesos fragmentados). ¿Cuántos "
        "bytes envía el proceso 0 en un paso?",
        "ZeRO-3 gathers every unit twice (before its forward and again before its backward) and reduce-scatters "
        "its gradient once: three halves of an all-reduce, 1.5 times DDP's traffic, the price of holding an "
        "eighth of the weights.",
        "ZeRO-3 reúne cada unidad dos veces (antes de su pasada hacia delante y otra vez antes de la pasada hacia "
        "atrás) y hace reduce-scatter de su gradiente una vez: tres mitades de un all-reduce, 1,5 veces el "
        "tráfico de DDP, el precio de guardar la octava parte de los pesos.",
    ),
    "P3.1": _q(
        "03",
        "FSDP2's all-gathers per step",
        "los all-gather de FSDP2 por paso",
        "FSDP2 wraps each of MiniGPT's 4 blocks, then the whole model (the root), with reshard_after_forward "
        "left at its default. How many all-gathers does one training step issue?",
        "FSDP2 envuelve cada uno de los 4 bloques de MiniGPT y luego el modelo entero (la raíz), con "
        "reshard_after_forward en su valor por defecto. ¿Cuántos all-gather lanza un paso de entrenamiento?",
        "Five in forward (the root, then each block), and four more in backward: each block was freed after its "
        "forward and is gathered again. The root keeps its parameters after forward, since backward starts with "
        "it.",
        "Cinco en la pasada hacia delante (la raíz y cada bloque) y cuatro más en la pasada hacia atrás: cada "
        "bloque se liberó tras su pasada hacia delante y se reúne de nuevo. La raíz conserva sus parámetros, "
        "porque la pasada hacia atrás empieza por ella.",
    ),
    "P3.2": _q(
        "03",
        "without resharding",
        "sin volver a fragmentar",
        "The same model with reshard_after_forward=False on every unit. How many all-gathers per step?",
        "El mismo modelo con reshard_after_forward=False en cada unidad. ¿Cuántos all-gather por paso?",
        "Five: each unit is gathered once, before its forward, and stays whole until its backward is done. "
        "Four all-gathers fewer, at the price of holding every block whole from its forward to its backward: "
        "ZeRO-2's memory with ZeRO-3's layout.",
        "Cinco: cada unidad se reúne una vez, antes de su pasada hacia delante, y sigue entera hasta el final de "
        "su pasada hacia atrás. Cuatro all-gather menos, al precio de tener cada bloque entero desde su pasada "
        "hacia delante hasta la de atrás: la memoria de ZeRO-2 con la organización de ZeRO-3.",
    ),
    "P4.1": _q(
        "04",
        "our FSDP's bytes per step",
        "los bytes de nuestro FSDP por paso",
        "Our FSDP on 4 ranks, each block a unit, then the root: each parameter cut along its rows, padded to a "
        "multiple of 4 rows (Lab 00 lists the shapes). How many bytes does one rank send in one step (all-gathers in forward and backward, "
        "reduce-scatters), in float32?",
        "Nuestro FSDP con 4 ranks, cada bloque una unidad y luego la raíz: cada parámetro cortado por filas, con "
        "relleno hasta un múltiplo de 4 filas (el laboratorio 00 da las formas). ¿Cuántos bytes envía un rank en un paso (all-gather en las dos "
        "pasadas, reduce-scatter), en float32?",
        "On 4 ranks each collective sends 3/4 of its buffer. The root is gathered once, each block twice, and "
        "every unit reduce-scattered once: (root + 2 x blocks + all) x 4 bytes x 3/4, with the padded sizes (the "
        "embedding's 609 rows become 612; every other row count is already a multiple of 4).",
        "Con 4 ranks cada colectiva envía 3/4 de su búfer. La raíz se reúne una vez, cada bloque dos, y cada "
        "unidad hace un reduce-scatter: (raíz + 2 x bloques + todo) x 4 bytes x 3/4, con los tamaños con relleno "
        "(las 609 filas del embedding pasan a 612; las demás ya son múltiplo de 4).",
    ),
    "P4.2": _q(
        "04",
        "the peak without resharding",
        "el pico sin volver a fragmentar",
        "The same FSDP on 4 ranks, with backward's prefetch (Exercise 4.3), but the blocks keep their gathered "
        "parameters after forward (reshard_after_forward=False). At the step's peak, how much more memory of "
        "parameters and gradients does one rank hold than with resharding? Count in blocks: one block's "
        "parameters gathered (111,456 float32 numbers, 445,824 bytes) count 1.",
        "El mismo FSDP con 4 ranks, con la precarga de la pasada hacia atrás (ejercicio 4.3), pero los bloques "
        "conservan sus parámetros reunidos tras la pasada hacia delante (reshard_after_forward=False). En el pico "
        "del paso, ¿cuánta memoria más de parámetros y gradientes tiene un rank que al volver a fragmentar? "
        "Cuenta en bloques: los parámetros reunidos de un bloque (111 456 números float32, 445 824 bytes) "
        "cuentan 1.",
        "1.5 blocks (1 on 2 ranks). Without resharding the peak is the last block's backward: four blocks "
        "whole and its full gradient, 5. With resharding the peak moves to block 1's backward: block 1 and its "
        "full gradient, block 0 already prefetched, 3, plus the gradient shards left by blocks 3 and 2, 2 x 1/4. "
        "5 - (3 + 2 x 1/4) = 1.5: not three blocks saved, because the prefetch and the shards also take room.",
        "1,5 bloques (1 con 2 ranks). Sin volver a fragmentar, el pico es la pasada hacia atrás del último "
        "bloque: cuatro bloques enteros y su gradiente completo, 5. Volviendo a fragmentar, el pico pasa a la "
        "pasada hacia atrás del bloque 1: el bloque 1 y su gradiente completo, el bloque 0 ya precargado, 3, más "
        "los fragmentos de gradiente que dejaron los bloques 3 y 2, 2 x 1/4. 5 - (3 + 2 x 1/4) = 1,5: no se "
        "ahorran tres bloques, porque la precarga y los fragmentos también ocupan sitio.",
        tolerance=0.01,
    ),
    "P5.1": _q(
        "05",
        "tensor parallelism's bytes",
        "los bytes del paralelismo de tensores",
        "MiniGPT with tensor parallelism on 2 ranks (no sequence parallelism), one step on its batch of 64 "
        "rows of 32 tokens, hidden size 96, 4 blocks, float32: how many bytes does one rank send?",
        "MiniGPT con paralelismo de tensores en 2 ranks (sin paralelismo de secuencia), un paso con su lote de "
        "64 filas de 32 tokens, dimensión oculta 96, 4 bloques, float32: ¿cuántos bytes envía un rank?",
        "Each block all-reduces its activations twice in forward (after attention and after the MLP) and twice "
        "in backward; the embedding and the output layer add one each, and the vocabulary-parallel loss three "
        "small ones of b s numbers. Every all-reduce of b s h numbers costs 2 (t-1)/t of it per rank: activations, "
        "not weights, so the bytes grow with the batch.",
        "Cada bloque hace all-reduce de sus activaciones dos veces en la pasada hacia delante (tras la atención y "
        "tras el MLP) y dos en la de atrás; el embedding y la capa de salida añaden uno cada uno, y la pérdida "
        "paralela en vocabulario tres pequeños de b s números. Cada all-reduce de b s h números cuesta 2 (t-1)/t "
        "por rank: activaciones, no pesos, así que los bytes crecen con el lote.",
    ),
    "P5.2": _q(
        "05",
        "ring attention's bytes",
        "los bytes de la atención en anillo",
        "MiniGPT with context parallelism on 2 ranks (ring attention, load-balanced), one step on its batch "
        "(64 rows of 32 tokens, 4 heads of 24, 4 blocks, float32): how many bytes does one rank send?",
        "MiniGPT con paralelismo de contexto en 2 ranks (atención en anillo, equilibrada), un paso con su lote "
        "(64 filas de 32 tokens, 4 cabezas de 24, 4 bloques, float32): ¿cuántos bytes envía un rank?",
        "Each attention passes its keys and values round the ring in forward, and again with their gradients in "
        "backward: per layer and direction, (cp-1)/cp of K and V. The weights never travel here (only the "
        "once-a-step gradient all-reduce, not counted): context parallelism moves activations, like tensor "
        "parallelism, but only attention's.",
        "Cada atención pasa sus claves y valores por el anillo en la pasada hacia delante, y otra vez con sus "
        "gradientes en la de atrás: por capa y sentido, (cp-1)/cp de K y V. Los pesos no viajan (solo el "
        "all-reduce de gradientes de una vez por paso, no contado): el paralelismo de contexto mueve "
        "activaciones, como el de tensores, pero solo las de la atención.",
    ),
    "P6.1": _q(
        "06",
        "1F1B's bubble",
        "la burbuja de 1F1B",
        "A 1F1B pipeline of p = 4 stages and m = 8 micro-batches, every forward and backward taking one unit of "
        "time each. What fraction of the stages' time is idle (the bubble), between 0 and 1?",
        "Una tubería 1F1B de p = 4 etapas y m = 8 microlotes, con cada pasada hacia delante y hacia atrás de una "
        "unidad de tiempo. ¿Qué fracción del tiempo de las etapas está inactiva (la burbuja), entre 0 y 1?",
        "(p-1)/(m+p-1) = 3/11: the first stage waits for nothing but the last waits p-1 slots before its first "
        "micro-batch arrives, and the same again at the end. 1F1B does not shrink the bubble (GPipe's is the "
        "same); it shrinks what each stage holds.",
        "(p-1)/(m+p-1) = 3/11: la última etapa espera p-1 huecos antes de que llegue su primer microlote, y "
        "otro tanto al final. 1F1B no reduce la burbuja (la de GPipe es la misma); reduce lo que guarda cada "
        "etapa.",
        tolerance=0.005,
    ),
    "P6.2": _q(
        "06",
        "what stage 0 holds",
        "lo que guarda la etapa 0",
        "In the same 1F1B pipeline (p = 4, m = 8), at most how many micro-batches does stage 0 hold at once "
        "(forward done, backward not yet)?",
        "En la misma tubería 1F1B (p = 4, m = 8), ¿cuántos microlotes guarda a la vez, como máximo, la etapa 0 "
        "(pasada hacia delante hecha, la de atrás aún no)?",
        "p - s = 4 for stage s = 0: it runs p forwards before its first backward arrives, then one forward per "
        "backward. GPipe would hold all m = 8: 1F1B's point is memory, not time.",
        "p - s = 4 para la etapa s = 0: hace p pasadas hacia delante antes de que llegue su primera pasada hacia "
        "atrás, y luego una hacia delante por cada una hacia atrás. GPipe guardaría los m = 8: lo que aporta "
        "1F1B es memoria, no tiempo.",
    ),
    "P7.1": _q(
        "07",
        "rank 5's tensor-parallel group",
        "el grupo de paralelismo de tensores del rank 5",
        "Lab 07's mesh of 8 ranks, dp_replicate 2 x dp_shard 2 x cp 1 x tp 2, in that order (outermost first). "
        "Which ranks form rank 5's tp group? (a list of ranks, in order)",
        "La malla de 8 ranks del laboratorio 07, dp_replicate 2 x dp_shard 2 x cp 1 x tp 2, en ese orden (la "
        "más externa primero). ¿Qué ranks forman el grupo tp del rank 5? (una lista de ranks, en orden)",
        "The innermost dimension varies fastest: tp groups are consecutive ranks, (4, 5) for rank 5, so that "
        "the dimension that talks in every layer stays on one node's fast links.",
        "La dimensión más interna varía más deprisa: los grupos tp son ranks consecutivos, (4, 5) para el rank "
        "5, para que la dimensión que se comunica en cada capa se quede en los enlaces rápidos de un nodo.",
    ),
    "P7.2": _q(
        "07",
        "rank 5's shard group",
        "el grupo de fragmentación del rank 5",
        "In the same mesh, which ranks does FSDP shard rank 5's parameters over (its dp_shard group)?",
        "En la misma malla, ¿sobre qué ranks fragmenta FSDP los parámetros del rank 5 (su grupo dp_shard)?",
        "The ranks whose other coordinates are rank 5's (replica 1, tp 1): dp_shard is the second dimension, "
        "so its step is tp x cp = 2 ranks: (5, 7).",
        "Los ranks cuyas otras coordenadas son las del rank 5 (réplica 1, tp 1): dp_shard es la segunda "
        "dimensión, así que su paso es tp x cp = 2 ranks: (5, 7).",
    ),
}


def judge(question: str, answer, measured) -> bool:
    """Is ``answer`` the measured value (exactly, or within the question's tolerance)?"""
    q = QUESTIONS[question]
    if isinstance(measured, list):
        return isinstance(answer, (list, tuple)) and [int(a) for a in answer] == measured
    if isinstance(answer, bool) or not isinstance(answer, (int, float)) or not math.isfinite(answer):
        return False
    return abs(answer - measured) <= q.tolerance


# ----------------------------------------------------------------------------------------------
# The learner's answers: lab/exercises/predictions.py


def name_of(question: str) -> str:
    """The answer's name in the learner's file: "P4.1" -> ``P4_1``."""
    return question.replace(".", "_")


class NotAnswered(NotImplementedError):
    """A prediction with no answer yet (None): graded as a stub, "not written yet"."""


def task(question: str) -> str:
    """The stub's line for an unanswered question (the grader's catalog repeats it word for word)."""
    return f"Prediction {question}: write your answer as {name_of(question)} in exercises/predictions.py"


def stub_text() -> str:
    """``lab/exercises/predictions.py`` as it ships: every question, its answer None."""
    lines = [
        '"""Predict, then run: your answers, before you run the labs.',
        "",
        "Each question below asks for one number (or a list of ranks) that a lab's mechanism decides. Work it",
        "out from the guide and Lab 00's shapes, write it in place of None, then grade it: the grader runs the",
        "course's code, measures the same thing, and shows why once you have answered.",
        "",
        "    make grade EX=P1.1        # one prediction",
        "    make grade LAB=01         # with the lab's exercises",
        "",
        'In a notebook, predict("P1.1", 123) writes the answer here for you.',
        '"""',
        "",
    ]
    for question, q in QUESTIONS.items():
        lines.append(f"# {question} · Lab {q.lab} · {q.title['en']}")
        words, line = q.ask["en"].split(), "#"
        for word in words:
            if len(line) + 1 + len(word) > 110:
                lines.append(line)
                line = "#"
            line += " " + word
        lines += [line, f"{name_of(question)} = None", ""]
    return "\n".join(lines[:-1]) + "\n"


def predict(question: str, value) -> None:
    """For a notebook: write ``value`` as the answer to ``question`` in the learner's predictions file
    (the line ``P1_1 = ...``), which the grader reads."""
    from minigpt import impl

    if question not in QUESTIONS:
        raise ValueError(f"{question!r} is not a prediction; choose one of {', '.join(QUESTIONS)}")
    if value is None:  # the notebook's cell as it ships: no answer yet, nothing to write
        return
    if isinstance(value, bool) or not isinstance(value, (int, float, list, tuple)):
        raise ValueError(f"{question}: {value!r} is not a number or a list of ranks")
    path = impl.exercises_dir() / "predictions.py"
    lines = path.read_text(encoding="utf-8").splitlines()
    name = name_of(question)
    written = repr(list(value) if isinstance(value, tuple) else value)
    found = [i for i, line in enumerate(lines) if line.split("=")[0].strip() == name]
    if found:
        lines[found[0]] = f"{name} = {written}"
    else:
        lines.append(f"{name} = {written}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
