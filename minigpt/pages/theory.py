"""The tables of the theory pages, generated from the code, in English and Spanish.

Every number a theory page shows in a table is computed here from :mod:`minigpt.zero.analytic`
(and, for MiniGPT, from the real model and trainer). Each function takes a language and returns a
Markdown table with headers in that language and numbers written its way ("1,024.5" / "1024,5",
"27.3%" / "27,3 %"). :data:`minigpt.pages.site.TABLES` registers them and ``python -m
minigpt.pages`` writes them to ``build/tables/<name>-<lang>.md``; the theory pages' figures are
drawn by :mod:`minigpt.pages.figures`.
"""

from __future__ import annotations

from functools import lru_cache

from minigpt.pages.lang import localize, num, pct, sci, size, tr
from minigpt.zero import analytic as za

TFLOP = 10**12

# The example models of the pages.
PSI_7B = 7 * 10**9  # "a 7B model" (page 00): 7 x 10^9 parameters
PSI_ZERO_PAPER = za.ZERO_PAPER_PSI  # the ZeRO paper's Table 1 model
SHAPE_7B = {"n_layer": 32, "n_embd": 4096, "n_head": 32}  # GPT-3 6.7B's and LLaMA-7B's shape
SEQ_7B = 4096  # tokens per sequence in the 7B examples
TOKENS_7B = 10**12  # a 7B model trained on 10^12 tokens
SUSTAINED_FLOPS = 400 * TFLOP  # an assumed sustained rate of one modern accelerator
LOGITS_EXAMPLE = {"batch": 8, "seq_len": SEQ_7B, "vocab": 128_256}  # page 00: Llama 3's vocabulary, fp32
MIN_BATCH_WORLD = 1024  # page 02: the devices of the minimum-batch example (128 hosts of 8)
MIN_BATCH_TP = 8  # page 02: its tensor-parallel degree (one node)
MIN_BATCH_PP = 4  # page 02: its pipeline stages


@lru_cache(maxsize=1)
def minigpt_params() -> int:
    """MiniGPT's real parameter count, from the model itself (imports torch)."""
    from minigpt.model import GPTConfig, MiniGPT

    return MiniGPT(GPTConfig()).num_params()


@lru_cache(maxsize=1)
def minigpt_vocab() -> int:
    """MiniGPT's vocabulary size V, from the model's config (imports torch)."""
    from minigpt.model import GPTConfig

    return GPTConfig().vocab_size


@lru_cache(maxsize=1)
def minigpt_train_defaults() -> dict:
    """The reference trainer's defaults that the pages quote (imports torch)."""
    from minigpt.train import TrainConfig

    cfg = TrainConfig()
    return {
        "batch_size": cfg.batch_size,
        "lr": cfg.lr,
        "dtype": cfg.dtype,
        "n_layer": cfg.n_layer,
        "n_embd": cfg.n_embd,
        "n_head": cfg.n_head,
        "block_size": cfg.block_size,
        "steps": cfg.steps,
        "grad_clip": cfg.grad_clip,
    }


def markdown_table(headers: list[str], rows: list[list[str]], align: str | None = None) -> str:
    """A Markdown table; ``align`` is one letter per column, l or r (default: first l, rest r)."""
    align = align or "l" + "r" * (len(headers) - 1)
    rule = ["---:" if a == "r" else "---" for a in align]
    lines = [headers, rule] + rows
    return "\n".join("| " + " | ".join(cells) + " |" for cells in lines) + "\n"


# --- page 00: motivation ----------------------------------------------------------------------


