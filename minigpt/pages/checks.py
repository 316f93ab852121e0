"""The tables of the checks themselves, in English and Spanish, one section per lab
(``--8<-- "lab/results/checks-times-cpu-en.txt:04"``): how long each default ``--check`` takes, its
rulers under each kernel set, its memory, and how long grading one exercise takes. From the JSON of
:mod:`minigpt.runners.checks`.

    python -m minigpt.runners.checks times --render lab/results/checks-times-cpu.json
"""

from __future__ import annotations

from pathlib import Path

from minigpt.pages.lang import num, sci, table, tr, write_tables

KERNEL_SET_NAMES = {
    "avx512": "avx512, AVX512, AVX512_CORE",
    "avx2": "avx2, AVX2, AVX2",
    "baseline": "default, SSE4_2, SSE41",
}


def _seconds(s: float, lang: str) -> str:
    minutes, rest = divmod(round(s), 60)
    return f"{minutes} min {rest:02d} s" if minutes else f"{rest} s"


def _machine(result: dict, lang: str, rows: list[dict] | None = None) -> str:
    """The machine line; a row measured again later (after a change to its lab) carries its own
    ``date``, and the section says every date its rows were measured on."""
    m = result["machine"]
    dates = sorted({r.get("date", m["date"]) for r in rows or []} or {m["date"]})
    when = " and ".join(dates) if lang == "en" else " y ".join(dates)
    return tr(
        lang,
        f"\nMeasured {when} on {m['cpu_model']}, {m['cores']} cores, Python {m['python']}, torch {m['torch']}.\n",
        f"\nMedido el {when} en {m['cpu_model']}, {m['cores']} núcleos, Python {m['python']}, torch {m['torch']}.\n",
    )


def _timed(r: dict, lang: str) -> list[str]:
    """A benchmark row's median and each of its runs."""
    return [_seconds(r["median_seconds"], lang), " · ".join(_seconds(x["seconds"], lang) for x in r["runs"])]


def _timed_table(result: dict, rows: list[dict], lang: str, heads: list[str], own, verdict, left: int) -> str:
    """A timed benchmark's table: the command (``heads[0]``), a column of its own (``heads[1]``,
    ``own(row)``), the median and each run, and the run's verdict (``heads[2]``, ``verdict(row)``)."""
    head = [
        heads[0],
        heads[1],
        tr(lang, f"median of {result['repeats']}", f"mediana de {result['repeats']}"),
        tr(lang, "each run", "cada ejecución"),
        heads[2],
    ]
    body = [[f"`{r['command']}`", own(r), *_timed(r, lang), verdict(r)] for r in rows]
    return table(head, body, left=left) + _machine(result, lang, rows)


def times(result: dict, rows: list[dict], lang: str) -> str:
    heads = [
        tr(lang, "default check (torchrun --standalone)", "comprobación por defecto (torchrun --standalone)"),
        tr(lang, "ranks", "ranks"),
        tr(lang, "passed", "pasó"),
    ]

    def passed(r: dict) -> str:
        return tr(lang, "yes", "sí") if all(x["exit"] == 0 for x in r["runs"]) else "**no**"

    return _timed_table(result, rows, lang, heads, lambda r: num(r["ranks"], lang), passed, left=1)


def kernel_sets(result: dict, rows: list[dict], lang: str) -> str:
    def value(x) -> str:
        return "—" if x is None else ("0" if x == 0 else sci(x, lang))

    body = [
        [
            f"`{r['command']}`",
            num(r["ranks"], lang),
            KERNEL_SET_NAMES[r["kernel_set"]],
            "PASS" if r["criterion_pass"] else "FAIL " + ", ".join(r["broken_rulers"]),
            value(r["fp64_max_step_drift"]),
            f"{value(r['fp32_first_step_logit_diff'])} / {value(r['fp32_first_step_grad_diff'])}",
            value(r["fp32_max_step_drift"]),
            value(r["pytorch_max_diff"]),
        ]
        for r in rows
    ]
    head = [
        tr(lang, "default check", "comprobación por defecto"),
        tr(lang, "ranks", "ranks"),
        tr(lang, "kernel set (ATen, MKL, oneDNN)", "conjunto de kernels (ATen, MKL, oneDNN)"),
        tr(lang, "verdict", "veredicto"),
        tr(lang, "float64 step drift", "deriva por paso en float64"),
        tr(lang, "first step: logits / gradients", "primer paso: logits / gradientes"),
        tr(lang, "float32 step drift", "deriva por paso en float32"),
        tr(lang, "difference from PyTorch's", "diferencia con la de PyTorch"),
    ]
    return table(head, body, left=3) + _machine(result, lang)


def memory(result: dict, rows: list[dict], lang: str) -> str:
    def gb(x: int) -> str:
        return num(x / 1e9, lang, 1) + " GB"

    body = [
        [
            f"`python {r['command']}`" if r["command"].startswith("-m ") else f"`{r['command']}`",
            num(r["ranks"], lang),
            gb(r["peak_total_bytes"]),
            num(round(r["peak_largest_process_bytes"] / 1e6), lang) + " MB",
        ]
        for r in rows
    ]
    head = [
        tr(lang, "default run (torchrun --standalone)", "ejecución por defecto (torchrun --standalone)"),
        tr(lang, "ranks", "ranks"),
        tr(lang, "memory, all processes at once", "memoria, todos los procesos a la vez"),
        tr(lang, "the largest process", "el proceso más grande"),
    ]
    return table(head, body, left=1) + _machine(result, lang, rows)


def grades(result: dict, rows: list[dict], lang: str) -> str:
    def code(r: dict) -> str:
        if r["name"] == "grade":
            return tr(lang, "the exercise, written", "el ejercicio, escrito")
        return tr(lang, "every lab, the untouched stubs", "todos los laboratorios, los esqueletos sin tocar")

    def score(r: dict) -> str:  # in bold when a run did not score what it must (runners/checks.py)
        points = " · ".join(f"{num(x['earned'], lang)}/{num(x['total'], lang)}" for x in r["runs"])
        return points if all(x["exit"] == 0 and x["as_expected"] for x in r["runs"]) else f"**{points}**"

    heads = [
        tr(lang, "grading", "calificación"),
        tr(lang, "the code graded", "el código calificado"),
        tr(lang, "points, each run", "puntos, cada ejecución"),
    ]
    return _timed_table(result, rows, lang, heads, code, score, left=2)


def fragment(result: dict, lang: str) -> str:
    section = {"times": times, "kernel-sets": kernel_sets, "memory": memory, "grades": grades}[result["what"]]
    labs = sorted({r["lab"] for r in result["rows"]})
    parts = [(lab, [r for r in result["rows"] if r["lab"] == lab]) for lab in labs]
    if result["what"] == "memory":  # the README's table: every lab
        parts.append(("all", result["rows"]))
    return "".join(
        f"<!-- --8<-- [start:{name}] -->\n{section(result, rows, lang)}<!-- --8<-- [end:{name}] -->\n"
        for name, rows in parts
    )


def render(json_path: str | Path) -> list[Path]:
    """``checks-<what>-cpu.json`` -> its ``-en.txt`` and ``-es.txt``."""
    return write_tables(json_path, fragment)
