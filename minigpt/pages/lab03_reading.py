"""Lab 03's annotated reading laid out: for a terminal and as the site's Markdown fragment.

:mod:`minigpt.fsdp.reading` finds each note's line in the installed torch; this module shows the
lines around it with the file's own line numbers, and the notes in English or Spanish.

What is shown. For each function: its signature and a few lines around every anchored line (the
whole function when it is short), with the file's own line numbers, and the notes numbered in
reading order. The terminal version (:func:`render_terminal`) marks the anchored line with
``◀ [n]``; the Markdown version (:func:`render_markdown`, ``build/tables/fsdp-reading-<lang>.md``
for the site) is a fenced ``python`` block per excerpt with ``linenums`` set to the first line
shown and ``hl_lines`` on the anchored lines (pymdownx.highlight), followed by the notes.
"""

from __future__ import annotations

import textwrap

from minigpt.fsdp import reading
from minigpt.fsdp.annotations import SECTIONS
from minigpt.pages.lang import LANGS, tr

TERMINAL_CONTEXT = 3  # lines shown above and below an anchored line in the terminal
MARKDOWN_CONTEXT = 5  # the same on the site, where a highlighted line is easier to find
NOTE_WIDTH = 100  # terminal wrap width of the notes and introductions


# --- the terminal -----------------------------------------------------------------------------


def _wrap(text: str, indent: str, width: int = NOTE_WIDTH) -> list[str]:
    return textwrap.wrap(
        text,
        width=width,
        initial_indent=indent,
        subsequent_indent=indent,
        break_long_words=False,
        break_on_hyphens=False,
    )


def render_terminal(lang: str = "en", section: str | None = None, key: str | None = None) -> str:
    """The annotated reading as plain text for a terminal."""
    chosen = reading.select(section, key)
    out = [
        tr(
            lang,
            "FSDP prefetch in the installed PyTorch, annotated",
            "La precarga de FSDP en el PyTorch instalado, anotada",
        ),
        f"torch {reading.torch_version()} · {reading.torch_dir()}",
        tr(
            lang,
            "Every source line below is read from the installed files now; the line numbers are theirs.",
            "Cada línea de código de abajo se lee ahora de los archivos instalados; "
            "los números de línea son los suyos.",
        ),
        "",
    ]
    for sec, notes in chosen:
        index = [s.name for s in SECTIONS].index(sec.name) + 1
        title = f"{index}. {sec.title(lang)}  [{sec.name}]"
        out += ["=" * len(title), title, "=" * len(title)]
        if key is None:
            out += _wrap(sec.intro(lang), "") + [""]
        for group in reading.group_by_function(notes):
            out += _render_terminal_excerpt(group, lang)
    return "\n".join(out).rstrip() + "\n"


def _render_terminal_excerpt(group: list[reading.Located], lang: str) -> list[str]:
    fn = group[0]
    where = f"{reading.torch_relative(fn.path)}:{fn.first_line}-{fn.last_line}"
    header = f"--- {fn.annotation.qualname}  ({where}) "
    out = [header + "-" * max(3, NOTE_WIDTH - len(header)), ""]
    markers = {}
    for loc in group:
        markers[loc.line] = markers.get(loc.line, "") + f" [{loc.number}]"
    windows = reading.excerpt_windows(group, TERMINAL_CONTEXT, with_signature=True)
    for i, (first, last) in enumerate(windows):
        if i > 0 or first > fn.first_line:
            out.append("      ...")
        for n in range(first, last + 1):
            text = fn.text(n)
            mark = f"   ◀{markers[n]}" if n in markers else ""
            out.append(f"{n:>5} │ {text}{mark}")
    if windows[-1][1] < fn.last_line:
        out.append("      ...")
    out.append("")
    for loc in group:
        out.append(f"  [{loc.number}] {loc.annotation.key} · {tr(lang, 'line', 'línea')} {loc.line}")
        out += _wrap(loc.annotation.note(lang), "      ")
        out.append("")
    return out


# --- the site ---------------------------------------------------------------------------------


def render_markdown(
    lang: str = "en", section: str | None = None, key: str | None = None, heading_level: int = 3
) -> str:
    """The annotated reading as a Markdown fragment for the site (mkdocs-material with
    pymdownx.highlight and superfences): a heading per section, then per function a bold title,
    one fenced block per excerpt (``linenums`` = its first file line, ``hl_lines`` = the
    anchored lines, counted from 1 inside the block) and the notes in ``lang``."""
    if lang not in LANGS:
        raise ValueError(f"lang must be one of {LANGS}, got {lang!r}")
    hashes = "#" * heading_level
    out = [
        tr(
            lang,
            f"*Source: PyTorch {reading.torch_version()}, read from the installed package when this page was built; "
            "the line numbers are those of its files.*",
            f"*Código: PyTorch {reading.torch_version()}, leído del paquete instalado al construir esta página; "
            "los números de línea son los de sus archivos.*",
        ),
        "",
    ]
    for sec, notes in reading.select(section, key):
        out += [f"{hashes} {sec.title(lang)} {{ #reading-{sec.name} }}", "", sec.intro(lang), ""]
        for group in reading.group_by_function(notes):
            out += _render_markdown_excerpt(group, lang)
    return "\n".join(out).rstrip() + "\n"


def _render_markdown_excerpt(group: list[reading.Located], lang: str) -> list[str]:
    fn = group[0]
    windows = reading.excerpt_windows(group, MARKDOWN_CONTEXT, with_signature=False)
    anchored = {loc.line for loc in group}
    lines_word = tr(lang, "lines", "líneas")
    out = [
        f"**`{fn.annotation.qualname}`** · `{reading.torch_relative(fn.path)}`, "
        f"{lines_word} {fn.first_line}–{fn.last_line}",
        "",
    ]
    for first, last in windows:
        shown = [fn.text(n) for n in range(first, last + 1)]
        fence = "````" if any("```" in text for text in shown) else "```"
        # hl_lines counts from 1 inside the block, whatever the block's linenums start is
        highlighted = " ".join(str(n - first + 1) for n in range(first, last + 1) if n in anchored)
        options = f'linenums="{first}"' + (f' hl_lines="{highlighted}"' if highlighted else "")
        out.append(f'{fence}python {options} title="{fn.path.name}"')
        out += shown
        out += [fence, ""]
    line_word = tr(lang, "line", "línea")
    for loc in group:
        out.append(f"- **[{loc.number}]** {line_word} {loc.line}: {loc.annotation.note(lang)}")
    out.append("")
    return out


def render_list() -> str:
    """Sections and keys, without importing torch."""
    out = []
    number = 0
    for sec in SECTIONS:
        out.append(f"{sec.name}: {sec.title_en}")
        for a in sec.annotations:
            number += 1
            out.append(f"  [{number}] {a.key}  ({a.qualname})")
    return "\n".join(out) + "\n"