def memory_per_parameter(lang: str) -> str:
    """Bytes per parameter by component: mixed-precision Adam (a 7B model) against the fp32
    AdamW MiniGPT's trainer runs."""
    psi_mini = minigpt_params()
    rows_spec = [  # (en, es, mixed-precision bytes, fp32 bytes)
        ("weights", "pesos", 2, 4),
        ("gradients", "gradientes", 2, 4),
        ("fp32 master copy of the weights", "copia maestra de los pesos en fp32", 4, 0),
        ("Adam first moment $m$", "primer momento de Adam $m$", 4, 4),
        ("Adam second moment $v$", "segundo momento de Adam $v$", 4, 4),
    ]
    assert sum(r[2] for r in rows_spec) == za.bytes_per_param()  # 2 + 2 + K, K = 12
    assert sum(r[3] for r in rows_spec) == za.bytes_per_param(4, 4, 8)
    headers = [
        tr(lang, "component", "componente"),
        tr(lang, "mixed precision: bytes/param", "precisión mixta: bytes/parámetro"),
        tr(lang, "7B model", "modelo de 7B"),
        tr(lang, "fp32 (MiniGPT's trainer): bytes/param", "fp32 (el entrenador de MiniGPT): bytes/parámetro"),
        tr(lang, "MiniGPT", "MiniGPT"),
    ]
    dash = "—"
    rows = [
        [
            tr(lang, en, es),
            str(mixed),
            size(mixed * PSI_7B, lang, 0, "GB"),
            str(fp32) if fp32 else dash,
            size(fp32 * psi_mini, lang, 2, "MB") if fp32 else dash,
        ]
        for en, es, mixed, fp32 in rows_spec
    ]
    total_mixed, total_fp32 = za.bytes_per_param(), za.bytes_per_param(4, 4, 8)
    rows.append(
        [
            tr(lang, "**total**", "**total**"),
            f"**{total_mixed}**",
            f"**{size(za.model_state_bytes(PSI_7B).total, lang, 0, 'GB')}**",
            f"**{total_fp32}**",
            f"**{size(total_fp32 * psi_mini, lang, 2, 'MB')}**",
        ]
    )
    return markdown_table(headers, rows)


def activations_vs_sequence(lang: str) -> str:
    """Activation memory of a 7B-shaped model (L = 32, h = 4096, a = 32), one sequence, no
    recomputation, by sequence length (Korthikanti et al., 2022)."""
    headers = [
        tr(lang, "sequence length $s$", "longitud de secuencia $s$"),
        tr(lang, "per layer", "por capa"),
        tr(lang, "32 layers", "32 capas"),
        tr(lang, "share of the $5as/h$ term", "parte del término $5as/h$"),
    ]
    rows = []
    for s in (1024, 2048, 4096, 8192, 16384):
        per_layer = za.activation_bytes_per_layer(s, 1, SHAPE_7B["n_embd"], SHAPE_7B["n_head"])
        quadratic = 5 * SHAPE_7B["n_head"] * s / SHAPE_7B["n_embd"]
        rows.append(
            [
                num(s, lang),
                size(per_layer, lang, 2, "GB"),
                size(per_layer * SHAPE_7B["n_layer"], lang, 1, "GB"),
                pct(quadratic / (34 + quadratic), lang, 0),
            ]
        )
    return markdown_table(headers, rows)


def training_time(lang: str) -> str:
    """Days to train a 7B model on 10^12 tokens (6 Ψ D FLOPs) at 400 TFLOP/s per device."""
    flops = za.training_flops(PSI_7B, TOKENS_7B)
    headers = [tr(lang, "devices", "dispositivos"), tr(lang, "days", "días"), tr(lang, "hours", "horas")]
    rows = []
    for devices in (1, 8, 64, 512, 1024, 4096):
        days = za.training_days(flops, devices, SUSTAINED_FLOPS)
        rows.append([num(devices, lang), num(days, lang, 1), num(24 * days, lang, 0)])
    return markdown_table(headers, rows)


# --- page 01: data parallel, ZeRO and FSDP ----------------------------------------------------


