"""The tables and the timeline of Lab 04 (our FSDP against one process and FSDP2), in English and
Spanish, for the lab page: ``lab/results/04-fsdp-cpu{,-4}-{en,es}.txt`` (sections the page
includes one by one: ``--8<-- "lab/results/04-fsdp-cpu-en.txt:proofs"``) and
``04-fsdp-cpu-timeline-{en,es}.png``.

    python lab/04_fsdp.py --render lab/results/04-fsdp-cpu.json
"""

from __future__ import annotations

import json
from pathlib import Path

from minigpt.pages import rulers
from minigpt.pages.lang import localize, num, sci, table, tr, yes

SETTING_NAMES = {
    "implicit": ("implicit (FSDP2's default)", "implícita (la de FSDP2)"),
    "forward prefetch 1": ("forward prefetch, 1 unit", "precarga en la pasada hacia delante, 1 unidad"),
    "backward prefetch 2": ("backward prefetch, 2 units", "precarga en la pasada hacia atrás, 2 unidades"),
    "no reshard after forward": ("no reshard after forward", "sin refragmentar tras la pasada hacia delante"),
}
RECIPE_NAMES = {
    "fp32": ("fp32", "fp32"),
    "bf16 params, fp32 reduce": ("bf16 compute, fp32 reduce", "cómputo bf16, reducción fp32"),
    "bf16 params, bf16 reduce": ("bf16 compute, bf16 reduce", "cómputo bf16, reducción bf16"),
}


def proofs(r: dict, lang: str) -> str:
    """The check's rulers (:mod:`minigpt.pages.rulers`)."""
    return rulers.table(r, lang)


def clipping(r: dict, lang: str) -> str:
    """How often the run clipped, and what the twin's own norm would have done (``--full``)."""
    t = r["training"]
    clipped = r["clipped_steps"]
    rows = [
        [
            tr(
                lang,
                f"steps whose gradient norm was above max_norm = 1 (clipped), of {r['fp32_steps']}",
                f"pasos cuya norma del gradiente superó max_norm = 1 (recortados), de {r['fp32_steps']}",
            ),
            f"{len(clipped)}: {_ranges(clipped)}",
        ],
        [
            tr(
                lang,
                "largest relative difference between our norm and one process's",
                "mayor diferencia relativa entre nuestra norma y la de un proceso",
            ),
            sci(r["fp32_norm_rel_diff"], lang),
        ],
        [
            tr(
                lang,
                "step drift, one process clipping with our norm (the criterion)",
                "deriva por paso, un proceso recortando con nuestra norma (el criterio)",
            ),
            f"{sci(r['fp32_max_step_drift'], lang)} ({tr(lang, 'step', 'paso')} {r['fp32_worst_step']})",
        ],
    ]
    if "fp32_max_step_drift_twin_own_norm" in r:
        own = t["step_drift_own_norm"]
        rows.append(
            [
                tr(
                    lang,
                    "step drift, one process clipping with its own norm (reported)",
                    "deriva por paso, un proceso recortando con su propia norma (informada)",
                ),
                f"{sci(own['max'], lang)} ({tr(lang, 'step', 'paso')} {own['worst_step']})",
            ]
        )
    head = [tr(lang, "clipping, measured", "recorte, medido"), tr(lang, "value", "valor")]
    return table(head, rows, left=1)


def _ranges(steps: list[int]) -> str:
    """[0, 1, 2, 5, 6, 9] -> "0-2, 5, 6, 9": runs of three or more joined."""
    out, i = [], 0
    while i < len(steps):
        j = i
        while j + 1 < len(steps) and steps[j + 1] == steps[j] + 1:
            j += 1
        if j - i >= 2:
            out.append(f"{steps[i]}-{steps[j]}")
        else:
            out += [str(s) for s in steps[i : j + 1]]
        i = j + 1
    return ", ".join(out)


