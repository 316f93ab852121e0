"""The tables (Markdown, English and Spanish) and figures of Lab 03's "FSDP in practice", from the
report :mod:`minigpt.runners.lab03_fsdp_practice` writes (``python lab/03_fsdp_practice.py --render JSON``)."""

from __future__ import annotations

import json
from pathlib import Path

from minigpt.pages.lang import num, sci

DEMOS = (
    "wrap",
    "mixed-precision",
    "activation-checkpointing",
    "checkpoint",
    "clipping",
    "diagnostics",
    "loading",
    "failed-save",
)
# the sections of the fragments, in order: the demonstrations, and the export that the checkpoint
# demonstration's world-1 half adds (consolidating its sharded checkpoint into one file)
SECTIONS = (*DEMOS[:4], "export", *DEMOS[4:])

# ----------------------------------------------------------------------------------------------
# Tables (Markdown, English and Spanish) and figures, from a report

LABELS = {
    "en": {
        "policy": "policy",
        "units": "units",
        "ag": "all-gathers per step",
        "rs": "reduce-scatters per step",
        "ag_mb": "MB all-gathered per step",
        "peak_fwd": "peak, forward (MB)",
        "peak_bwd": "peak, backward (MB)",
        "peak_one": "peak, 1 sentence per rank (MB)",
        "mp": "FSDP2 mixed precision",
        "grad_error": "gradient error (relative)",
        "fwd_drift": "drift of one forward",
        "weight_drift": "weight drift after {k} steps",
        "vs_fp32": "same, against FSDP fp32",
        "fp32": "fp32 (no policy)",
        "bf16 params, fp32 reduce": "bf16 parameters, fp32 reduce",
        "bf16 params, bf16 reduce": "bf16 parameters, bf16 reduce",
        "rounding": "The bf16 reduction's own rounding (bf16 reduce against fp32 reduce): {x}. "
        "Buffers: {n}, of dtype {dtypes}.",
        "variant": "variant",
        "plain": "blocks as they are",
        "checkpointed": "each block checkpointed",
        "median": "median step (ms)",
        "same": "Largest difference, first step: logits {logits}, gradients {grads}.",
        "checkpoint": "checkpoint",
        "save_peak": "peak at save, rank {r} (MB)",
        "files": "files",
        "disk": "MB on disk",
        "sharded": "sharded (DCP)",
        "full": "full (gathered on rank 0)",
        "file": "file",
        "read": "read at world size {w}, compared with",
        "diff": r"max \|difference\|",
        "logits": "logits of the saving run (probe batch)",
        "weights": "weights of the full state dict ({n} tensors)",
        "adamw": "AdamW state of the full state dict",
        "index": "`.metadata` indexes {tensors} tensors stored in {pieces} pieces (a piece: one rank's shard of one "
        "tensor; a scalar is stored once): {payload} MB of tensor data, {framing} kB of framing per piece.",
        "tied": " The tied matrix is stored twice, as `wte.weight` and as `lm_head.weight`{also}.",
        "also_full": ", in `full.pt` too",
        "norm": "gradient norm",
        "value": "value",
        "coef": "clip coefficient for max_norm {m}",
        "local_r": "local, rank {r}",
        "global": "global, from the ranks' sums of squares",
        "torch_norm": "`clip_grad_norm_` on the sharded gradients",
        "single": "one process, whole gradient",
        "optimizer": "optimizer",
        "clips": "FSDP clips",
        "by_global": "by the global norm",
        "by_local": "by each rank's local norm",
        "step_drift": "drift after step 1 (step drift)",
        "trajectory": "trajectory drift after step {s}",
        "unit": "unit",
        "parameters": "parameters",
        "elements": "elements",
        "r_elements": "rank {r}: elements",
        "r_padding": "rank {r}: padding",
        "r_bytes": "rank {r}: bytes",
        "phase": "phase (rank 0)",
        "after": "{kind} after (MB)",
        "during": "peak during (MB)",
        "gradients": "gradients",
        "gathered": "gathered",
        "fig_memory": "Memory of one FSDP2 step per wrap policy (rank 0)",
        "fig_batch": "training batch ({n} sentences per rank)",
        "fig_one": "1 sentence per rank",
        "fig_phase_peak": "peak during the phase (MB)",
        "fig_ac": "Activation checkpointing: memory against time (rank 0)",
        "fig_time": "median step time (ms)",
        "fig_peak": "peak memory of a step (MB)",
        "forward": "forward",
        "backward": "backward",
        "optimizer step": "optimizer step",
        "loading": "loading",
        "fsdp_first": "every rank reads the file",
        "broadcast_from_rank0": "rank 0 reads it (`broadcast_from_rank0`)",
        "rank": "rank",
        "held_meta": "parameters held, built on meta (bytes)",
        "held_sharded": "after fully_shard (bytes)",
        "held_empty": "after to_empty (bytes)",
        "held_loaded": "after the load (bytes)",
        "read_bytes": "checkpoint read (bytes)",
        "load_peak": "peak while loading (MB)",
        "loading_note": "The full checkpoint: {tensors} tensors, {full} bytes of tensor data ({file} bytes on disk). "
        "Largest \\|loaded shard − checkpoint\\| (the shards gathered): {d1} when every rank reads it, "
        "{d2} with `broadcast_from_rank0`.",
        "export_note": "`dcp_to_torch_save` wrote `{file}`, one file of {bytes} bytes holding {keys}. "
        "Its {n} model tensors, loaded by a plain MiniGPT (`load_state_dict`, strict), give the saving run's "
        "logits: max \\|difference\\| {d}, {same}.",
        "identical": "bit for bit identical",
        "not_identical": "NOT identical",
        "failed_note": "Rank {f} raised before `dcp.save`; rank {w} was already inside it, in a group with a "
        "{t} s timeout. After {s} s it ended with:",
    },
    "es": {
        "policy": "política",
        "units": "unidades",
        "ag": "all-gathers por paso",
        "rs": "reduce-scatters por paso",
        "ag_mb": "MB en all-gather por paso",
        "peak_fwd": "pico, forward (MB)",
        "peak_bwd": "pico, backward (MB)",
        "peak_one": "pico, 1 oración por rank (MB)",
        "mp": "precisión mixta de FSDP2",
        "grad_error": "error del gradiente (relativo)",
        "fwd_drift": "deriva de una pasada hacia delante",
        "weight_drift": "deriva de los pesos tras {k} pasos",
        "vs_fp32": "ídem, frente a FSDP fp32",
        "fp32": "fp32 (sin política)",
        "bf16 params, fp32 reduce": "parámetros bf16, reducción fp32",
        "bf16 params, bf16 reduce": "parámetros bf16, reducción bf16",
        "rounding": "El redondeo propio de la reducción en bf16 (reducción bf16 frente a fp32): {x}. "
        "Buffers: {n}, de tipo {dtypes}.",
        "variant": "variante",
        "plain": "bloques tal cual",
        "checkpointed": "cada bloque con recálculo",
        "median": "paso, mediana (ms)",
        "same": "Mayor diferencia en el primer paso: logits {logits}, gradientes {grads}.",
        "checkpoint": "checkpoint",
        "save_peak": "pico al guardar, rank {r} (MB)",
        "files": "archivos",
        "disk": "MB en disco",
        "sharded": "fragmentado (DCP)",
        "full": "completo (reunido en el rank 0)",
        "file": "archivo",
        "read": "leído con tamaño del mundo {w}, comparado con",
        "diff": r"máx. \|diferencia\|",
        "logits": "logits de la ejecución que guardó (lote sonda)",
        "weights": "pesos del state dict completo ({n} tensores)",
        "adamw": "estado de AdamW del state dict completo",
        "index": "`.metadata` indexa {tensors} tensores guardados en {pieces} trozos (un trozo: el fragmento que "
        "un rank tiene de un tensor; un escalar se guarda una vez): {payload} MB de datos de tensores, "
        "{framing} kB de envoltorio por trozo.",
        "tied": " La matriz atada se guarda dos veces, como `wte.weight` y como `lm_head.weight`{also}.",
        "also_full": ", también en `full.pt`",
        "norm": "norma del gradiente",
        "value": "valor",
        "coef": "coeficiente de recorte para max_norm {m}",
        "local_r": "local, rank {r}",
        "global": "global, de las sumas de cuadrados de los ranks",
        "torch_norm": "`clip_grad_norm_` sobre los gradientes fragmentados",
        "single": "un proceso, gradiente entero",
        "optimizer": "optimizador",
        "clips": "FSDP recorta",
        "by_global": "por la norma global",
        "by_local": "por la norma local de cada rank",
        "step_drift": "deriva tras el paso 1 (deriva por paso)",
        "trajectory": "deriva de la trayectoria tras el paso {s}",
        "unit": "unidad",
        "parameters": "parámetros",
        "elements": "elementos",
        "r_elements": "rank {r}: elementos",
        "r_padding": "rank {r}: relleno",
        "r_bytes": "rank {r}: bytes",
        "phase": "fase (rank 0)",
        "after": "{kind} después (MB)",
        "during": "pico durante (MB)",
        "gradients": "gradientes",
        "gathered": "reunidos",
        "fig_memory": "Memoria de un paso de FSDP2 por política de envoltura (rank 0)",
        "fig_batch": "lote de entrenamiento ({n} oraciones por rank)",
        "fig_one": "1 oración por rank",
        "fig_phase_peak": "pico durante la fase (MB)",
        "fig_ac": "Recálculo de activaciones: memoria frente a tiempo (rank 0)",
        "fig_time": "tiempo de paso, mediana (ms)",
        "fig_peak": "pico de memoria de un paso (MB)",
        "forward": "forward",
        "backward": "backward",
        "optimizer step": "paso del optimizador",
        "loading": "carga",
        "fsdp_first": "cada rank lee el archivo",
        "broadcast_from_rank0": "lo lee el rank 0 (`broadcast_from_rank0`)",
        "rank": "rank",
        "held_meta": "parámetros en memoria, construido en meta (bytes)",
        "held_sharded": "tras fully_shard (bytes)",
        "held_empty": "tras to_empty (bytes)",
        "held_loaded": "tras la carga (bytes)",
        "read_bytes": "checkpoint leído (bytes)",
        "load_peak": "pico durante la carga (MB)",
        "loading_note": "El checkpoint completo: {tensors} tensores, {full} bytes de datos de tensores ({file} bytes en "
        "disco). Mayor \\|fragmento cargado − checkpoint\\| (los fragmentos reunidos): {d1} cuando cada rank lo lee, "
        "{d2} con `broadcast_from_rank0`.",
        "export_note": "`dcp_to_torch_save` escribió `{file}`, un solo archivo de {bytes} bytes con {keys}. "
        "Sus {n} tensores del modelo, cargados en un MiniGPT sin fragmentar (`load_state_dict`, estricto), dan los "
        "logits de la ejecución que guardó: máx. \\|diferencia\\| {d}, {same}.",
        "identical": "idénticos bit a bit",
        "not_identical": "NO idénticos",
        "failed_note": "El rank {f} lanzó una excepción antes de `dcp.save`; el rank {w} ya estaba dentro, en un grupo "
        "con un tiempo límite (timeout) de {t} s. A los {s} s terminó con:",
    },
}
PHASES_OF_STEP = ("forward", "backward", "optimizer")