def ring_allreduce(lang: str) -> str:
    """Bytes each worker sends to all-reduce MiniGPT's fp32 gradients, ring against one root."""
    grad_bytes = 4 * minigpt_params()
    headers = [
        tr(lang, "workers $N$", "procesos $N$"),
        "$2(N-1)/N$",
        tr(lang, "ring: sent per worker", "anillo: enviado por proceso"),
        tr(lang, "ring: steps", "anillo: pasos"),
        tr(lang, "one root: received by the root", "una raíz: recibido por la raíz"),
    ]
    rows = [
        [
            num(n, lang),
            num(za.ring_factor(n), lang, 3),
            size(za.ring_bytes_per_worker(grad_bytes, n), lang, 2, "MB"),
            num(za.ring_steps(n), lang),
            size(za.naive_root_bytes(grad_bytes, n), lang, 2, "MB"),
        ]
        for n in (2, 4, 8, 16, 64, 1024)
    ]
    return markdown_table(headers, rows)


ZERO_LABELS = {0: "DDP", 1: "ZeRO-1 ($P_{os}$)", 2: "ZeRO-2 ($P_{os+g}$)", 3: "ZeRO-3 ($P_{os+g+p}$)"}


@lru_cache(maxsize=1)
def _uneven_slices() -> tuple:
    from minigpt.parallel.ddp import uneven_slices

    return tuple(uneven_slices())


def uneven_batches(lang: str) -> str:
    """MiniGPT's batch split unevenly over ranks: the gradient error of DDP's plain average and of the
    average of scaled losses (``minigpt.parallel.ddp.uneven_slices``); below 10^-6 is rounding."""

    def cell(x: float) -> str:
        return "< 10⁻⁶" if x < 1e-6 else pct(x, lang, 1)

    headers = [
        tr(lang, "sentences per rank", "frases por rank"),
        tr(lang, "plain average of the gradients", "media simple de los gradientes"),
        tr(lang, "each loss scaled by N·B_r/B", "cada pérdida escalada por N·B_r/B"),
    ]
    rows = [[" + ".join(str(b) for b in r["split"]), cell(r["plain"]), cell(r["scaled"])] for r in _uneven_slices()]
    return markdown_table(headers, rows)


def zero_memory(lang: str) -> str:
    """The ZeRO paper's Table 1: GB per device for Ψ = 7.5B, K = 12, rounded as the paper does."""
    headers = [tr(lang, "devices $N$", "dispositivos $N$")] + [ZERO_LABELS[s] for s in za.STAGES]
    rows = [
        [num(n, lang)]
        + [
            localize(za.paper_round(za.model_state_bytes(PSI_ZERO_PAPER, n, s).total / za.GB), lang) + " GB"
            for s in za.STAGES
        ]
        for n in (1, 4, 16, 64, 256, 1024)
    ]
    return markdown_table(headers, rows)


def zero_stages(lang: str) -> str:
    """What each stage shards, its memory formula and its communication per step."""
    sharded = {
        0: ("nothing", "nada"),
        1: ("optimizer state", "estado del optimizador"),
        2: ("optimizer state, gradients", "estado del optimizador, gradientes"),
        3: ("optimizer state, gradients, parameters", "estado del optimizador, gradientes, parámetros"),
    }
    formula = {
        0: "$(2+2+K)\\Psi$",
        1: "$2\\Psi + 2\\Psi + K\\Psi/N$",
        2: "$2\\Psi + (2+K)\\Psi/N$",
        3: "$(2+2+K)\\Psi/N$",
    }
    headers = [
        tr(lang, "stage", "etapa"),
        tr(lang, "sharded", "fragmentado"),
        tr(lang, "memory per device", "memoria por dispositivo"),
        tr(lang, "bytes/param at $N = 64$", "bytes/parámetro con $N = 64$"),
        tr(lang, "sent per device per step", "enviado por dispositivo y paso"),
        tr(lang, "collectives", "colectivas"),
    ]
    rows = []
    for s in za.STAGES:
        per_param = za.model_state_bytes(1, 64, s).total
        volume = za.comm_volume(1, s)
        rows.append(
            [
                ZERO_LABELS[s],
                tr(lang, *sharded[s]),
                formula[s],
                num(per_param, lang, 2),
                f"${num(volume, lang)}\\Psi$",
                " + ".join(za.STEP_COLLECTIVES[s]),
            ]
        )
    return markdown_table(headers, rows, align="lllrrl")


# --- page 02: parallelism flavours ------------------------------------------------------------


