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


# ----------------------------------------------------------------------------------------------
# Numbers the page states, worked out from the model's shapes, and the page's figures

FIGURE_TP = 2  # the figures draw the lab's default: 2 ranks


def sequence_parallel_grad_floats(cfg=None) -> int:
    """How many numbers ``TPMiniGPT.sync_sequence_parallel_grads`` all-reduces once per step under
    sequence parallelism: every parameter that stays whole on each rank but sees only this rank's
    tokens (the position embedding, every layer norm's weight and bias, the row-parallel biases:
    the MLP's output projection; attention's has no bias). The same for any ``tp``."""
    from minigpt.model import GPTConfig, MiniGPT

    model = MiniGPT(cfg or GPTConfig())
    params = [model.wpe.weight, *model.ln_f.parameters()]
    for b in model.blocks:
        params += [*b.ln_1.parameters(), *b.ln_2.parameters()]
        params += [p for p in (b.attn.proj.bias, b.mlp.proj.bias) if p is not None]
    return sum(p.numel() for p in params)


def sequence_parallel_grad_bytes_sent(tp: int, cfg=None, element_size: int = 4) -> int:
    """What one rank sends for that all-reduce on ``tp`` ranks: a ring's 2 (tp-1)/tp of the buffer."""
    return 2 * (tp - 1) * sequence_parallel_grad_floats(cfg) * element_size // tp


def mlp_shapes(tp: int = FIGURE_TP, cfg=None) -> dict:
    """The shapes one rank holds of a block's MLP cut over ``tp`` ranks, from the code that cuts it
    (:func:`~minigpt.parallel.tensor_parallel.layers.column_slice` and ``row_slice``)."""
    from minigpt.model import GPTConfig, MiniGPT
    from minigpt.parallel.tensor_parallel.layers import column_slice, row_slice

    cfg = cfg or GPTConfig()
    mlp = MiniGPT(cfg).blocks[0].mlp
    fc_w, fc_b = column_slice(mlp.fc.weight, mlp.fc.bias, tp, 0)
    proj_w, proj_b = row_slice(mlp.proj.weight, mlp.proj.bias, tp, 0)
    return {
        "C": cfg.n_embd,
        "hidden": mlp.fc.weight.shape[0],
        "fc_weight": tuple(fc_w.shape),
        "fc_bias": fc_b.shape[0],
        "proj_weight": tuple(proj_w.shape),
        "proj_bias": proj_b.shape[0],
    }


def vocab_columns(tp: int = FIGURE_TP, cfg=None) -> list[tuple[int, int]]:
    """Each rank's columns ``[start, stop)`` of the padded vocabulary, and so of the logits: the
    vocabulary-parallel loss keeps only these, ``padded / tp`` of them."""
    from minigpt.model import GPTConfig
    from minigpt.parallel.tensor_parallel.layers import padded_vocab_size

    padded = padded_vocab_size((cfg or GPTConfig()).vocab_size, tp)
    per = padded // tp
    return [(r * per, (r + 1) * per) for r in range(tp)]


def ring_scores(seq_len: int, cp: int, load_balanced: bool) -> dict:
    """Ring attention's causal mask, block pair by block pair, from the mechanism's own
    :func:`~minigpt.parallel.tensor_parallel.ring_attention.positions` and ``block_mask``.

    ``owner[q]``: the rank holding query position ``q``; ``cell[q][k]``: 2 where query q sees key k
    (a score needed), 1 where the pair of blocks holding them is computed although q may not see k,
    0 where the pair is skipped (all its keys come after all its queries); ``needed`` and
    ``computed``: the scores per rank (per query head and sequence), the lab's "scores needed" and
    "scores computed" columns."""
    from minigpt.parallel.tensor_parallel.ring_attention import block_mask, positions

    pos = [positions(seq_len, cp, r, load_balanced) for r in range(cp)]
    owner = [0] * seq_len
    cell = [[0] * seq_len for _ in range(seq_len)]
    needed, computed = [0] * cp, [0] * cp
    for r in range(cp):
        for q in pos[r].tolist():
            owner[q] = r
        for s in range(cp):
            mask = block_mask(pos[r], pos[s])
            if not bool(mask.any()):
                continue  # the pair is skipped
            computed[r] += mask.numel()
            needed[r] += int(mask.sum())
            for i, q in enumerate(pos[r].tolist()):
                for j, k in enumerate(pos[s].tolist()):
                    cell[q][k] = 2 if bool(mask[i, j]) else 1
    return {"owner": owner, "cell": cell, "needed": needed, "computed": computed}