def _mb(n_bytes: float, lang: str) -> str:
    return num(n_bytes / 1e6, lang, 2)


def _sci(x: float, lang: str) -> str:
    return "0" if x == 0 else sci(x, lang, 2)


def md_table(header: list[str], rows: list[list], align: str | None = None) -> str:
    """A Markdown table; ``align`` has one letter per column, l or r (default: l then r's)."""
    align = align or "l" + "r" * (len(header) - 1)
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---:" if a == "r" else "---" for a in align) + " |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def table_wrap(r: dict, lang: str) -> str:
    L = LABELS[lang]
    rows = []
    for policy in ("whole", "block", "linear"):
        p, counted = r[policy], r[policy]["collectives_per_step"][-1]
        rows.append(
            [
                f"`{policy}`",
                len(p["units"]),
                counted["all_gathers"],
                counted["reduce_scatters"],
                _mb(counted["all_gather_bytes"], lang),
                _mb(p["phase_peak_bytes"]["forward"], lang),
                _mb(p["phase_peak_bytes"]["backward"], lang),
                _mb(p["one_sentence"]["peak_bytes"], lang),
            ]
        )
    return md_table([L[k] for k in ("policy", "units", "ag", "rs", "ag_mb", "peak_fwd", "peak_bwd", "peak_one")], rows)