TP_WORLD = 8  # the 7B example's tensor-parallel degree
GPU_FLOPS = 400e12  # on paper: one GPU's sustained bf16 throughput (about 40% of an H100's dense peak)


def tp_links(lang: str) -> str:
    """The 7B example's tensor-parallel all-reduces (t = 8, one sequence of 4,096 tokens in bf16), timed
    on nominal links with the alpha-beta model, against one layer's computation on the same GPUs."""
    from minigpt.pages.lab01_links import PAPER_LINKS
    from minigpt.parallel.links import ring_all_reduce_seconds

    h, layers = SHAPE_7B["n_embd"], SHAPE_7B["n_layer"]
    activation = SEQ_7B * h * 2  # the b s h activations all-reduced, bf16
    compute = 6 * 12 * h * h * SEQ_7B / TP_WORLD / GPU_FLOPS  # 12 h^2 weights per layer, 6 flops each per token
    headers = [
        tr(lang, "link", "enlace"),
        tr(lang, "4 all-reduces of one layer", "4 all-reduce de una capa"),
        tr(lang, f"{layers} layers", f"{layers} capas"),
        tr(lang, "against the layer's computation", "frente al cálculo de la capa"),
    ]
    rows = []
    for names, alpha, beta in PAPER_LINKS:
        layer = 4 * ring_all_reduce_seconds(activation, TP_WORLD, alpha, beta)
        rows.append(
            [
                names[0] if lang == "en" else names[1],
                f"{num(layer * 1e3, lang, 2)} ms",
                f"{num(layer * layers * 1e3, lang, 0)} ms",
                f"{num(layer / compute, lang, 2)} ×",
            ]
        )
    return markdown_table(headers, rows)


def pipeline_bubble(lang: str) -> str:
    """Bubble fraction (p - 1)/(m + p - 1) by micro-batches m and stages p."""
    stage_counts = (2, 4, 8, 16)
    headers = [tr(lang, "micro-batches $m$", "microlotes $m$")] + [f"$p = {p}$" for p in stage_counts]
    rows = [
        [num(m, lang)] + [pct(za.bubble_fraction(p, m), lang) for p in stage_counts] for m in (1, 2, 4, 8, 16, 32, 64)
    ]
    return markdown_table(headers, rows)


HSDP_CASES = [  # (world size, devices per node, shard degree, replicas)
    (16, 8, None, None),
    (16, 8, 4, None),
    (16, 8, None, 4),
    (16, 8, 8, 2),
    (32, 8, 16, None),
    (16, 8, 8, 3),
    (16, 8, 6, None),
    (12, 8, None, None),
]


def hsdp_layouts(lang: str) -> str:
    """What :func:`minigpt.zero.analytic.hsdp_degrees` decides for given or missing degrees."""
    headers = [
        tr(lang, "world size", "tamaño del mundo"),
        tr(lang, "devices per node", "dispositivos por nodo"),
        tr(lang, "shard degree given", "grado de fragmentación dado"),
        tr(lang, "replicas given", "réplicas dadas"),
        tr(lang, "result", "resultado"),
    ]
    rows = []
    for world, per_node, shard, replicas in HSDP_CASES:
        given = [
            num(world, lang),
            num(per_node, lang),
            "—" if shard is None else num(shard, lang),
            "—" if replicas is None else num(replicas, lang),
        ]
        try:
            s, r = za.hsdp_degrees(world, per_node, shard, replicas)
            result = tr(lang, f"{s} shards × {r} replicas", f"{s} fragmentos × {r} réplicas")
            if s > per_node:
                result += tr(lang, " (a shard group spans nodes)", " (un grupo de fragmentación cruza nodos)")
        except ValueError:
            if shard is not None and replicas is not None:
                why = f"{shard} × {replicas} ≠ {world}"
            elif shard is not None or replicas is not None:
                why = tr(
                    lang, f"{shard or replicas} does not divide {world}", f"{shard or replicas} no divide a {world}"
                )
            else:
                why = tr(
                    lang,
                    f"{world} is not a whole number of nodes of {per_node}",
                    f"{world} no es un número entero de nodos de {per_node}",
                )
            result = f"`ValueError`: {why}"
        rows.append(given + [result])
    return markdown_table(headers, rows, align="rrrrl")


