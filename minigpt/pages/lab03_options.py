"""The tables of Lab 03's options run, in English and Spanish (``lab/results/03-options-*``): what the
optimizer sees under each FSDP, autocast against FSDP's mixed precision, and CPU offload.

    python lab/03_fsdp_options.py --render lab/results/03-options-cpu.json
"""

from __future__ import annotations

import json
from pathlib import Path

from minigpt.pages.lang import LANGS, num, pct, tr
from minigpt.zero.memory import young_interval

PCIE_BYTES_PER_S = 25e9  # PCIe 4.0 x16, nominal, one direction
BIG = 10**9  # the paper's model: 10^9 parameters in fp32 with AdamW, on 8 ranks

WRAPPERS_ES = {
    "one process": "un proceso",
    "FSDP1, use_orig_params=False": "FSDP1, use_orig_params=False",
    "FSDP1, use_orig_params=True": "FSDP1, use_orig_params=True",
    "FSDP2": "FSDP2",
}
CONFIGS_ES = {
    "fp32": "fp32",
    "policy bf16": "política bf16",
    "policy bf16, reduce fp32": "política bf16, reducción fp32",
    "autocast bf16": "autocast bf16",
    "policy fp16 + autocast bf16": "política fp16 + autocast bf16",
    "root fp32, blocks bf16": "raíz fp32, bloques bf16",
}


def _error(text: str) -> str:
    """A PyTorch error's first sentence, as code."""
    first = text.split(". ")[0].rstrip(".")
    return f"`{first}`"


def optimizer_table(report: dict, lang: str) -> str:
    rows = [
        tr(
            lang,
            "| wrapper | `named_parameters()` | the first, on rank 0 | in the decay group (`p.dim() >= 2`) "
            "| AdamW states on rank 0 | their elements | a frozen parameter in block 0's unit |",
            "| envoltorio | `named_parameters()` | el primero, en el rank 0 | en el grupo con decaimiento (`p.dim() >= 2`) "
            "| estados de AdamW en el rank 0 | sus elementos | un parámetro congelado en la unidad del bloque 0 |",
        ),
        "| --- | ---: | --- | ---: | ---: | ---: | --- |",
    ]
    for r in report["optimizer"]:
        name, shape = r["first"]
        frozen = tr(lang, "works", "funciona") if r["frozen_in_unit"] == "ok" else _error(r["frozen_in_unit"])
        cells = [
            r["wrapper"] if lang == "en" else WRAPPERS_ES[r["wrapper"]],
            str(r["named_parameters"]),
            f"`{name}` {tuple(shape)}, {r['first_type']}".replace(",)", ")"),
            str(r["decay_group"]),
            f"{r['state_tensors']} ({r['state_type']})",
            num(r["state_numel_here"], lang),
            frozen,
        ]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def precedence_table(report: dict, lang: str) -> str:
    rows = [
        tr(
            lang,
            "| configuration | `qkv`'s input | `qkv`'s output (its matmul) | gradients reduce-scattered in | sharded gradient |",
            "| configuración | entrada de `qkv` | salida de `qkv` (su producto) | gradientes reducidos en | gradiente fragmentado |",
        ),
        "| --- | --- | --- | --- | --- |",
    ]
    notes = []
    for r in report["precedence"]:
        name = r["config"] if lang == "en" else CONFIGS_ES[r["config"]]
        reduce, grad = r["reduce"] or "—", r["grad"] or "—"
        if r["error"]:
            reduce = grad = tr(lang, "(stopped)", "(se detuvo)")
            notes.append(
                tr(lang, "{c}: a LayerNorm stops it: {e}.", "{c}: una LayerNorm lo detiene: {e}.").format(
                    c=name, e=_error(r["error"])
                )
            )
        rows.append(f"| {name} | {r.get('input', '—')} | {r.get('output', '—')} | {reduce} | {grad} |")
    return "\n".join(rows) + "\n" + ("\n" + "\n".join(notes) + "\n" if notes else "")


