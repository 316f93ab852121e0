"""The tables of Lab 02's "when sharding pays" (``lab/02_crosscheck.py --sizes``), for the console and,
in English and Spanish, for the lab page (``lab/results/02-sharding-pays-cpu-{en,es}.txt``).

Two tables: what each stage sends and holds at each width, beside :mod:`minigpt.zero.exact`'s
prediction, with the peak of all tensors and the seconds per step; then the decision drawn from
it: for a per-rank budget of model states, the stage that fits and sends the fewest bytes.

    python lab/02_crosscheck.py --render lab/results/02-sharding-pays-cpu.json
"""

from __future__ import annotations

from minigpt.pages.lang import num, size, table, tr

RUNS = {
    "ddp": ("DDP: Lab 01's, ring", "DDP: la del laboratorio 01, en anillo"),
    "zero1": ("ZeRO-1: the ZeRO-1 optimizer", "ZeRO-1: el optimizador ZeRO-1"),
    "fsdp2-no-reshard": ("ZeRO-2: FSDP2, reshard_after_forward=False", "ZeRO-2: FSDP2, reshard_after_forward=False"),
    "fsdp2": ("ZeRO-3: FSDP2 (fully_shard)", "ZeRO-3: FSDP2 (fully_shard)"),
}
STAGE = {0: "DDP", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3"}


def width(entry: dict, lang: str) -> str:
    return f"{entry['n_embd']} (Ψ = {num(entry['params'], lang)})"


def need(r: dict) -> int:
    """The model states a rank must hold room for: the fullest of the step's census points."""
    return max(r["model_states"]["end_of_forward"], r["model_states"]["after_step"])


def ms(seconds: float, lang: str) -> str:
    return num(1e3 * seconds, lang, 1) + " ms"


def measurement(report: dict, lang: str) -> str:
    head = [
        tr(lang, "n_embd (parameters)", "n_embd (parámetros)"),
        tr(lang, "stage: run", "etapa: ejecución"),
        tr(lang, "bytes sent per rank per step", "bytes enviados por rank y paso"),
        tr(lang, "model", "modelo"),
        tr(lang, "model states at the end of forward", "estados del modelo al final de la pasada hacia delante"),
        tr(lang, "model", "modelo"),
        tr(lang, "model states after the step", "estados del modelo tras el paso"),
        tr(lang, "model", "modelo"),
        tr(lang, "peak of all tensors in the step", "pico de todos los tensores en el paso"),
        tr(lang, "seconds per step (median)", "segundos por paso (mediana)"),
    ]
    rows = []
    for entry in report["sizes"].values():
        for name, r in entry["stages"].items():
            held, pred = r["model_states"], r["prediction"]
            rows.append(
                [
                    width(entry, lang),
                    tr(lang, *RUNS[name]),
                    num(r["bytes_sent_per_step"], lang),
                    num(pred["bytes"], lang),
                    num(held["end_of_forward"], lang),
                    num(pred["end_of_forward"], lang),
                    num(held["after_step"], lang),
                    num(pred["after_step"], lang),
                    size(r["peak_all_tensors"], lang, 2, "MB"),
                    ms(r["seconds_per_step"], lang),
                ]
            )
    return table(head, rows, left=2)


def decision_rows(entry: dict) -> list[tuple[int | None, int | None, str | None]]:
    """(lowest budget, next stage's need or None, run) for each budget band of one width, the largest
    budget first: the stage that fits in the band and sends the fewest bytes (then the lower stage);
    the last band, below every stage's need, has no run."""
    stages = entry["stages"]
    bands, upper = [], None
    for budget in sorted({need(r) for r in stages.values()}, reverse=True):
        fits = [name for name, r in stages.items() if need(r) <= budget]
        best = min(fits, key=lambda name: (stages[name]["bytes_sent_per_step"], stages[name]["stage"]))
        if bands and bands[-1][2] == best:
            bands[-1] = (budget, bands[-1][1], best)  # the same choice: widen its band
        else:
            bands.append((budget, upper, best))
        upper = budget
    return [*bands, (None, upper, None)]


def decision(report: dict, lang: str) -> str:
    head = [
        tr(lang, "n_embd (parameters)", "n_embd (parámetros)"),
        tr(lang, "budget for model states per rank", "presupuesto para estados del modelo por rank"),
        tr(lang, "the cheapest stage that fits", "la etapa más barata que cabe"),
        tr(lang, "bytes sent per step", "bytes enviados por paso"),
        tr(lang, "against DDP", "frente a DDP"),
        tr(lang, "seconds per step", "segundos por paso"),
        tr(lang, "against DDP", "frente a DDP"),
    ]
    rows = []
    for entry in report["sizes"].values():
        ddp = entry["stages"]["ddp"]
        for low, high, name in decision_rows(entry):
            if low is None:
                band = tr(lang, f"below {size(high, lang, 2, 'MB')}", f"menos de {size(high, lang, 2, 'MB')}")
            elif high is None:
                band = tr(lang, f"{size(low, lang, 2, 'MB')} or more", f"{size(low, lang, 2, 'MB')} o más")
            else:
                band = tr(lang, "from ", "de ") + size(low, lang, 2, "MB") + tr(lang, " to ", " a ")
                band += size(high, lang, 2, "MB")
            if name is None:
                none = tr(
                    lang,
                    "none: CPU offload, activation checkpointing, TP or PP",
                    "ninguna: descarga a la CPU, recálculo de activaciones, TP o PP",
                )
                rows.append([width(entry, lang), band, none, "", "", "", ""])
                continue
            r = entry["stages"][name]
            rows.append(
                [
                    width(entry, lang),
                    band,
                    STAGE[r["stage"]],
                    num(r["bytes_sent_per_step"], lang),
                    num(r["bytes_sent_per_step"] / ddp["bytes_sent_per_step"], lang, 3) + "×",
                    ms(r["seconds_per_step"], lang),
                    num(r["seconds_per_step"] / ddp["seconds_per_step"], lang, 2) + "×",
                ]
            )
    return table(head, rows, left=3)


def fragment(report: dict, lang: str) -> str:
    """Both tables, each a section the page includes on its own (``...-en.txt:measured``, ``:decision``)."""
    return "\n".join(
        f"<!-- --8<-- [start:{name}] -->\n{text}<!-- --8<-- [end:{name}] -->\n"
        for name, text in (
            ("measured", measurement(report, lang) + "\n" + note(report, lang)),
            ("decision", decision(report, lang)),
        )
    )


def note(report: dict, lang: str) -> str:
    """Where and when: the line under the measurement."""
    timed, ranks = report["timed_steps"], report["world_size"]
    return tr(
        lang,
        f"Measured {report['date']} with torch {report['torch']} ({report['backend']}, {report['device']}), "
        f"{ranks} ranks; the seconds are the median of {timed} steps, rank 0's.\n",
        f"Medido el {report['date']} con torch {report['torch']} ({report['backend']}, {report['device']}), "
        f"{ranks} ranks; los segundos son la mediana de {timed} pasos, los del rank 0.\n",
    )


def console_table(report: dict) -> str:
    exact = {True: "every byte as the model says", False: "NOT the model's bytes"}[report["criterion_pass"]]
    head = (
        f"when sharding pays: world size {report['world_size']} ({report['backend']}, {report['device']}), "
        f"{report['steps']} steps per run, the median of {report['timed_steps']}; {exact}"
    )
    return "\n".join([head, measurement(report, "en"), decision(report, "en")])