def hsdp_groups(lang: str) -> str:
    """The groups of 2 nodes x 4 devices: all-gathers and reduce-scatters inside a shard group,
    an all-reduce of gradient shards across each replica group."""
    shard, replicas = za.hsdp_degrees(8, 4)
    shard_groups, replica_groups = za.hsdp_groups(shard, replicas)
    headers = [tr(lang, "group", "grupo"), tr(lang, "ranks", "ranks"), tr(lang, "collectives", "colectivas")]
    rows = [
        [
            tr(lang, f"shard group {i} (node {i})", f"grupo de fragmentación {i} (nodo {i})"),
            ", ".join(map(str, g)),
            "all-gather, reduce-scatter",
        ]
        for i, g in enumerate(shard_groups)
    ]
    rows += [
        [tr(lang, f"replica group {j}", f"grupo de réplicas {j}"), ", ".join(map(str, g)), "all-reduce"]
        for j, g in enumerate(replica_groups)
    ]
    return markdown_table(headers, rows, align="lll")


def activation_recompute(lang: str) -> str:
    """Activation memory of the 7B shape (s = 4096, one sequence) with and without recomputation."""
    h, a, layers = SHAPE_7B["n_embd"], SHAPE_7B["n_head"], SHAPE_7B["n_layer"]
    names = {
        "none": ("keep everything", "guardarlo todo"),
        "selective": ("selective (recompute attention scores)", "selectivo (recalcular las puntuaciones de atención)"),
        "full": ("full (keep each layer's input)", "completo (guardar la entrada de cada capa)"),
    }
    headers = [
        tr(lang, "recomputation", "recálculo"),
        tr(lang, "per layer", "por capa"),
        tr(lang, "32 layers", "32 capas"),
    ]
    rows = []
    for mode in za.RECOMPUTE:
        per_layer = za.activation_bytes_per_layer(SEQ_7B, 1, h, a, recompute=mode)
        rows.append([tr(lang, *names[mode]), size(per_layer, lang, 3, "GB"), size(per_layer * layers, lang, 1, "GB")])
    return markdown_table(headers, rows, align="lrr")


BATCH_CASES = [(64, 1, 1), (32, 2, 1), (64, 1, 2), (32, 1, 2), (64, 2, 4)]  # micro, accum, ranks


def batch_lr_scaling(lang: str) -> str:
    """Effective batch size and the scaled learning rate from MiniGPT's defaults."""
    base = minigpt_train_defaults()
    headers = [
        tr(lang, "micro-batch", "microlote"),
        tr(lang, "accumulation", "acumulación"),
        tr(lang, "data-parallel ranks", "ranks de paralelismo de datos"),
        tr(lang, "effective batch", "lote efectivo"),
        tr(lang, "linear rule", "regla lineal"),
        tr(lang, "square-root rule", "regla de la raíz"),
    ]
    rows = []
    for micro, accum, ranks in BATCH_CASES:
        batch = za.effective_batch_size(micro, accum, ranks)
        rows.append(
            [num(micro, lang), num(accum, lang), num(ranks, lang), num(batch, lang)]
            + [sci(za.scaled_lr(base["lr"], base["batch_size"], batch, rule), lang, 3) for rule in za.LR_RULES]
        )
    return markdown_table(headers, rows)


@lru_cache(maxsize=1)
def _loss_peaks() -> tuple:
    from minigpt.fsdp.memory import loss_peaks

    return tuple(loss_peaks(LOGITS_CHUNKS))


LOGITS_CHUNKS = (1, 4, 16)