def _gathers(schedule: list[str]) -> str:
    """ "R 0 1 2 3 \\| 3 2 1 0": the units all-gathered in forward \\| in backward (backward's
    begin after the last block's forward)."""
    last_forward = max(i for i, item in enumerate(schedule) if item.startswith("forward "))

    def names(items: list[str]) -> list[str]:
        units = [item.split(" ", 1)[1] for item in items if item.startswith("all-gather ")]
        return ["R" if u == "root" else u.split(".")[-1] for u in units]

    return " ".join([*names(schedule[:last_forward]), "\\|", *names(schedule[last_forward:])])


def _sci0(x: float, lang: str) -> str:
    return "0" if x == 0 else sci(x, lang)


def orders(r: dict, lang: str) -> str:
    rows = []
    for setting, o in r["orders"].items():
        en, es = SETTING_NAMES[setting]
        m = o["memory_model"]
        rows.append(
            [
                tr(lang, en, es),
                f"`{o['fsdp2_variant']}`",
                _gathers(o["schedule"]),
                yes(o["matches_fsdp2"], lang),
                num(o["bytes_sent"], lang),
                num(o["peak_held"], lang),
                num(m["peak"], lang),
                tr(
                    lang,
                    m["where"],
                    m["where"]
                    .replace("backward of block", "pasada hacia atrás del bloque")
                    .replace("forward", "forward")
                    .replace("end", "final"),
                ),
            ]
        )
    head = [
        tr(lang, "our setting", "nuestro ajuste"),
        tr(lang, "FSDP2 run (Lab 03)", "ejecución de FSDP2 (laboratorio 03)"),
        tr(lang, "all-gathers, forward \\| backward", "all-gathers, hacia delante \\| hacia atrás"),
        tr(lang, "order = FSDP2's", "orden = el de FSDP2"),
        tr(lang, "bytes per step", "bytes por paso"),
        tr(lang, "peak held (bytes)", "pico retenido (bytes)"),
        tr(lang, "model", "modelo"),
        tr(lang, "where", "dónde"),
    ]
    return table(head, rows, left=4)


def precision(r: dict, lang: str) -> str:
    rows = []
    mp, nc = r["mixed_precision"], r["without_clipping"]
    for name, m in mp["recipes"].items():
        en, es = RECIPE_NAMES[name]
        rows.append(
            [
                tr(lang, en, es),
                num(m["bytes_sent"], lang),
                num(m["bytes_model"], lang),
                sci(m["weight_drift"], lang),
                sci(m["fsdp2_weight_drift"], lang),
                _sci0(m["max_difference_from_fsdp2"], lang),
                yes(nc["recipes"][name]["bit_identical"], lang),
            ]
        )
    head = [
        tr(lang, "recipe", "receta"),
        tr(lang, "bytes per step", "bytes por paso"),
        tr(lang, "model", "modelo"),
        tr(
            lang,
            f"logit drift from fp32 one process, {mp['steps']} steps: ours",
            f"deriva de logits frente a un proceso fp32, {mp['steps']} pasos: el nuestro",
        ),
        "FSDP2",
        tr(lang, "ours − FSDP2, weights (clipping on)", "el nuestro − FSDP2, pesos (con recorte)"),
        tr(lang, "bit-identical to FSDP2 without clipping", "idéntico bit a bit a FSDP2 sin recorte"),
    ]
    return table(head, rows, left=1)


def overlap(step: dict) -> dict:
    """From a step's timeline: each asynchronous all-gather's issue, completion and whether the
    training thread had to wait for it; the seconds hidden behind computation."""
    issued: dict[str, list[float]] = {}
    for t, what, unit, _ in step["timeline"]:
        if what == "all-gather":
            issued.setdefault(unit, []).append(t)
    waited = {unit for _, what, unit, _ in step["timeline"] if what == "waiting"}
    hidden, items = 0.0, []
    for t_done, unit in step["completions"]:
        starts = [t for t in issued.get(unit, []) if t <= t_done]
        if not starts:
            continue
        start = max(starts)
        items.append({"unit": unit, "issued": start, "done": t_done, "waited": unit in waited})
        hidden += t_done - start
    return {"prefetches": items, "hidden_s": hidden}


