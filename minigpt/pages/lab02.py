"""The generated tables of Lab 02's page (``lab/02-zero-simulator.md``), in English and Spanish.

Registered in :data:`minigpt.pages.site.TABLES`, so ``python -m minigpt.pages`` (and ``make docs``)
writes them to ``build/tables/<name>-<lang>.md`` like the theory pages' tables. Everything here
comes from :mod:`minigpt.zero` (numpy only).
"""

from __future__ import annotations

from minigpt.pages.lang import localize, num, tr
from minigpt.zero import analytic as za, comm, memory, mlp, simulate

PAPER_MODELS = (7.5e9, 128e9, 1e12)
PAPER_NS = (1, 4, 16, 64, 256, 1024)
DS_EXAMPLE = {"total_params": 2851e6, "largest_layer_params": 32e6, "gpus_per_node": 8, "nodes": 1}
HSDP_EXAMPLE = {"psi": 7 * 10**9, "world": 64, "per_node": 8}
SIM_EXAMPLE = {"n_workers": 4, "spec": mlp.MLPSpec(), "steps": 3, "rows": 32, "recipe_name": "fp32"}


def _table(headers: list[str], rows: list[list[str]], left_last: bool = False) -> str:
    align = ["---"] + ["---:"] * (len(headers) - 1)
    if left_last:
        align[-1] = "---"
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join(align) + " |"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows]) + "\n"


def _gb(x: float, lang: str, decimals: int = 2) -> str:
    return num(x / za.GB, lang, decimals) + " GB"


def _gib(x: float, lang: str, decimals: int = 2) -> str:
    """Binary gigabytes (2**30 bytes), the unit DeepSpeed's estimators print."""
    return num(x / 2**30, lang, decimals) + " GiB"


def recipes(lang: str) -> str:
    descriptions = {
        "mixed": (
            "fp16/bf16 weights and gradients; fp32 master copy, Adam's m and v (the ZeRO paper)",
            "pesos y gradientes en fp16/bf16; copia maestra en fp32, m y v de Adam (el artículo de ZeRO)",
        ),
        "mixed-fp32-grads": (
            "as mixed, plus an fp32 gradient-accumulation buffer, which is what is reduced",
            "como mixed, más un búfer de acumulación de gradientes en fp32, que es lo que se reduce",
        ),
        "fp32": (
            "fp32 weights and gradients, Adam's m and v; MiniGPT's own runs",
            "pesos y gradientes en fp32, m y v de Adam; las ejecuciones de MiniGPT",
        ),
    }
    rows = [
        [
            f"`{r.name}`",
            str(r.param_bytes),
            str(r.grad_bytes),
            str(r.optimizer_bytes),
            str(r.total),
            str(r.reduce_bytes),
            tr(lang, *descriptions[r.name]),
        ]
        for r in memory.RECIPES.values()
    ]
    return _table(
        [
            tr(lang, "recipe", "receta"),
            tr(lang, "weights", "pesos"),
            tr(lang, "gradients", "gradientes"),
            "K",
            "total",
            tr(lang, "reduced", "se reduce"),
            tr(lang, "what it is", "qué es"),
        ],
        rows,
        left_last=True,
    )


def paper_table_1(lang: str) -> str:
    """The ZeRO paper's Table 1, every cell recomputed and rounded as the paper rounds."""
    headers = ["N"]
    for psi in PAPER_MODELS:
        name = "1T" if psi >= 1e12 else localize(f"{psi / 1e9:g}", lang) + "B"
        headers += [f"{name} · ZeRO-{s}" for s in (1, 2, 3)]
    rows = []
    for n in PAPER_NS:
        row = [str(n)]
        for psi in PAPER_MODELS:
            row += [localize(za.paper_round(memory.device_memory(psi, n, s).device / za.GB), lang) for s in (1, 2, 3)]
        rows.append(row)
    return _table(headers, rows)