RANK_COLORS = ("#4C72B0", "#DD8452", "#55A868", "#C44E52")


def _lighter(color: str, amount: float) -> tuple[float, float, float]:
    from matplotlib.colors import to_rgb

    return tuple(1 - amount * (1 - c) for c in to_rgb(color))


def _save(fig, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight", pad_inches=0.08, metadata={"Software": None})


def plot_ring_masks(path: Path, lang: str, seq_len: int = 32, cp: int = 4) -> None:
    """The causal mask of a sequence of ``seq_len`` tokens cut over ``cp`` ranks, contiguous and
    load-balanced: each row a query, each column a key, coloured by the rank that holds the query."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    fig = Figure(figsize=(7.8, 5.8))
    axes = fig.subplots(1, 2)
    for ax, balanced in zip(axes, (False, True)):
        found = ring_scores(seq_len, cp, balanced)
        image = [
            [
                (1, 1, 1) if state == 0 else _lighter(RANK_COLORS[found["owner"][q]], 0.25 if state == 1 else 1.0)
                for state in found["cell"][q]
            ]
            for q in range(seq_len)
        ]
        ax.imshow(image, interpolation="nearest", extent=(0, seq_len, seq_len, 0))
        chunk = seq_len // (2 * cp if balanced else cp)
        for edge in range(0, seq_len + 1, chunk):
            ax.axhline(edge, color="#999999", linewidth=0.5)
            ax.axvline(edge, color="#999999", linewidth=0.5)
        ax.set_xticks(range(0, seq_len + 1, chunk))
        ax.set_yticks(range(0, seq_len + 1, chunk))
        ax.tick_params(labelsize=7)
        ax.set_xlabel(tr(lang, "key position", "posición de la clave"), fontsize=8)
        ax.set_ylabel(tr(lang, "query position", "posición de la consulta"), fontsize=8)
        title = (
            tr(lang, "load-balanced: chunks r and 2cp−1−r", "equilibrada: trozos r y 2cp−1−r")
            if balanced
            else tr(lang, "contiguous: one slice per rank", "contigua: una parte por rank")
        )
        ax.set_title(title, fontsize=9.5)
        lines = [
            tr(lang, f"rank {r}: {n} needed, {c} computed", f"rank {r}: {n} necesarias, {c} calculadas")
            for r, (n, c) in enumerate(zip(found["needed"], found["computed"]))
        ]
        ax.text(0.0, -0.12, "\n".join(lines), transform=ax.transAxes, va="top", fontsize=8, family="monospace")
    fig.legend(
        handles=[
            *[
                Patch(
                    color=c, label=tr(lang, f"rank {r}'s query sees the key", f"la consulta del rank {r} ve la clave")
                )
                for r, c in enumerate(RANK_COLORS[:cp])
            ],
            Patch(
                color=_lighter(RANK_COLORS[0], 0.25), label=tr(lang, "computed, then masked", "calculada y enmascarada")
            ),
            Patch(
                facecolor="white", edgecolor="#999999", label=tr(lang, "block pair skipped", "par de bloques omitido")
            ),
        ],
        loc="lower center",
        ncol=3,
        fontsize=8,
        frameon=False,
    )
    fig.suptitle(
        tr(
            lang,
            f"Ring attention on {cp} ranks, T = {seq_len}: scores per query head and sequence",
            f"Atención en anillo en {cp} ranks, T = {seq_len}: puntuaciones por cabeza y secuencia",
        ),
        fontsize=10,
    )
    fig.subplots_adjust(top=0.90, bottom=0.33, wspace=0.25, left=0.07, right=0.97)
    _save(fig, path)


def _box(ax, x, y, w, h, text, color, fontsize=8, text_color="black", fill=None) -> None:
    from matplotlib.patches import FancyBboxPatch

    ax.add_patch(
        FancyBboxPatch(
            (x, y),
            w,
            h,
            boxstyle="round,pad=0.02,rounding_size=0.08",
            facecolor=fill if fill is not None else _lighter(color, 0.2),
            edgecolor=color,
            linewidth=1.3,
        )
    )
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize, color=text_color)


def _arrow(ax, start, end, color="#555555", rad=0.0) -> None:
    ax.annotate(
        "",
        xy=end,
        xytext=start,
        arrowprops={"arrowstyle": "->", "color": color, "linewidth": 1.1, "connectionstyle": f"arc3,rad={rad}"},
    )


def plot_tp_mlp(path: Path, lang: str) -> None:
    """A block's MLP cut over two ranks: f, the column-parallel fc (rank r's output features), GeLU,
    the row-parallel proj (the matching input features), g, and the bias added once."""
    from matplotlib.figure import Figure

    s = mlp_shapes()
    tp, C, hidden = FIGURE_TP, s["C"], s["hidden"]
    per = s["fc_weight"][0]
    fig = Figure(figsize=(8.4, 3.9))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 4.4)
    ax.axis("off")
    grey, f_color, g_color = "#555555", "#8172B3", "#937860"
    _box(ax, 0.15, 1.85, 1.05, 0.7, f"X\n(B, T, {C})", grey)
    _box(ax, 1.55, 1.85, 0.55, 0.7, "f", f_color, fontsize=13)
    ax.text(
        1.0,
        1.6,
        tr(lang, "forward: identity\nbackward: all-reduce", "hacia delante: identidad\nhacia atrás: all-reduce"),
        ha="center",
        va="top",
        fontsize=7.5,
        color=f_color,
    )
    lanes = {r: 3.15 - 2.2 * r for r in range(tp)}
    for r, y in lanes.items():
        color = RANK_COLORS[r]
        ax.text(2.45, y + 0.78, tr(lang, f"rank {r}", f"rank {r}"), fontsize=9, color=color, fontweight="bold")
        _box(
            ax,
            2.45,
            y,
            1.95,
            0.7,
            tr(
                lang,
                f"fc, column-parallel\nfeatures {r * per}–{(r + 1) * per - 1} of {hidden}\nW {s['fc_weight'][0]} × {s['fc_weight'][1]}, b {s['fc_bias']}",
                f"fc, paralela por columnas\nsalidas {r * per}–{(r + 1) * per - 1} de {hidden}\nW {s['fc_weight'][0]} × {s['fc_weight'][1]}, b {s['fc_bias']}",
            ),
            color,
            fontsize=7.5,
        )
        _box(ax, 4.6, y + 0.1, 0.7, 0.5, "GeLU", color, fontsize=8)
        _box(
            ax,
            5.5,
            y,
            1.95,
            0.7,
            tr(
                lang,
                f"proj, row-parallel\nthe same {per} input features\nW {s['proj_weight'][0]} × {s['proj_weight'][1]}",
                f"proj, paralela por filas\nlas mismas {per} entradas\nW {s['proj_weight'][0]} × {s['proj_weight'][1]}",
            ),
            color,
            fontsize=7.5,
        )
        ax.text(7.55, y + 0.35, f"$Z_{r}$\n(B, T, {C})", ha="left", va="center", fontsize=8, color=color)
        _arrow(ax, (2.1, 2.2), (2.45, y + 0.35), rad=0.0)
        _arrow(ax, (4.4, y + 0.35), (4.6, y + 0.35))
        _arrow(ax, (5.3, y + 0.35), (5.5, y + 0.35))
        _arrow(ax, (8.2, y + 0.35), (8.5, 2.2))
    _arrow(ax, (1.2, 2.2), (1.55, 2.2))
    _box(ax, 8.5, 1.85, 0.55, 0.7, "g", g_color, fontsize=13)
    ax.text(
        8.9,
        1.55,
        tr(
            lang,
            "forward:\nall-reduce (sum)\nbackward: identity",
            "hacia delante:\nall-reduce (suma)\nhacia atrás: identidad",
        ),
        ha="center",
        va="top",
        fontsize=7.5,
        color=g_color,
    )
    _arrow(ax, (9.05, 2.2), (9.2, 2.2))
    ax.text(
        9.22,
        2.2,
        tr(lang, f"+ b ({s['proj_bias']}),\nonce\n= Z", f"+ b ({s['proj_bias']}),\nuna vez\n= Z"),
        ha="left",
        va="center",
        fontsize=7.5,
    )
    ax.text(
        5.0,
        0.12,
        tr(
            lang,
            f"MiniGPT's MLP, $Z = \\mathrm{{GeLU}}(XA)\\,B$, on {tp} ranks. Each rank computes its $Z_r$ alone; the sum "
            "over ranks is g's all-reduce in forward, f's in backward.",
            f"El MLP de MiniGPT, $Z = \\mathrm{{GeLU}}(XA)\\,B$, en {tp} ranks. Cada rank calcula su $Z_r$ por su cuenta; "
            "la suma entre ranks es el all-reduce de g hacia delante y el de f hacia atrás.",
        ),
        ha="center",
        va="bottom",
        fontsize=8.5,
    )
    _save(fig, path)


def plot_vocab_loss(path: Path, lang: str) -> None:
    """The vocabulary-parallel loss on two ranks: each keeps only its columns of the logits, and
    three numbers per token cross the ranks, in two all-reduces."""
    from matplotlib.figure import Figure

    from minigpt.model import GPTConfig

    vocab = GPTConfig().vocab_size
    columns = vocab_columns()
    fig = Figure(figsize=(8.4, 3.5))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 3.9)
    ax.axis("off")
    ar = "#937860"
    lanes = {r: 2.75 - 1.5 * r for r in range(len(columns))}
    mid = (lanes[0] + lanes[1]) / 2 + 0.35
    for r, (start, stop) in enumerate(columns):
        y, color = lanes[r], RANK_COLORS[r]
        padding = max(0, stop - vocab)
        words = tr(
            lang,
            f"rank {r}: logits, columns {start}–{stop - 1}\n(B, T, {stop - start})"
            + (f", {padding} of padding" if padding else ""),
            f"rank {r}: logits, columnas {start}–{stop - 1}\n(B, T, {stop - start})"
            + (f", {padding} de relleno" if padding else ""),
        )
        _box(ax, 0.1, y, 2.45, 0.7, words, color, fontsize=7.5)
        _box(
            ax,
            2.8,
            y + 0.05,
            1.45,
            0.6,
            tr(lang, "row maximum\n(B, T)", "máximo por fila\n(B, T)"),
            color,
            fontsize=7.5,
        )
        _box(
            ax,
            5.4,
            y + 0.05,
            2.6,
            0.6,
            tr(
                lang,
                "Σ exp(z − m) on its columns;\nz_t − m if the target t is here, else 0",
                "Σ exp(z − m) en sus columnas;\nz_t − m si el objetivo t está aquí, si no 0",
            ),
            color,
            fontsize=7.5,
        )
        _arrow(ax, (2.55, y + 0.35), (2.8, y + 0.35))
        _arrow(ax, (4.25, y + 0.35), (4.5, mid), color=ar)
        _arrow(ax, (5.15, mid), (5.4, y + 0.35), color=ar)
        _arrow(ax, (8.0, y + 0.35), (8.2, mid), color=ar)
    _box(
        ax, 4.5, mid - 0.3, 0.65, 0.6, tr(lang, "all-\nreduce\nmax", "all-\nreduce\nmáx."), ar, fontsize=7, fill="white"
    )
    _box(
        ax, 8.2, mid - 0.3, 0.65, 0.6, tr(lang, "all-\nreduce\nsum", "all-\nreduce\nsuma"), ar, fontsize=7, fill="white"
    )
    ax.text(4.83, mid - 0.38, "m", ha="center", va="top", fontsize=8, color=ar)
    _arrow(ax, (8.85, mid), (9.0, mid), color=ar)
    ax.text(
        9.02,
        mid,
        tr(
            lang,
            "loss =\nlog Σ − (z_t − m)\non every rank",
            "pérdida =\nlog Σ − (z_t − m)\nen cada rank",
        ),
        ha="left",
        va="center",
        fontsize=7.5,
    )
    ax.text(
        5.0,
        0.08,
        tr(
            lang,
            "Two all-reduces: B·T numbers (the maximum m), then 2·B·T (the sum, the target's logit): 3·B·T in all, "
            "never B·T·V.\nBackward: softmax − onehot on this rank's columns, no communication.",
            "Dos all-reduce: B·T números (el máximo m) y después 2·B·T (la suma, el logit del objetivo): 3·B·T en "
            "total, nunca B·T·V.\nHacia atrás: softmax − onehot en las columnas de este rank, sin comunicación.",
        ),
        ha="center",
        va="bottom",
        fontsize=8.5,
    )
    _save(fig, path)


FIGURES = {"tp-mlp": plot_tp_mlp, "tp-vocab-loss": plot_vocab_loss, "ring-attention-masks": plot_ring_masks}
