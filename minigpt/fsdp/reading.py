"""Read PyTorch's FSDP prefetch code, straight from the installed torch, with our notes beside it.

This module finds the lines; :mod:`minigpt.pages.lab03_reading` lays them out (for a terminal and
for the site) and ``python lab/03_fsdp_reading.py`` (:mod:`minigpt.runners.lab03_fsdp_reading`,
whose docstring lists its options) is the command.

How a note finds its line. An :class:`~minigpt.fsdp.annotations.Annotation` names a module, a
function inside it and an anchor, a few tokens of one line. :func:`locate` imports the module,
walks the qualified name (``FSDPParamGroup.unshard``), unwraps decorators, asks
``inspect.getsourcelines`` for the function's real lines and their first line number, and looks
for the one line of the function that contains the anchor. Zero matches (torch rewrote the line),
two matches (the anchor is no longer distinctive) or a missing module or function raise
:class:`AnchorError`, whose message names the note, the function, the anchor and the torch
version. That is the whole guard against the reading rotting silently on an upgrade.

Nothing of torch is stored in this repository: every line shown is read from the installed
package at the moment it is shown.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
from dataclasses import dataclass
from pathlib import Path

from minigpt.fsdp.annotations import ANNOTATIONS, SECTIONS, Annotation, Section

WHOLE_FUNCTION_LINES = 32  # a function this short is shown whole
MAX_SIGNATURE_LINES = 8  # how far to look for the end of a ``def`` that spans several lines


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
        raise _problem(
            annotation,
            f"anchor not found in {annotation.qualname} "
            f"({Path(source_file).name}:{first_line}-{first_line + len(lines) - 1})",
        )
    if len(matches) > 1:
        raise _problem(
            annotation,
            f"anchor matches {len(matches)} lines of {annotation.qualname} "
            f"(lines {', '.join(map(str, matches))}), it must match exactly one",
        )
    return Located(
        annotation, number, Path(source_file), first_line, tuple(lines), _signature_end(lines, first_line), matches[0]
    )


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


def torch_relative(path: Path) -> str:
    """``torch/distributed/fsdp/...`` for a file inside the installed torch."""
    try:
        return path.resolve().relative_to(torch_dir().parent).as_posix()
    except ValueError:
        return str(path)


def torch_dir() -> Path:
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