def deepspeed_compare(lang: str) -> str:
    """DeepSpeed's stage-3 estimator beside our model for the same inputs, in GiB (2**30 bytes) as
    DeepSpeed prints them, so that its column reads as its own output."""
    ex = DS_EXAMPLE
    n = ex["gpus_per_node"] * ex["nodes"]
    rows = []
    cases = [(True, True), (True, False), (False, False)]
    for offload_optimizer, offload_params in cases:
        ds = memory.deepspeed_estimate(
            3,
            ex["total_params"],
            ex["largest_layer_params"],
            ex["gpus_per_node"],
            ex["nodes"],
            offload_optimizer,
            offload_params,
            zero_init=True,
        )
        ours = memory.device_memory(
            ex["total_params"], n, 3, "mixed", ex["largest_layer_params"], offload_optimizer, offload_params
        )
        rows.append(
            [
                f"`{ds.options}`",
                _gib(ds.gpu, lang),
                _gib(ours.device, lang),
                _gib(ds.cpu, lang),
                _gib(ours.host * ex["gpus_per_node"], lang),
            ]
        )
    return _table(
        [
            tr(lang, "options", "opciones"),
            tr(lang, "DeepSpeed, per GPU", "DeepSpeed, por GPU"),
            tr(lang, "this model, per GPU", "este modelo, por GPU"),
            tr(lang, "DeepSpeed, CPU per node", "DeepSpeed, CPU por nodo"),
            tr(lang, "this model, CPU per node", "este modelo, CPU por nodo"),
        ],
        rows,
    )


def hsdp_tradeoff(lang: str) -> str:
    ex = HSDP_EXAMPLE
    rows = []
    s = 1
    while s <= ex["world"]:
        r = ex["world"] // s
        t = comm.traffic(comm.step_collectives(ex["psi"], 3, s, r))
        rows.append(
            [
                str(s),
                str(r),
                _gb(memory.device_memory(ex["psi"], s, 3).device, lang),
                _gb(t.inside, lang),
                _gb(t.across, lang),
                tr(lang, "yes", "sí") if s <= ex["per_node"] else "no",
            ]
        )
        s *= 2
    return _table(
        [
            tr(lang, "shard degree S", "grado de fragmentación S"),
            tr(lang, "replicas R", "réplicas R"),
            tr(lang, "model states per device", "estados del modelo por dispositivo"),
            tr(lang, "sent inside the group", "enviado dentro del grupo"),
            tr(lang, "sent across replicas", "enviado entre réplicas"),
            tr(lang, "group inside one node", "grupo dentro de un nodo"),
        ],
        rows,
    )


def simulation(lang: str) -> str:
    ex = SIM_EXAMPLE
    runs = [simulate.simulate(stage, **ex) for stage in za.STAGES]
    n = ex["n_workers"]
    padded = [comm.padded(u, n) for u in ex["spec"].unit_sizes]
    rec = memory.recipe(ex["recipe_name"])
    rows = []
    for run in runs:
        same = all((a == b).all() for a, b in zip(runs[0].weights, run.weights))
        predicted = memory.device_memory(sum(padded), n, run.stage, ex["recipe_name"], largest_layer=max(padded))
        sent = sum(
            c.bytes_sent
            for c in comm.unit_collectives(ex["spec"].unit_sizes, run.stage, n, rec.param_bytes, rec.reduce_bytes)
        )
        rows.append(
            [
                za.STAGE_NAMES[run.stage],
                tr(lang, "bit for bit", "bit a bit") if same else "NO",
                num(run.peak_model_state[0], lang),
                num(predicted.device, lang),
                num(run.bytes_sent_per_step[0], lang),
                num(sent, lang),
            ]
        )
    return _table(
        [
            tr(lang, "stage", "etapa"),
            tr(lang, "weights equal to DDP's", "pesos iguales a los de DDP"),
            tr(lang, "peak held, measured (bytes)", "pico retenido, medido (bytes)"),
            tr(lang, "model", "modelo"),
            tr(lang, "sent per step, measured (bytes)", "enviado por paso, medido (bytes)"),
            tr(lang, "model", "modelo"),
        ],
        rows,
    )


TABLES = {
    "lab02-recipes": recipes,
    "lab02-paper-table-1": paper_table_1,
    "lab02-deepspeed": deepspeed_compare,
    "lab02-hsdp": hsdp_tradeoff,
    "lab02-simulation": simulation,
}
