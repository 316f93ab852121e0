"""Read PyTorch's FSDP prefetch code, straight from the installed torch, with our notes beside it.

    python -m minigpt.fsdp.reading                 # the whole reading, in English
    python -m minigpt.fsdp.reading --lang es       # en español
    python -m minigpt.fsdp.reading --section fsdp1-rate-limiter
    python -m minigpt.fsdp.reading --key fsdp2.unshard.pending
    python -m minigpt.fsdp.reading --list          # sections and keys (does not import torch)
    python -m minigpt.fsdp.reading --check         # is every anchor still where the notes say?
    python -m minigpt.fsdp.reading --markdown build/tables/fsdp-reading-en.md [--lang es]

How a note finds its line. An :class:`~minigpt.fsdp.annotations.Annotation` names a module, a
function inside it and an anchor, a few tokens of one line. :func:`locate` imports the module,
walks the qualified name (``FSDPParamGroup.unshard``), unwraps decorators, asks
``inspect.getsourcelines`` for the function's real lines and their first line number, and looks
for the one line of the function that contains the anchor. Zero matches (torch rewrote the line),
two matches (the anchor is no longer distinctive) or a missing module or function raise
:class:`AnchorError`, whose message names the note, the function, the anchor and the torch
version. That is the whole guard against the reading rotting silently on an upgrade.

What is shown. For each function: its signature and a few lines around every anchored line (the
whole function when it is short), with the file's own line numbers, and the notes numbered in
reading order. The terminal version marks the anchored line with ``◀ [n]``; the Markdown version
(for the site) is a fenced ``python`` block per excerpt with ``linenums`` set to the first line
shown and ``hl_lines`` on the anchored lines (pymdownx.highlight), followed by the notes.

Nothing of torch is stored in this repository: every line shown is read from the installed
package at the moment it is shown.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import inspect
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

from minigpt import cli
from minigpt.fsdp.annotations import ANNOTATIONS, SECTIONS, Annotation, Section
from minigpt.lang import LANGS, tr

TERMINAL_CONTEXT = 3  # lines shown above and below an anchored line in the terminal
MARKDOWN_CONTEXT = 5  # the same on the site, where a highlighted line is easier to find
WHOLE_FUNCTION_LINES = 32  # a function this short is shown whole
MAX_SIGNATURE_LINES = 8  # how far to look for the end of a ``def`` that spans several lines
NOTE_WIDTH = 100  # terminal wrap width of the notes and introductions


class AnchorError(ValueError):
    """An annotation whose function or anchor line is not in the installed torch (as promised)."""


def torch_version() -> str:
    """The installed torch's version string (e.g. "2.13.0+cpu")."""
    try:
        import torch
    except ImportError:
        try:
            return importlib.metadata.version("torch")
        except importlib.metadata.PackageNotFoundError:
            return "not installed"
    return torch.__version__


@dataclass(frozen=True)
class Located:
    """Where one annotation lands in the installed torch."""

    annotation: Annotation
    number: int  # the note's number in reading order, 1-based
    path: Path  # the source file
    first_line: int  # file line number of the function's first line (its first decorator)
    lines: tuple[str, ...]  # the function's source lines, as in the file, without newlines
    signature_end: int  # file line number of the line that ends the ``def ...:`` signature
    line: int  # file line number of the anchored line

    @property
    def last_line(self) -> int:
        return self.first_line + len(self.lines) - 1

    def text(self, line: int) -> str:
        """The source text of one file line inside the function."""
        return self.lines[line - self.first_line]


def _problem(annotation: Annotation, what: str) -> AnchorError:
    return AnchorError(
        f"annotation {annotation.key!r}: {what} "
        f"(function {annotation.module}.{annotation.qualname}, anchor {annotation.anchor!r}, "
        f"torch {torch_version()})"
    )


def resolve(annotation: Annotation):
    """The function object an annotation names, with decorators unwrapped."""
    try:
        obj = importlib.import_module(annotation.module)
    except ImportError as exc:
        raise _problem(annotation, f"module {annotation.module} cannot be imported ({exc})") from None
    for part in annotation.qualname.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise _problem(annotation, f"{annotation.qualname} not found: no attribute {part!r}") from None
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    obj = inspect.unwrap(obj)
    if not inspect.isfunction(obj):
        raise _problem(annotation, f"{annotation.qualname} is not a function ({type(obj).__name__})")
    return obj


def _signature_end(lines: list[str], first_line: int) -> int:
    """File line number of the line that closes the ``def`` (decorators come before it)."""
    def_index = next((i for i, text in enumerate(lines) if text.lstrip().startswith(("def ", "async def "))), 0)
    for i in range(def_index, min(def_index + MAX_SIGNATURE_LINES, len(lines))):
        if lines[i].split("#")[0].rstrip().endswith(":"):
            return first_line + i
    return first_line + def_index