def table_mixed_precision(r: dict, lang: str) -> str:
    L = LABELS[lang]
    header = [L["mp"], L["grad_error"], L["fwd_drift"], L["weight_drift"].format(k=r["steps"]), L["vs_fp32"]]
    rows = [
        [
            L[name],
            _sci(v["grad_error"], lang),
            _sci(v["first_forward_drift"], lang),
            _sci(v["weight_drift"], lang),
            _sci(v["vs_fsdp_fp32"], lang),
        ]
        for name, v in r["variants"].items()
    ]
    rounding = r["variants"]["bf16 params, bf16 reduce"]["reduce_rounding"]
    note = L["rounding"].format(
        x=_sci(rounding, lang), n=len(r["buffers"]), dtypes=", ".join(sorted(set(r["buffers"].values())))
    )
    return md_table(header, rows) + "\n" + note + "\n"


def table_activation_checkpointing(r: dict, lang: str) -> str:
    L = LABELS[lang]
    rows = [
        [
            L[name],
            _mb(v["phase_peak_bytes"]["forward"], lang),
            _mb(v["phase_peak_bytes"]["backward"], lang),
            num(1000 * v["median_step_s"], lang, 1),
            v["all_gathers"],
        ]
        for name, v in r["variants"].items()
    ]
    note = L["same"].format(logits=_sci(r["max_logit_difference"], lang), grads=_sci(r["max_grad_difference"], lang))
    return md_table([L[k] for k in ("variant", "peak_fwd", "peak_bwd", "median", "ag")], rows) + "\n" + note + "\n"