def logits_peak(lang: str) -> str:
    """MiniGPT's loss, whole and chunked: the measured peak of its forward and backward passes, in bytes
    and in sizes of the whole logits (``minigpt.fsdp.memory.loss_peaks``). The differences from the whole loss
    depend on the CPU's kernels, so the table says whether they are within their bounds, not their digits."""
    from minigpt.model import GPTConfig
    from minigpt.zero.memory import logits_bytes

    cfg = GPTConfig()
    unit = logits_bytes(64, cfg.block_size, cfg.vocab_size, 4, with_grad=False)
    headers = [
        tr(lang, "the loss", "la pérdida"),
        tr(lang, "peak of its forward and backward", "pico de su pasada hacia delante y hacia atrás"),
        tr(lang, "in logits' sizes", "en tamaños de los logits"),
        tr(
            lang,
            "the whole loss and gradients (within 1e-5 and 1e-7)",
            "la pérdida y los gradientes enteros (a menos de 1e-5 y 1e-7)",
        ),
    ]
    rows = []
    for r in _loss_peaks():
        n = r["chunks"]
        name = (
            tr(lang, "whole logits", "logits enteros")
            if n == 1
            else tr(lang, f"{n} chunks of {64 // n} sentences", f"{n} trozos de {64 // n} frases")
        )
        rows.append(
            [
                name,
                f"{num(r['peak_bytes'], lang)} B",
                num(r["peak_bytes"] / unit, lang, 2),
                tr(lang, "yes", "sí") if r["loss_diff"] < 1e-5 and r["grad_diff"] < 1e-7 else "no",
            ]
        )
    return markdown_table(headers, rows, align="lrrr")


# --- page 03: FSDP in practice ----------------------------------------------------------------


def _fsdp_models() -> list[tuple[str, str, float, int, int]]:
    """(en name, es name, Ψ, parameters of one block, devices) of the page's two examples."""
    d = minigpt_train_defaults()
    return [
        ("MiniGPT", "MiniGPT", minigpt_params(), za.gpt_block_params(d["n_embd"]), 2),
        ("7B", "7B", PSI_7B, za.gpt_block_params(SHAPE_7B["n_embd"]), 8),
    ]


def fsdp_memory(lang: str) -> str:
    """Memory per device under FSDP with bf16 compute and fp32 shards, block-level wrapping
    against one unit for the whole model."""
    models = _fsdp_models()
    headers = [tr(lang, "per device", "por dispositivo")] + [
        tr(lang, f"{en}, $N = {n}$", f"{es}, $N = {n}$") for en, es, _, _, n in models
    ]
    per_model = [za.fsdp_memory(psi, n, unit) for _, _, psi, unit, n in models]
    whole = [za.fsdp_memory(psi, n, psi, units_in_flight=1) for _, _, psi, _, n in models]
    unit = ["MB", "GB"]
    dec = [3, 2]

    def cells(values):
        return [size(v, lang, dec[i], unit[i]) for i, v in enumerate(values)]

    rows = [
        [tr(lang, "fp32 parameter shard ($4\\Psi/N$)", "fragmento de parámetros fp32 ($4\\Psi/N$)")]
        + cells([m.sharded_params for m in per_model]),
        [tr(lang, "fp32 gradient shard ($4\\Psi/N$)", "fragmento de gradientes fp32 ($4\\Psi/N$)")]
        + cells([m.sharded_grads for m in per_model]),
        [tr(lang, "Adam moments ($8\\Psi/N$)", "momentos de Adam ($8\\Psi/N$)")]
        + cells([m.optimizer for m in per_model]),
        [tr(lang, "bf16 blocks in flight (current + prefetched)", "bloques bf16 en vuelo (el actual + el precargado)")]
        + cells([m.gathered for m in per_model]),
        [
            tr(
                lang,
                "bf16 gradient of the current block, before its reduce-scatter",
                "gradiente bf16 del bloque actual, antes de su reduce-scatter",
            )
        ]
        + cells([m.unsharded_grad for m in per_model]),
        [tr(lang, "**total, block-level wrapping**", "**total, envoltura por bloque**")]
        + [f"**{c}**" for c in cells([m.total for m in per_model])],
        [tr(lang, "total, one unit for the whole model", "total, una sola unidad para todo el modelo")]
        + cells([m.total for m in whole]),
        [tr(lang, "for comparison: DDP ($16\\Psi$)", "como referencia: DDP ($16\\Psi$)")]
        + cells([16 * psi for _, _, psi, _, _ in models]),
    ]
    return markdown_table(headers, rows)