def speed(r: dict, lang: str) -> str:
    s = r["speed"]
    ov = overlap(r["training"]["last_step"])
    rows = [
        [
            tr(lang, "seconds per step (median of rounds)", "segundos por paso (mediana de las rondas)"),
            num(s["median"]["ours"], lang, 4),
            num(s["median"]["fsdp2"], lang, 4),
            num(s["ratio"], lang, 2) + "×",
        ],
        [
            tr(
                lang,
                "prefetched all-gathers in the last step / the ones waited for",
                "all-gathers precargados en el último paso / los que hubo que esperar",
            ),
            f"{len(ov['prefetches'])} / {sum(p['waited'] for p in ov['prefetches'])}",
            "",
            "",
        ],
    ]
    head = [
        "",
        tr(lang, "ours", "el nuestro"),
        "FSDP2",
        tr(lang, "ours / FSDP2", "el nuestro / FSDP2"),
    ]
    note = tr(
        lang,
        f"{s['rounds']} interleaved rounds of {s['steps_per_round']} steps each, the order alternating.\n",
        f"{s['rounds']} rondas intercaladas de {s['steps_per_round']} pasos cada una, alternando el orden.\n",
    )
    return table(head, rows) + "\n" + note


def norms(r: dict, lang: str) -> str:
    n = r["norms"]
    rows = [
        [
            tr(
                lang,
                "ours: one all-reduce of each parameter's squared local norm",
                "la nuestra: un all-reduce de la norma local al cuadrado de cada parámetro",
            ),
            localize(repr(n["ours"]), lang),
        ],
        [
            tr(
                lang,
                "FSDP2: `clip_grad_norm_` on its sharded gradients",
                "FSDP2: `clip_grad_norm_` sobre sus gradientes fragmentados",
            ),
            localize(repr(n["fsdp2"]), lang),
        ],
        [
            tr(
                lang,
                "one all-reduce of one number: each rank's norm, squared",
                "un all-reduce de un solo número: la norma de cada rank, al cuadrado",
            ),
            localize(repr(n["one_number"]), lang),
        ],
    ]
    head = [
        tr(lang, "the gradient norm of the first step", "la norma del gradiente del primer paso"),
        tr(lang, "value (float32)", "valor (float32)"),
    ]
    return table(head, rows, left=1)


def one_number_run(r: dict, lang: str) -> str:
    """The whole training with the one-number norm (``--clip-norm one-number``): its drift."""
    t = r["training"]
    rows = [
        [
            tr(
                lang,
                "step drift, one process clipping with this run's norm (the criterion)",
                "deriva por paso, un proceso recortando con la norma de esta ejecución (el criterio)",
            ),
            f"{sci(r['fp32_max_step_drift'], lang)} ({tr(lang, 'step', 'paso')} {r['fp32_worst_step']})",
        ],
        [
            tr(
                lang,
                "largest relative difference between this norm and one process's",
                "mayor diferencia relativa entre esta norma y la de un proceso",
            ),
            sci(r["fp32_norm_rel_diff"], lang),
        ],
        [
            tr(
                lang,
                "largest weight difference from FSDP2 (per-parameter norm)",
                "mayor diferencia de pesos con FSDP2 (norma por parámetro)",
            ),
            _sci0(r["pytorch_max_diff"], lang),
        ],
    ]
    if "fp32_max_step_drift_twin_own_norm" in r:
        own = t["step_drift_own_norm"]
        rows.insert(
            1,
            [
                tr(
                    lang,
                    "step drift, one process clipping with its own norm (reported)",
                    "deriva por paso, un proceso recortando con su propia norma (informada)",
                ),
                f"{sci(own['max'], lang)} ({tr(lang, 'step', 'paso')} {own['worst_step']})",
            ],
        )
    head = [
        tr(
            lang,
            f"{t['steps']} AdamW steps, `--clip-norm one-number`",
            f"{t['steps']} pasos de AdamW, `--clip-norm one-number`",
        ),
        tr(lang, "measured", "medido"),
    ]
    return table(head, rows, left=1)


SECTIONS = {
    "proofs": proofs,
    "clipping": clipping,
    "norms": norms,
    "orders": orders,
    "precision": precision,
    "speed": speed,
}