def locate(annotation: Annotation, number: int = 0) -> Located:
    """Find the one line of the annotated function that contains the anchor, or raise AnchorError."""
    function = resolve(annotation)
    module_file = inspect.getsourcefile(importlib.import_module(annotation.module))
    try:
        source_file = inspect.getsourcefile(function)
        raw_lines, first_line = inspect.getsourcelines(function)
    except (OSError, TypeError) as exc:
        raise _problem(annotation, f"source not available ({exc})") from None
    if source_file is None or module_file is None or Path(source_file).resolve() != Path(module_file).resolve():
        raise _problem(annotation, f"{annotation.qualname} is defined in {source_file}, not in the module's file")
    lines = [text.rstrip("\r\n") for text in raw_lines]
    matches = [first_line + i for i, text in enumerate(lines) if annotation.anchor in text]
    if not matches:
        raise _problem(annotation, f"anchor not found in {annotation.qualname} "
                                   f"({Path(source_file).name}:{first_line}-{first_line + len(lines) - 1})")
    if len(matches) > 1:
        raise _problem(annotation, f"anchor matches {len(matches)} lines of {annotation.qualname} "
                                   f"(lines {', '.join(map(str, matches))}), it must match exactly one")
    return Located(annotation, number, Path(source_file), first_line, tuple(lines),
                   _signature_end(lines, first_line), matches[0])


def locate_all(annotations: tuple[Annotation, ...] | list[Annotation] = ANNOTATIONS) -> list[Located]:
    """Locate every annotation (numbered 1, 2, ... in the order given); raise on the first problem."""
    return [locate(a, number) for number, a in enumerate(annotations, start=1)]


def check_anchors(annotations: tuple[Annotation, ...] | list[Annotation] = ANNOTATIONS) -> list[str]:
    """One message per annotation that cannot be located; an empty list means all is well."""
    problems = []
    for annotation in annotations:
        try:
            locate(annotation)
        except AnchorError as exc:
            problems.append(str(exc))
    return problems


# --- what to show -----------------------------------------------------------------------------


Window = tuple[int, int]  # inclusive (first, last) file line numbers of an excerpt


def excerpt_windows(notes: list[Located], context: int, with_signature: bool) -> list[Window]:
    """Line ranges of one function that show every anchored line with ``context`` lines around
    it (and the signature if asked), merged where they touch; the whole function if it is short."""
    fn = notes[0]
    if len(fn.lines) <= WHOLE_FUNCTION_LINES:
        return [(fn.first_line, fn.last_line)]
    ranges = [(max(fn.first_line, n.line - context), min(fn.last_line, n.line + context)) for n in notes]
    if with_signature:
        ranges.append((fn.first_line, fn.signature_end))
    merged: list[Window] = []
    for start, end in sorted(ranges):
        if merged and start <= merged[-1][1] + 3:  # a gap of one or two lines is not worth a "..."
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def group_by_function(located: list[Located]) -> list[list[Located]]:
    """Consecutive notes on the same function, in reading order; each group sorted by line."""
    groups: list[list[Located]] = []
    for loc in located:
        key = (loc.annotation.module, loc.annotation.qualname)
        if groups and (groups[-1][0].annotation.module, groups[-1][0].annotation.qualname) == key:
            groups[-1].append(loc)
        else:
            groups.append([loc])
    return [sorted(group, key=lambda loc: loc.line) for group in groups]


def _torch_relative(path: Path) -> str:
    """``torch/distributed/fsdp/...`` for a file inside the installed torch."""
    try:
        return path.resolve().relative_to(_torch_dir().parent).as_posix()
    except ValueError:
        return str(path)


def _torch_dir() -> Path:
    import torch

    return Path(torch.__file__).resolve().parent


def select(section: str | None = None, key: str | None = None) -> list[tuple[Section, list[Located]]]:
    """The sections to show, each with its located notes; a note keeps its number in the full
    reading order (1 to len(ANNOTATIONS)) whatever is selected."""
    chosen = []
    number = 0
    for sec in SECTIONS:
        notes = []
        for annotation in sec.annotations:
            number += 1
            if (section is None or sec.name == section) and (key is None or annotation.key == key):
                notes.append(locate(annotation, number))
        if notes:
            chosen.append((sec, notes))
    return chosen


# --- the terminal -----------------------------------------------------------------------------


def _wrap(text: str, indent: str, width: int = NOTE_WIDTH) -> list[str]:
    return textwrap.wrap(text, width=width, initial_indent=indent, subsequent_indent=indent,
                         break_long_words=False, break_on_hyphens=False)