def table_checkpoint(r: dict, lang: str) -> str:
    L, save = LABELS[lang], r["save"]
    peaks = save["save_peak_bytes_per_rank"]
    header = [L["checkpoint"]] + [L["save_peak"].format(r=i) for i in range(len(peaks))] + [L["files"], L["disk"]]
    rows = [
        [L[kind]]
        + [_mb(p[kind], lang) for p in peaks]
        + [len(save["layout"][kind]), _mb(sum(f["bytes"] for f in save["layout"][kind]), lang)]
        for kind in ("sharded", "full")
    ]
    files = md_table(
        [L["file"], "bytes"],
        [[f"`{f['file']}`", num(f["bytes"], lang)] for kind in ("sharded", "full") for f in save["layout"][kind]],
    )
    index = save["index"]
    data_files = sum(f["bytes"] for f in save["layout"]["sharded"] if f["file"].endswith(".distcp"))
    note = L["index"].format(
        tensors=index["tensors"],
        pieces=index["pieces"],
        payload=_mb(index["payload_bytes"], lang),
        framing=num((data_files - index["payload_bytes"]) / index["pieces"] / 1e3, lang, 1),
    )
    if {"wte.weight", "lm_head.weight"} <= set(index["model_tensors"]):
        note += L["tied"].format(also=L["also_full"] if r.get("load", {}).get("full_stores_tied_twice") else "")
    load = "\n" + table_load(r["load"], lang) if "load" in r else ""
    return md_table(header, rows) + "\n" + files + "\n" + note + "\n" + load


def table_load(r: dict, lang: str) -> str:
    if "error" in r:
        return r["error"] + "\n"
    L = LABELS[lang]
    return md_table(
        [L["read"].format(w=r["world_size"]), L["diff"]],
        [
            [L["logits"], _sci(r["max_logit_difference"], lang)],
            [L["weights"].format(n=r["tensors_compared"]), _sci(r["max_weight_difference"], lang)],
            [L["adamw"], _sci(r["max_optimizer_difference"], lang)],
        ],
    )