def offload_table(report: dict, lang: str) -> str:
    off = report["offload"]
    world = report["world_size"]
    big_local = BIG // 8
    rows = [
        tr(
            lang,
            f"| CPU offload, per rank and step | MiniGPT, {world} ranks | 10⁹ parameters, 8 ranks (on paper) |",
            f"| descarga a la CPU, por rank y paso | MiniGPT, {world} ranks | 10⁹ parámetros, 8 ranks (sobre el papel) |",
        ),
        "| --- | ---: | ---: |",
        tr(lang, "| bytes to the device before the all-gathers |", "| bytes al dispositivo antes de los all-gather |")
        + f" {num(off['bytes_to_device_per_step'], lang)} | {num(4 * big_local, lang)} |",
        tr(
            lang,
            "| bytes back to the host after the reduce-scatters |",
            "| bytes de vuelta al host tras los reduce-scatter |",
        )
        + f" {num(off['bytes_to_host_per_step'], lang)} | {num(4 * big_local, lang)} |",
        tr(
            lang,
            "| time of each direction over PCIe 4.0 x16 (25 GB/s nominal) |",
            "| tiempo de cada sentido por PCIe 4.0 x16 (25 GB/s nominales) |",
        )
        + f" {num(off['bytes_to_device_per_step'] / PCIE_BYTES_PER_S * 1e3, lang, 3)} ms"
        + f" | {num(4 * big_local / PCIE_BYTES_PER_S * 1e3, lang, 1)} ms |",
        tr(
            lang,
            "| device memory freed (shards of parameters, gradients, AdamW's two moments) |",
            "| memoria del dispositivo liberada (fragmentos de parámetros, gradientes y los dos momentos de AdamW) |",
        )
        + f" {num(off['device_bytes_saved'], lang)} | {num(16 * big_local, lang)} |",
        "",
        tr(
            lang, "`CPUOffloadPolicy` on this machine ({d}): {t}.", "`CPUOffloadPolicy` en esta máquina ({d}): {t}."
        ).format(d=off["device"], t=tr(lang, "it ran", "funcionó") if off["tried"] == "ran" else _error(off["tried"])),
    ]
    return "\n".join(rows) + "\n"


MTBFS = ((3600, "1 hour", "1 hora"), (86400, "1 day", "1 día"), (7 * 86400, "1 week", "1 semana"))
# on paper: a 7B model's training state (16 bytes per parameter) written at 10 GB/s, a job that fails every 6 h
PAPER_SAVE = (7e9 * 16 / 10e9, 6 * 3600)


def checkpoint_table(report: dict, lang: str) -> str:
    """Young's interval from the measured step and save, for three mean times between failures."""
    ck = report["checkpoint"]
    step, save = ck["step_seconds"], ck["save_seconds"]
    rows = [
        tr(
            lang,
            f"A step takes {num(step * 1e3, lang)} ms; a sharded save of the training state "
            f"({num(ck['checkpoint_bytes'], lang)} bytes on disk) {num(save * 1e3, lang)} ms.",
            f"Un paso tarda {num(step * 1e3, lang)} ms; un guardado fragmentado del estado de entrenamiento "
            f"({num(ck['checkpoint_bytes'], lang)} bytes en disco), {num(save * 1e3, lang)} ms.",
        ),
        "",
        tr(
            lang,
            "| mean time between failures | Young's interval √(2δM) | in steps | time lost (saving + redoing) |",
            "| tiempo medio entre fallos | intervalo de Young √(2δM) | en pasos | tiempo perdido (guardar + rehacer) |",
        ),
        "| --- | ---: | ---: | ---: |",
    ]
    for mtbf, en, es in MTBFS:
        tau, lost = young_interval(save, mtbf)
        rows.append(f"| {tr(lang, en, es)} | {num(tau, lang)} s | {num(tau / step, lang)} | {pct(lost, lang, 2)} |")
    tau, lost = young_interval(*PAPER_SAVE)
    rows.append(
        tr(
            lang,
            f"| 6 hours, a 7B model on paper (δ = {num(PAPER_SAVE[0], lang, 1)} s: 112 GB at 10 GB/s) |",
            f"| 6 horas, un modelo de 7B sobre el papel (δ = {num(PAPER_SAVE[0], lang, 1)} s: 112 GB a 10 GB/s) |",
        )
        + f" {num(tau, lang)} s | — | {pct(lost, lang, 2)} |"
    )
    return "\n".join(rows) + "\n"