def render_terminal(lang: str = "en", section: str | None = None, key: str | None = None) -> str:
    """The annotated reading as plain text for a terminal."""
    chosen = select(section, key)
    out = [
        tr(lang, "FSDP prefetch in the installed PyTorch, annotated",
           "La precarga de FSDP en el PyTorch instalado, anotada"),
        f"torch {torch_version()} · {_torch_dir()}",
        tr(lang, "Every source line below is read from the installed files now; the line numbers are theirs.",
           "Cada línea de código de abajo se lee ahora de los archivos instalados; "
           "los números de línea son los suyos."),
        "",
    ]
    for sec, notes in chosen:
        index = [s.name for s in SECTIONS].index(sec.name) + 1
        title = f"{index}. {sec.title(lang)}  [{sec.name}]"
        out += ["=" * len(title), title, "=" * len(title)]
        if key is None:
            out += _wrap(sec.intro(lang), "") + [""]
        for group in group_by_function(notes):
            out += _render_terminal_excerpt(group, lang)
    return "\n".join(out).rstrip() + "\n"


def _render_terminal_excerpt(group: list[Located], lang: str) -> list[str]:
    fn = group[0]
    where = f"{_torch_relative(fn.path)}:{fn.first_line}-{fn.last_line}"
    header = f"--- {fn.annotation.qualname}  ({where}) "
    out = [header + "-" * max(3, NOTE_WIDTH - len(header)), ""]
    markers = {}
    for loc in group:
        markers[loc.line] = markers.get(loc.line, "") + f" [{loc.number}]"
    windows = excerpt_windows(group, TERMINAL_CONTEXT, with_signature=True)
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


def render_markdown(lang: str = "en", section: str | None = None, key: str | None = None,
                    heading_level: int = 3) -> str:
    """The annotated reading as a Markdown fragment for the site (mkdocs-material with
    pymdownx.highlight and superfences): a heading per section, then per function a bold title,
    one fenced block per excerpt (``linenums`` = its first file line, ``hl_lines`` = the
    anchored lines, counted from 1 inside the block) and the notes in ``lang``."""
    if lang not in LANGS:
        raise ValueError(f"lang must be one of {LANGS}, got {lang!r}")
    hashes = "#" * heading_level
    out = [
        tr(lang,
           f"*Source: PyTorch {torch_version()}, read from the installed package when this page was built; "
           "the line numbers are those of its files.*",
           f"*Código: PyTorch {torch_version()}, leído del paquete instalado al construir esta página; "
           "los números de línea son los de sus archivos.*"),
        "",
    ]
    for sec, notes in select(section, key):
        out += [f"{hashes} {sec.title(lang)} {{ #reading-{sec.name} }}", "", sec.intro(lang), ""]
        for group in group_by_function(notes):
            out += _render_markdown_excerpt(group, lang)
    return "\n".join(out).rstrip() + "\n"


def _render_markdown_excerpt(group: list[Located], lang: str) -> list[str]:
    fn = group[0]
    windows = excerpt_windows(group, MARKDOWN_CONTEXT, with_signature=False)
    anchored = {loc.line for loc in group}
    lines_word = tr(lang, "lines", "líneas")
    out = [f"**`{fn.annotation.qualname}`** · `{_torch_relative(fn.path)}`, "
           f"{lines_word} {fn.first_line}–{fn.last_line}", ""]
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


# --- command line -----------------------------------------------------------------------------


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minigpt.fsdp.reading",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--lang", choices=LANGS, default="en", help="language of the notes (default: en)")
    only = parser.add_mutually_exclusive_group()
    only.add_argument("--section", metavar="NAME", help="show one section (see --list)")
    only.add_argument("--key", metavar="KEY", help="show one note (see --list)")
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--list", action="store_true", help="list sections and note keys")
    action.add_argument("--check", action="store_true",
                        help="check that every anchor is found exactly once in the installed torch")
    action.add_argument("--markdown", metavar="PATH", type=Path,
                        help="write the site's Markdown fragment (in --lang) to PATH")
    args = parser.parse_args(argv)

    section_names = [s.name for s in SECTIONS]
    if args.section is not None and args.section not in section_names:
        parser.error(f"--section {args.section!r} is not a section; choose from: {', '.join(section_names)}")
    keys = [a.key for a in ANNOTATIONS]
    if args.key is not None and args.key not in keys:
        parser.error(f"--key {args.key!r} is not a note key; choose from: {', '.join(keys)}")
    if args.markdown is not None:
        try:
            cli.output_file(args.markdown, "--markdown")
        except cli.BadInput as exc:
            return cli.refuse(parser.prog, str(exc))

    if args.list:
        sys.stdout.write(render_list())
        return 0
    if args.check:
        problems = check_anchors(ANNOTATIONS)
        for problem in problems:
            print(problem, file=sys.stderr)
        if problems:
            print(f"{len(problems)} of {len(ANNOTATIONS)} anchors are broken", file=sys.stderr)
            return 1
        print(f"OK: all {len(ANNOTATIONS)} anchors found, each on exactly one line, in torch {torch_version()}")
        return 0
    try:
        if args.markdown is not None:
            text = render_markdown(args.lang, args.section, args.key)
            args.markdown.parent.mkdir(parents=True, exist_ok=True)
            args.markdown.write_text(text, encoding="utf-8")
            print(f"wrote {args.markdown}")
        else:
            sys.stdout.write(render_terminal(args.lang, args.section, args.key))
    except AnchorError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