def checkpoint_sizes(lang: str) -> str:
    """Full against sharded checkpoints (fp32 parameters and Adam moments, 12 bytes/param)."""
    models = _fsdp_models()
    headers = [
        tr(lang, "model", "modelo"),
        "$N$",
        tr(lang, "checkpoint", "checkpoint"),
        tr(lang, "full: one file, assembled on rank 0", "completo: un archivo, montado en el rank 0"),
        tr(lang, "sharded: files × size", "fragmentado: archivos × tamaño"),
    ]
    rows = []
    for (en, es, psi, _, n), unit, dec in zip(models, ["MB", "GB"], [2, 1]):
        total = za.checkpoint_bytes(psi)
        rows.append(
            [
                tr(lang, en, es),
                num(n, lang),
                size(total, lang, dec, unit),
                size(total, lang, dec, unit),
                f"{n} × {size(total / n, lang, dec, unit)}",
            ]
        )
    return markdown_table(headers, rows)


GRAD_NORM_EXAMPLE = (0.6, 0.8, 2.4, 0.0)  # local gradient norms of 4 shards
GRAD_NORM_MAX = 1.0


def grad_norm_shards(lang: str) -> str:
    """Clipping with local norms (wrong) against the global norm (right), 4 shards."""
    total = za.global_grad_norm(GRAD_NORM_EXAMPLE)
    right = za.clip_coefficient(total, GRAD_NORM_MAX)
    headers = [
        tr(lang, "shard", "fragmento"),
        tr(lang, "local norm", "norma local"),
        tr(lang, "squared", "al cuadrado"),
        tr(lang, "scale if clipped locally (wrong)", "escala si se recorta localmente (mal)"),
        tr(lang, "scale if clipped globally (right)", "escala si se recorta globalmente (bien)"),
    ]
    rows = [
        [
            num(i, lang),
            num(x, lang, 2),
            num(x * x, lang, 2),
            num(za.clip_coefficient(x, GRAD_NORM_MAX), lang, 3),
            num(right, lang, 3),
        ]
        for i, x in enumerate(GRAD_NORM_EXAMPLE)
    ]
    rows.append(
        [
            tr(lang, "**all-reduce**", "**all-reduce**"),
            f"**{num(total, lang, 2)}**",
            f"**{num(total * total, lang, 2)}**",
            "",
            "",
        ]
    )
    return markdown_table(headers, rows)


def minigpt_parameter_shapes(lang: str) -> str:
    """MiniGPT's parameters in the model's order (``model.named_parameters()``), each block's rows once
    (``blocks.<i>``), one block's total, and the model's: the shapes the labs cut into shards."""
    from minigpt.train import TrainConfig, build_model

    model = build_model(TrainConfig())
    headers = [
        tr(lang, "parameter", "parámetro"),
        tr(lang, "shape", "forma"),
        tr(lang, "numbers", "números"),
        tr(lang, "float32 bytes", "bytes en float32"),
    ]

    def row(name: str, shape: str, n: int) -> list[str]:
        return [name, shape, num(n, lang), num(4 * n, lang)]

    rows = []
    for name, p in model.named_parameters():
        part = name.split(".")
        if part[0] == "blocks" and part[1] != "0":
            continue  # every block has block 0's shapes
        if part[0] == "blocks":
            name = ".".join(["blocks", "<i>", *part[2:]])
        rows.append(row(f"`{name}`", " × ".join(map(str, p.shape)), p.numel()))
    n_blocks = len(model.blocks)
    rows.append(row(tr(lang, "one block", "un bloque"), "", sum(p.numel() for p in model.blocks[0].parameters())))
    whole = tr(lang, f"the model ({n_blocks} blocks)", f"el modelo ({n_blocks} bloques)")
    rows.append(row(whole, "", sum(p.numel() for p in model.parameters())))
    return markdown_table(headers, rows, "llrr")