def export_table(report: dict, lang: str) -> str:
    ex = report["export"]
    yes, no = tr(lang, "yes", "sí"), "no"
    rows = [
        tr(lang, "| safetensors | |", "| safetensors | |"),
        "| --- | --- |",
        tr(lang, "| `save_file(model.state_dict())` |", "| `save_file(model.state_dict())` |")
        + f" {_error(ex['save_file'])} |",
        tr(lang, "| `save_model(model)`: tensors stored |", "| `save_model(model)`: tensores guardados |")
        + tr(
            lang,
            f" {ex['stored_tensors']} of {ex['state_dict_names']} names",
            f" {ex['stored_tensors']} de {ex['state_dict_names']} nombres",
        )
        + " |",
        tr(lang, "| the tied matrix stored as |", "| la matriz compartida, guardada como |")
        + " "
        + ", ".join(f"`{n}`" for n in ex["tied_stored_as"])
        + " |",
        tr(lang, "| file |", "| archivo |") + f" {num(ex['file_bytes'], lang)} bytes |",
        tr(
            lang,
            "| `load_model` into a new MiniGPT: missing, unexpected |",
            "| `load_model` en un MiniGPT nuevo: faltan, sobran |",
        )
        + f" {len(ex['missing'])}, {len(ex['unexpected'])} |",
        tr(
            lang,
            "| its logits equal the sharded model's, bit for bit |",
            "| sus logits iguales a los del modelo fragmentado, bit a bit |",
        )
        + f" {yes if ex['identical_logits'] else no} |",
    ]
    return "\n".join(rows) + "\n"


def tables(report: dict, lang: str) -> dict[str, str]:
    return {
        "optimizer": optimizer_table(report, lang),
        "precedence": precedence_table(report, lang),
        "offload": offload_table(report, lang),
        "checkpoint": checkpoint_table(report, lang),
        "export": export_table(report, lang),
    }


def render(json_path: str | Path) -> list[Path]:
    """Write ``03-options-{optimizer,precedence,offload,checkpoint,export}-{en,es}.txt`` beside the JSON; return the paths."""
    path = Path(json_path)
    report = json.loads(path.read_text())
    written = []
    for lang in LANGS:
        for part, text in tables(report, lang).items():
            target = path.parent / f"03-options-{part}-{lang}.txt"
            target.write_text(text)
            written.append(target)
    return written


def budgets_table(report: dict, lang: str) -> str:
    """``lab/03_compile_budget.py``'s run: per budget, the first step, the peaks and the median step."""
    rows = [
        tr(
            lang,
            "| `activation_memory_budget` | first step, compiling (s) | forward's peak | whole step's peak | step (ms) |",
            "| `activation_memory_budget` | primer paso, compilando (s) | pico de la pasada hacia delante "
            "| pico del paso entero | paso (ms) |",
        ),
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in report["budgets"]:
        rows.append(
            f"| {num(r['budget'], lang, 1)} | {num(r['first_step_seconds'], lang, 1)} | "
            f"{num(r['forward_peak_bytes'], lang)} B | {num(r['step_peak_bytes'], lang)} B | "
            f"{num(r['step_seconds'] * 1e3, lang)} |"
        )
    return "\n".join(rows) + "\n"