def fragment(report: dict, lang: str) -> str:
    if report["training"].get("clip_norm") == "one-number":  # the variant run: its drift only
        return f"<!-- --8<-- [start:one-number] -->\n{one_number_run(report, lang)}<!-- --8<-- [end:one-number] -->\n"
    return "".join(
        f"<!-- --8<-- [start:{name}] -->\n{section(report, lang)}<!-- --8<-- [end:{name}] -->\n"
        for name, section in SECTIONS.items()
        if name != "speed" or "speed" in report
    )


def draw_timeline(report: dict, lang: str, path: Path) -> None:
    """Rank 0's last training step: computation lane (each block's forward and backward) and
    communication lane (each all-gather from issue to completion, each reduce-scatter)."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    step = report["training"]["last_step"]
    events = step["timeline"]
    end = max(t for t, *_ in events)
    fig = Figure(figsize=(10, 3.2))
    ax = fig.add_subplot()
    # the blocks' computations: the root's, which wraps them, has no span of its own to draw
    starts = [(t, what, unit) for t, what, unit, _ in events if what in ("forward", "backward") and unit != "root"]
    for t, what, unit in starts:
        stop = next((u for u, w, _, _ in events if u > t and w in ("freeing", "free")), end)
        color = "#4C72B0" if what == "forward" else "#DD8452"
        ax.broken_barh([(t * 1e3, (stop - t) * 1e3)], (1.1, 0.8), color=color)
        ax.text((t + stop) / 2 * 1e3, 1.5, unit.split(".")[-1], ha="center", va="center", fontsize=7, color="white")
    done_at = {}
    for t, unit in step["completions"]:
        done_at.setdefault(unit, []).append(t)
    is_async = iter([c["async"] for c in step["collectives"] if c["kind"] == "all-gather"])  # in issue order
    for t, what, unit, _ in events:
        if what == "all-gather":
            finished = [d for d in done_at.get(unit, []) if d >= t]
            gathered = next((u for u, w, n, _ in events if u >= t and w == "gathered" and n == unit), t)
            stop = min(finished) if next(is_async) and finished else gathered
            ax.broken_barh([(t * 1e3, max(stop - t, end * 0.002) * 1e3)], (0.1, 0.8), color="#55A868", alpha=0.8)
        if what == "reduce-scatter":
            ax.broken_barh([(t * 1e3, end * 0.004 * 1e3)], (0.1, 0.8), color="#C44E52")
    ax.set_yticks([0.5, 1.5], [tr(lang, "communication", "comunicación"), tr(lang, "computation", "cómputo")])
    ax.set_xlabel(
        tr(lang, "milliseconds since the step began (rank 0)", "milisegundos desde el inicio del paso (rank 0)")
    )
    ax.set_xlim(0, end * 1e3 * 1.01)
    ax.legend(
        handles=[
            Patch(color="#4C72B0", label=tr(lang, "forward of a block", "pasada hacia delante de un bloque")),
            Patch(color="#DD8452", label=tr(lang, "backward of a block", "pasada hacia atrás de un bloque")),
            Patch(
                color="#55A868", label=tr(lang, "all-gather, issue to completion", "all-gather, de la emisión al final")
            ),
            Patch(color="#C44E52", label=tr(lang, "reduce-scatter", "reduce-scatter")),
        ],
        loc="upper center",
        bbox_to_anchor=(0.5, -0.28),
        ncol=4,
        fontsize=8,
        frameon=False,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90, metadata={"Software": None})


def render(json_path: str | Path) -> list[Path]:
    """``X.json`` -> ``X-en.txt``, ``X-es.txt`` (the sections) and ``X-timeline-<lang>.png``."""
    json_path = Path(json_path)
    report = json.loads(json_path.read_text())
    written = []
    for lang in ("en", "es"):
        text = json_path.with_name(f"{json_path.stem}-{lang}.txt")
        text.write_text(fragment(report, lang))
        written.append(text)
        if report["training"].get("clip_norm") != "one-number":
            figure = json_path.with_name(f"{json_path.stem}-timeline-{lang}.png")
            draw_timeline(report, lang, figure)
            written.append(figure)
    return written


# ----------------------------------------------------------------------------------------------
# Our FSDP beside FSDP2's real code, located in the installed torch when the table is written

FSDP2 = "torch.distributed.fsdp._fully_shard."
SIDE_BY_SIDE = (
    (
        ("a parameter cut into padded row shards", "un parámetro cortado en fragmentos de filas con relleno"),
        "sharding:shard_rows",
        "_fsdp_param:FSDPParam._init_sharded_param",
    ),
    (
        ("which parameters a unit owns", "qué parámetros posee una unidad"),
        "ownership:unit_parameters",
        "_fsdp_init:_get_managed_states",
    ),
    (
        (
            "the gathered parameter, its storage freed and refilled",
            "el parámetro reunido, su almacenamiento liberado y rellenado",
        ),
        "unit:FSDPUnit.wait_unshard",
        "_fsdp_param:FSDPParam.init_unsharded_param",
    ),
    (
        ("one all-gather for the whole unit", "un all-gather para toda la unidad"),
        "unit:FSDPUnit.unshard",
        "_fsdp_collectives:foreach_all_gather",
    ),
    (("freeing the unit", "liberar la unidad"), "unit:FSDPUnit.reshard", "_fsdp_param_group:FSDPParamGroup.reshard"),
    (("pre-forward", "pre-forward"), "unit:FSDPUnit.pre_forward", "_fsdp_state:FSDPState._pre_forward"),
    (("post-forward", "post-forward"), "unit:FSDPUnit.post_forward", "_fsdp_state:FSDPState._post_forward"),
    (
        ("pre-backward: a hook on the outputs", "pre-backward: un hook en las salidas"),
        "unit:FSDPUnit.pre_backward",
        "_fsdp_state:FSDPState._register_pre_backward_hook",
    ),
    (
        ("post-backward: an identity on the inputs", "post-backward: una identidad en las entradas"),
        "unit:_PostBackward",
        "_fsdp_param_group:RegisterPostBackwardFunction",
    ),
    (
        (
            "after the last backward: freed, then reduce-scattered",
            "tras la última pasada hacia atrás: liberar y luego reduce-scatter",
        ),
        "unit:FSDPUnit.after_backward",
        "_fsdp_param_group:FSDPParamGroup.post_backward",
    ),
    (
        ("the reduce-scatter of a unit's gradients", "el reduce-scatter de los gradientes de una unidad"),
        "gradients:reduce_gradients",
        "_fsdp_collectives:foreach_reduce",
    ),
    (
        ("the end of backward, at the root", "el final de la pasada hacia atrás, en la raíz"),
        "unit:FSDPUnit._finish_backward",
        "_fsdp_state:FSDPState._root_post_backward_final_callback",
    ),
    (
        ("prefetching the next unit", "precargar la unidad siguiente"),
        "prefetch:backward_prefetch_targets",
        "_fsdp_param_group:FSDPParamGroup._prefetch_unshard",
    ),
    (
        ("explicit prefetch lists", "listas de precarga explícitas"),
        "api:set_modules_to_backward_prefetch",
        "_fully_shard:FSDPModule.set_modules_to_backward_prefetch",
    ),
)


def _locate(module: str, qualname: str) -> tuple[str, int]:
    import importlib
    import inspect

    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    obj = inspect.unwrap(obj)  # past decorators (no_grad, FSDP2's debug wrappers) to the function itself
    path = Path(inspect.getsourcefile(obj)).resolve()
    return path.as_posix(), inspect.getsourcelines(obj)[1]


def side_by_side(lang: str) -> str:
    """Each piece of our FSDP, and where the installed FSDP2 does the same (file and line)."""
    import torch

    torch_dir = Path(torch.__file__).resolve().parent.parent.as_posix() + "/"
    root = Path(__file__).resolve().parent.parent.parent.as_posix() + "/"
    rows = []
    for (en, es), mine, theirs in SIDE_BY_SIDE:
        m_mod, m_name = mine.split(":")
        t_mod, t_name = theirs.split(":")
        m_path, m_line = _locate(f"minigpt.parallel.fsdp_by_hand.{m_mod}", m_name)
        t_path, t_line = _locate(FSDP2 + t_mod, t_name)
        rows.append(
            [
                tr(lang, en, es),
                f"`{m_name}` (`{m_path.removeprefix(root)}:{m_line}`)",
                f"`{t_name}` (`{t_path.removeprefix(torch_dir)}:{t_line}`)",
            ]
        )
    head = [tr(lang, "what", "qué"), tr(lang, "ours", "el nuestro"), f"FSDP2 (torch {torch.__version__.split('+')[0]})"]
    return table(head, rows, left=3)


TABLES = {"fsdp-side-by-side": side_by_side}


# ----------------------------------------------------------------------------------------------
# A unit's life in one step, drawn from the recorded schedule of the committed run

RESULTS = Path(__file__).resolve().parents[2] / "lab" / "results"
UNIT_LIFE_REPORT = RESULTS / "04-fsdp-cpu.json"  # the run the page quotes: 2 ranks, the default settings


def unit_life(step: dict) -> dict:
    """What each unit did in one step, from a :class:`~minigpt.parallel.fsdp_by_hand.record.Step`
    as the report keeps it: its ``timeline``'s events of the schedule's kinds (the training thread's
    order; the root's forward and backward too, which the schedule leaves out) and its
    ``collectives`` (in issue order; an asynchronous all-gather is a prefetch).

    Returns ``units`` (the root first, then the blocks in forward order), ``events`` (each
    ``{"at", "what", "unit", "prefetch"}``, ``at`` its place in that order), ``gathered`` (unit ->
    the (from, to) places between an all-gather and the free that ends it), ``issued_by`` (a
    prefetched unit -> the unit whose pre-backward issued it: the one before it in backward order,
    :func:`~minigpt.parallel.fsdp_by_hand.prefetch.backward_prefetch_targets`) and ``backward_from``
    (the place of backward's first event)."""
    from minigpt.parallel.fsdp_by_hand.prefetch import backward_prefetch_targets

    asynchronous = iter([c["async"] for c in step["collectives"] if c["kind"] == "all-gather"])
    events = []
    for _, what, unit, _ in step["timeline"]:
        if what in LIFE_STYLE:
            prefetch = what == "all-gather" and next(asynchronous)
            events.append({"at": len(events), "what": what, "unit": unit, "prefetch": prefetch})
    blocks = list(dict.fromkeys(e["unit"] for e in events if e["what"] == "forward" and e["unit"] != "root"))
    units = ["root", *blocks]
    post_forward_order = [*blocks, "root"]  # the root's forward wraps every block's
    issued_by = {}
    for e in events:
        if e["prefetch"]:
            issued_by[e["unit"]] = next(
                u for u in units if e["unit"] in backward_prefetch_targets(post_forward_order, u)
            )
    gathered: dict[str, list[tuple[int, int]]] = {u: [] for u in units}
    start: dict[str, int] = {}
    for e in events:
        if e["what"] == "all-gather":
            start[e["unit"]] = e["at"]
        elif e["what"] == "free":
            gathered[e["unit"]].append((start.pop(e["unit"]), e["at"]))
    backward_from = next(e["at"] for e in events if e["what"] == "backward") - 1
    while events[backward_from - 1]["what"] == "all-gather":  # backward's gathers come before its first block
        backward_from -= 1
    return {
        "units": units,
        "events": events,
        "gathered": gathered,
        "issued_by": issued_by,
        "backward_from": backward_from,
    }


LIFE_STYLE = {  # what: (marker text, colour)
    "all-gather": ("AG", "#55A868"),
    "forward": ("F", "#4C72B0"),
    "backward": ("B", "#DD8452"),
    "free": ("×", "#7f7f7f"),
    "reduce-scatter": ("RS", "#C44E52"),
}


def _unit_label(unit: str, lang: str) -> str:
    return tr(lang, "root", "raíz") if unit == "root" else tr(lang, "block ", "bloque ") + unit.split(".")[-1]


def draw_unit_life(step: dict, lang: str, path: Path) -> None:
    """Each unit's row: gathered (a thick bar) or sharded (a thin line) along the schedule, its
    all-gathers, forward and backward, frees and reduce-scatter, and an arrow from the unit that
    issued each prefetch."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    life = unit_life(step)
    units, events = life["units"], life["events"]
    row = {u: i for i, u in enumerate(units)}
    n = len(events)
    fig = Figure(figsize=(8.2, 3.6))
    ax = fig.add_subplot()
    for unit, spans in life["gathered"].items():
        y = row[unit]
        ax.plot([-0.5, n - 0.5], [y, y], color="#cccccc", linewidth=1, zorder=1)
        for a, b in spans:
            ax.broken_barh([(a, b - a)], (y - 0.17, 0.34), color="#c6dbef", zorder=2)
    for e in events:
        text, color = LIFE_STYLE[e["what"]]
        y = row[e["unit"]]
        face = "white" if e["prefetch"] else color
        ax.text(
            e["at"],
            y,
            text,
            ha="center",
            va="center",
            fontsize=7.5,
            color=color if e["prefetch"] else "white",
            fontweight="bold",
            zorder=4,
            bbox={"boxstyle": "round,pad=0.25", "facecolor": face, "edgecolor": color, "linewidth": 1.3},
        )
        if e["prefetch"]:
            source = row[life["issued_by"][e["unit"]]]
            toward = 1 if source > y else -1  # rows grow downwards
            ax.annotate(
                "",
                xy=(e["at"] - 0.2, y + 0.24 * toward),
                xytext=(e["at"] - 1.0, source - 0.24 * toward),
                arrowprops={"arrowstyle": "->", "color": color, "linewidth": 1.2, "connectionstyle": "arc3,rad=0.25"},
                zorder=3,
            )
    split = life["backward_from"] - 0.5
    ax.axvline(split, color="#999999", linestyle="--", linewidth=1)
    top = -0.75
    ax.text(split / 2, top, tr(lang, "forward", "pasada hacia delante"), ha="center", va="bottom", fontsize=9)
    ax.text((split + n) / 2, top, tr(lang, "backward", "pasada hacia atrás"), ha="center", va="bottom", fontsize=9)
    ax.set_yticks(range(len(units)), [_unit_label(u, lang) for u in units])
    ax.set_ylim(len(units) - 0.4, -0.95)
    ax.set_xlim(-0.8, n - 0.2)
    ax.set_xticks([])
    ax.set_xlabel(
        tr(
            lang,
            "the events of one training step in the order they happened (rank 0), not to scale in time",
            "los eventos de un paso de entrenamiento en el orden en que ocurrieron (rank 0), sin escala de tiempo",
        ),
        fontsize=8.5,
    )
    for side in ("top", "right", "bottom"):
        ax.spines[side].set_visible(False)
    ax.legend(
        handles=[
            Patch(facecolor="#c6dbef", label=tr(lang, "gathered (whole)", "reunida (entera)")),
            Patch(color=LIFE_STYLE["all-gather"][1], label=tr(lang, "AG all-gather", "AG all-gather")),
            Patch(
                facecolor="white",
                edgecolor=LIFE_STYLE["all-gather"][1],
                label=tr(lang, "AG prefetched (arrow: who issued it)", "AG precargado (flecha: quién lo lanzó)"),
            ),
            Patch(color=LIFE_STYLE["forward"][1], label=tr(lang, "F forward", "F hacia delante")),
            Patch(color=LIFE_STYLE["backward"][1], label=tr(lang, "B backward", "B hacia atrás")),
            Line2D([], [], color=LIFE_STYLE["free"][1], marker="x", linestyle="", label=tr(lang, "freed", "liberada")),
            Patch(color=LIFE_STYLE["reduce-scatter"][1], label=tr(lang, "RS reduce-scatter", "RS reduce-scatter")),
        ],
        loc="upper center",
        bbox_to_anchor=(0.5, -0.16),
        ncol=4,
        fontsize=8,
        frameon=False,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight", pad_inches=0.08, metadata={"Software": None})


def plot_unit_life(path: Path, lang: str) -> None:
    """The figure of the page (``figures/fsdp-unit-life-<lang>.png``): the last training step of
    the committed 2-rank run."""
    report = json.loads(UNIT_LIFE_REPORT.read_text())
    draw_unit_life(report["training"]["last_step"], lang, path)


FIGURES = {"fsdp-unit-life": plot_unit_life}