def table_clipping(r: dict, lang: str) -> str:
    L = LABELS[lang]
    rows = [
        [L["local_r"].format(r=i), num(n, lang, 6), num(c, lang, 4)]
        for i, (n, c) in enumerate(zip(r["local_norms"], r["local_coefficients"]))
    ]
    rows += [
        [L["global"], num(r["global_norm"], lang, 6), num(r["global_coefficient"], lang, 4)],
        [L["torch_norm"], num(r["clip_grad_norm"], lang, 6), ""],
        [L["single"], num(r["single_process_norm"], lang, 6), ""],
    ]
    norms = md_table([L["norm"], L["value"], L["coef"].format(m=num(r["max_norm"], lang, 4))], rows)
    steps = len(next(iter(r["optimizers"].values()))["drift_per_step"]["global"])
    rows = [
        [f"{opt} (lr {num(v['lr'], lang, 3)})", L[f"by_{how}"], _sci(drifts[0], lang), _sci(drifts[-1], lang)]
        for opt, v in r["optimizers"].items()
        for how, drifts in v["drift_per_step"].items()
    ]
    drift = md_table([L["optimizer"], L["clips"], L["step_drift"], L["trajectory"].format(s=steps)], rows, "llrr")
    return norms + "\n" + drift


def table_diagnostics(r: dict, lang: str) -> str:
    L = LABELS[lang]
    units = md_table(
        [L["unit"], L["parameters"], L["elements"]],
        [
            [f"`{u['unit']}`", ", ".join(f"`{n}`" for n in u["parameters"]), num(u["elements"], lang)]
            for u in r["units"]
        ],
        "llr",
    )
    ranks = range(r["world_size"])
    rows = []
    for u in r["units"]:
        row = [f"`{u['unit']}`"]
        for rank in ranks:
            mine = [s for s in r["shards_per_rank"][rank] if s["unit"] == u["unit"]]
            held, stored = sum(s["elements"] for s in mine), sum(s["padded_elements"] for s in mine)
            row += [num(held, lang), num(stored - held, lang), num(sum(s["bytes"] for s in mine), lang)]
        rows.append(row)
    header = [L["unit"]] + [L[k].format(r=rank) for rank in ranks for k in ("r_elements", "r_padding", "r_bytes")]
    shards = md_table(header, rows)
    kinds = ("parameters", "gradients", "optimizer", "gathered")
    rows = [
        [f"`{phase}`"] + [_mb(r["census"][phase][k], lang) for k in kinds] + [_mb(r["phase_peak_bytes"][phase], lang)]
        for phase in ("init", *PHASES_OF_STEP)
    ]
    phases = md_table([L["phase"]] + [L["after"].format(kind=L[k]) for k in kinds] + [L["during"]], rows)
    return units + "\n" + shards + "\n" + phases


def table_loading(r: dict, lang: str) -> str:
    L = LABELS[lang]
    held = ("built on meta", "sharded on meta", "to_empty", "loaded")
    rows = [
        [L[mode], rank]
        + [num(p["held_bytes"][h], lang) for h in held]
        + [num(p["read_bytes"], lang), _mb(p["load_peak_bytes"], lang)]
        for mode in ("fsdp_first", "broadcast_from_rank0")
        for rank, p in enumerate(r[mode]["per_rank"])
    ]
    header = [L[k] for k in ("loading", "rank", "held_meta", "held_sharded", "held_empty", "held_loaded")]
    table = md_table(header + [L["read_bytes"], L["load_peak"]], rows, "lr" + "r" * 6)
    first = r["fsdp_first"]
    note = L["loading_note"].format(
        tensors=first["tensors"],
        full=num(first["full_bytes"], lang),
        file=num(r["file_bytes"], lang),
        d1=_sci(first["max_difference"], lang),
        d2=_sci(r["broadcast_from_rank0"]["max_difference"], lang),
    )
    return table + "\n" + note + "\n"


def table_export(r: dict, lang: str) -> str:
    L = LABELS[lang]
    return (
        L["export_note"].format(
            file=r["file"],
            bytes=num(r["bytes"], lang),
            keys=", ".join(f"`{k}`" for k in r["top_level"]),
            n=r["model_tensors"],
            d=_sci(r["max_logit_difference"], lang),
            same=L["identical" if r["identical_logits"] else "not_identical"],
        )
        + "\n"
    )


def table_failed_save(r: dict, lang: str) -> str:
    L = LABELS[lang]
    waited = [x for x in r["ranks"] if "line" in x]
    raised = ", ".join(str(x["rank"]) for x in r["ranks"] if x["what"] == "raised before the save")
    out = []
    for w in waited:
        note = L["failed_note"].format(
            f=raised, w=w["rank"], t=num(r["timeout_s"], lang, 0), s=num(w["seconds"], lang, 1)
        )
        out.append(f"{note}\n\n```text\n{w['line']}\n```\n")
    return "\n".join(out)


TABLES = {
    "wrap": table_wrap,
    "mixed-precision": table_mixed_precision,
    "activation-checkpointing": table_activation_checkpointing,
    "checkpoint": table_checkpoint,
    "clipping": table_clipping,
    "diagnostics": table_diagnostics,
    "loading": table_loading,
    "export": table_export,
    "failed-save": table_failed_save,
}


def render_tables(report: dict, lang: str) -> str:
    """Every demonstration of the report, each in a snippet section the lab page can include
    alone: ``--8<-- "lab/results/03-practice-cpu-en.txt:wrap"``."""
    return "\n".join(
        f"<!-- --8<-- [start:{name}] -->\n{TABLES[name](report[name], lang)}<!-- --8<-- [end:{name}] -->\n"
        for name in SECTIONS
        if name in report
    )


def plot_memory(report: dict, lang: str, path: Path) -> None:
    """Peak of each phase of a step, per wrap policy: the training batch, and one sentence per rank."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    policies = ("whole", "block", "linear")
    L, wrap = LABELS[lang], report["wrap"]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    titles = (L["fig_batch"].format(n=report["meta"]["batch_size"] // report["meta"]["world_size"]), L["fig_one"])
    for ax, key, title in zip(axes, (None, "one_sentence"), titles):
        for i, phase in enumerate(PHASES_OF_STEP):
            values = [(wrap[p][key] if key else wrap[p])["phase_peak_bytes"][phase] / 1e6 for p in policies]
            label = L["optimizer step" if phase == "optimizer" else phase]
            ax.bar([j + (i - 1) * 0.27 for j in range(len(policies))], values, width=0.27, label=label)
        ax.set_xticks(range(len(policies)), policies)
        ax.set_title(title, fontsize=9)
        ax.set_ylabel(L["fig_phase_peak"])
        ax.grid(axis="y", alpha=0.3)
    axes[1].legend(fontsize=8, loc="upper right")
    fig.suptitle(L["fig_memory"], fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)


def plot_activation_checkpointing(report: dict, lang: str, path: Path) -> None:
    """Peak memory against median step time, with and without checkpointing each block."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    L, variants = LABELS[lang], report["activation-checkpointing"]["variants"]
    fig, ax = plt.subplots(figsize=(5.6, 3.4))
    for name, v in variants.items():
        x, y = 1000 * v["median_step_s"], v["peak_bytes"] / 1e6
        ax.scatter([x], [y], s=60)
        ax.annotate(L[name], (x, y), textcoords="offset points", xytext=(8, 4), fontsize=8)
    ax.set_xlabel(L["fig_time"])
    ax.set_ylabel(L["fig_peak"])
    ax.set_ylim(0, 1.25 * max(v["peak_bytes"] / 1e6 for v in variants.values()))
    ax.set_xlim(left=0, right=1.5 * max(1000 * v["median_step_s"] for v in variants.values()))
    ax.grid(alpha=0.3)
    ax.set_title(L["fig_ac"], fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)


def render(json_path: Path) -> list[Path]:
    """``X.json`` -> ``X-en.txt``, ``X-es.txt`` and the figures ``X-memory-en.png`` ... ``X-ac-es.png``."""
    report = json.loads(json_path.read_text())
    written = []
    for lang in ("en", "es"):
        table = json_path.with_name(f"{json_path.stem}-{lang}.txt")
        table.write_text(render_tables(report, lang))
        written.append(table)
        if "wrap" in report:
            written.append(json_path.with_name(f"{json_path.stem}-memory-{lang}.png"))
            plot_memory(report, lang, written[-1])
        if "activation-checkpointing" in report:
            written.append(json_path.with_name(f"{json_path.stem}-ac-{lang}.png"))
            plot_activation_checkpointing(report, lang, written[-1])
    return written
