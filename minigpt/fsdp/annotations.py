"""The annotated reading of PyTorch's FSDP prefetch code: where each note is pinned, and its text.

Not one line of torch lives here. Each :class:`Annotation` names a function of the installed
torch (its module and qualified name) and an *anchor*: a few tokens that occur on exactly one
line of that function. :mod:`minigpt.fsdp.reading` finds the line at run time, shows the real
source around it with the file's own line numbers, and prints the note beside it. If an upgrade
of torch renames the function or rewrites the line, ``python lab/03_fsdp_reading.py --check``
and ``tests/test_lab03_reading.py`` fail and name the note, so the reading cannot silently drift
away from the code it explains.

The notes are written for someone who has just built a bucketed DDP by hand (Lab 01): they say
what is prefetched, when, on which stream or ``Work`` handle, and why, in English (``en``) and
Spanish (``es``). The order is the reading order: FSDP2 forward, FSDP2 backward, the explicit
prefetch API, then FSDP1's prefetch, its recorded execution order and its rate limiter. Within a
function, notes follow the source top to bottom.

**Facts here, prose in Markdown.** What does not depend on the language stays in Python, in
:data:`READING`: the sections in order, each with its name and its notes' :class:`Pin` (key, module,
qualified name, anchor). The words live in two Markdown files a translator can edit without touching
Python, ``notes/reading.en.md`` (the source) and ``notes/reading.es.md`` (its translation), next to
this module. Both have the same shape (the rules: :func:`parse_notes`)::

    ## FSDP2 (`fully_shard`): the forward pass {#fsdp2-forward}

    `fully_shard(module)` gives a module an `FSDPState` (its hooks) and an `FSDPParamGroup` ...

    ### fsdp2.root_pre_forward.wait_for_optimizer

    Runs once per forward, for the first FSDP module that runs (normally the root). ...

The module loads both files at import time (:func:`load_sections`) and checks each against
:data:`READING`. A missing, unknown, duplicated or misplaced key, a note written as a section (or
the reverse), an empty text or a malformed heading raises :class:`NotesError`, whose message
starts with ``file:line:`` and names the key. :func:`read_notes` and :func:`load_sections` take
the file or folder as an argument, so the same checks run on any copy (the tests use that).

To add a note: pin it in :data:`READING` (key, module, function, anchor), then give it a ``### key``
heading and its text at the same place in both Markdown files.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NamedTuple

# The modules read, as dotted names (resolved with importlib at run time).
FSDP2_STATE = "torch.distributed.fsdp._fully_shard._fsdp_state"
FSDP2_PARAM_GROUP = "torch.distributed.fsdp._fully_shard._fsdp_param_group"
FSDP2_API = "torch.distributed.fsdp._fully_shard._fully_shard"
FSDP1_RUNTIME = "torch.distributed.fsdp._runtime_utils"
FSDP1_EXEC_ORDER = "torch.distributed.fsdp._exec_order_utils"
FSDP1_LIMITER = "torch.distributed.fsdp._limiter_utils"

# The folder of the Markdown notes, shipped with the package ([tool.setuptools.package-data]).
NOTES_DIR = Path(__file__).resolve().parent / "notes"


@dataclass(frozen=True)
class Annotation:
    """One note on one line of the installed torch."""

    key: str  # stable id, e.g. "fsdp2.unshard.pending"
    module: str  # dotted module name, e.g. FSDP2_PARAM_GROUP
    qualname: str  # function or method inside the module, e.g. "FSDPParamGroup.unshard"
    anchor: str  # a short exact substring of exactly one line of that function
    en: str
    es: str

    def note(self, lang: str) -> str:
        return self.en if lang == "en" else self.es


@dataclass(frozen=True)
class Section:
    """A group of notes read together, with a title and an introduction in both languages."""

    name: str  # used by --section and as the heading id
    title_en: str
    title_es: str
    intro_en: str
    intro_es: str
    annotations: tuple[Annotation, ...]

    def title(self, lang: str) -> str:
        return self.title_en if lang == "en" else self.title_es

    def intro(self, lang: str) -> str:
        return self.intro_en if lang == "en" else self.intro_es


class Pin(NamedTuple):
    """Where a note is pinned in torch: everything about an :class:`Annotation` but its words."""

    key: str
    module: str
    qualname: str
    anchor: str


Reading = tuple[tuple[str, tuple[Pin, ...]], ...]  # (section name, the pins of its notes), in order
Kind = Literal["section", "note"]

# The reading, in order: (section name, the pins of its notes). The Markdown files follow it.
READING: Reading = (
    (
        "fsdp2-forward",
        (
            Pin(
                "fsdp2.root_pre_forward.wait_for_optimizer",
                FSDP2_STATE,
                "FSDPState._root_pre_forward",
                "all_gather_stream.wait_stream(current_stream)",
            ),
            Pin(
                "fsdp2.pre_forward.own_group",
                FSDP2_STATE,
                "FSDPState._pre_forward",
                "fsdp_param_group.pre_forward(module, args, kwargs)",
            ),
            Pin(
                "fsdp2.pre_forward.explicit_prefetch",
                FSDP2_STATE,
                "FSDPState._pre_forward",
                '_prefetch_unshard(target_param_group, "forward")',
            ),
            Pin(
                "fsdp2.unshard.pending",
                FSDP2_PARAM_GROUP,
                "FSDPParamGroup.unshard",
                "if self._all_gather_result is not None:",
            ),
            Pin("fsdp2.unshard.streams", FSDP2_PARAM_GROUP, "FSDPParamGroup.unshard", "get_all_gather_streams("),
            Pin(
                "fsdp2.wait_for_unshard.free_previous",
                FSDP2_PARAM_GROUP,
                "FSDPParamGroup.wait_for_unshard",
                "prev_all_gather_state := self.comm_ctx.all_gather_state",
            ),
            Pin(
                "fsdp2.wait_for_unshard.copy_out",
                FSDP2_PARAM_GROUP,
                "FSDPParamGroup.wait_for_unshard",
                "foreach_all_gather_copy_out(",
            ),
            Pin(
                "fsdp2.wait_for_unshard.defer_free",
                FSDP2_PARAM_GROUP,
                "FSDPParamGroup.wait_for_unshard",
                "self.comm_ctx.all_gather_state = AllGatherState(",
            ),
            Pin(
                "fsdp2.reshard.after_forward",
                FSDP2_PARAM_GROUP,
                "FSDPParamGroup.reshard",
                "if not self._reshard_after_forward:",
            ),
        ),
    ),
    (
        "fsdp2-backward",
        (
            Pin(
                "fsdp2.post_forward.record_order",
                FSDP2_PARAM_GROUP,
                "FSDPParamGroup.post_forward",
                "self._record_post_forward()",
            ),
            Pin(
                "fsdp2.pre_backward.default_or_explicit",
                FSDP2_STATE,
                "FSDPState._pre_backward",
                "default_prefetch = len(",
            ),
            Pin(
                "fsdp2.pre_backward.unshard",
                FSDP2_PARAM_GROUP,
                "FSDPParamGroup.pre_backward",
                "self.unshard(self.unshard_async_op)",
            ),
            Pin(
                "fsdp2.pre_backward.default_prefetch",
                FSDP2_PARAM_GROUP,
                "FSDPParamGroup.pre_backward",
                "self._backward_prefetch()",
            ),
            Pin(
                "fsdp2.backward_prefetch.target",
                FSDP2_PARAM_GROUP,
                "FSDPParamGroup._backward_prefetch",
                "post_forward_order[curr_index - 1]",
            ),
            Pin(
                "fsdp2.prefetch_unshard.issue_only",
                FSDP2_PARAM_GROUP,
                "FSDPParamGroup._prefetch_unshard",
                "target_fsdp_param_group.unshard(async_op)",
            ),
            Pin(
                "fsdp2.post_backward.reduce_scatter",
                FSDP2_PARAM_GROUP,
                "FSDPParamGroup.post_backward",
                "= foreach_reduce(",
            ),
        ),
    ),
    (
        "fsdp2-explicit",
        (
            Pin(
                "api.set_modules_to_forward_prefetch",
                FSDP2_API,
                "FSDPModule.set_modules_to_forward_prefetch",
                "_states_to_forward_prefetch = [",
            ),
            Pin(
                "api.set_modules_to_backward_prefetch",
                FSDP2_API,
                "FSDPModule.set_modules_to_backward_prefetch",
                "_states_to_backward_prefetch = [",
            ),
            Pin("api.unshard", FSDP2_API, "FSDPModule.unshard", "fsdp_param_group.unshard(async_op=async_op)"),
            Pin(
                "api.set_unshard_async_op",
                FSDP2_API,
                "FSDPModule._set_unshard_async_op",
                "fsdp_param_group.unshard_async_op = async_op",
            ),
        ),
    ),
    (
        "fsdp1-prefetch",
        (
            Pin(
                "fsdp1.pre_forward_unshard.skip_if_prefetched",
                FSDP1_RUNTIME,
                "_pre_forward_unshard",
                "if not handle._prefetched:",
            ),
            Pin(
                "fsdp1.pre_forward_unshard.forward_prefetch",
                FSDP1_RUNTIME,
                "_pre_forward_unshard",
                "_prefetch_handle(state, handle, _PrefetchMode.FORWARD)",
            ),
            Pin(
                "fsdp1.pre_backward_hook.backward_pre",
                FSDP1_RUNTIME,
                "_pre_backward_hook",
                "_prefetch_handle(state, handle, _PrefetchMode.BACKWARD)",
            ),
            Pin(
                "fsdp1.post_backward_reshard.backward_post",
                FSDP1_RUNTIME,
                "_post_backward_reshard",
                "_prefetch_handle(state, handle, _PrefetchMode.BACKWARD)",
            ),
            Pin("fsdp1.prefetch_handle.flag", FSDP1_RUNTIME, "_prefetch_handle", "handle._prefetched = True"),
            Pin(
                "fsdp1.get_handle_to_prefetch.mode",
                FSDP1_RUNTIME,
                "_get_handle_to_prefetch",
                "state.backward_prefetch == BackwardPrefetch.BACKWARD_PRE",
            ),
        ),
    ),
    (
        "fsdp1-exec-order",
        (
            Pin(
                "fsdp1.record_pre_forward.first_iter_only",
                FSDP1_EXEC_ORDER,
                "_ExecOrderData.record_pre_forward",
                "if not self.is_first_iter",
            ),
            Pin(
                "fsdp1.exec_order.backward_target",
                FSDP1_EXEC_ORDER,
                "_ExecOrderData.get_handle_to_backward_prefetch",
                "target_index = current_index - 1",
            ),
            Pin(
                "fsdp1.exec_order.forward_target",
                FSDP1_EXEC_ORDER,
                "_ExecOrderData.get_handle_to_forward_prefetch",
                "target_index = current_index + 1",
            ),
            Pin(
                "fsdp1.check_order.across_ranks",
                FSDP1_EXEC_ORDER,
                "_ExecOrderData._check_order",
                "Forward order differs across ranks:",
            ),
            Pin(
                "fsdp1.check_order.later_iterations",
                FSDP1_EXEC_ORDER,
                "_ExecOrderData._check_order",
                "Forward order differs from that of the first",
            ),
            Pin("fsdp1.exec_order.next_iter", FSDP1_EXEC_ORDER, "_ExecOrderData.next_iter", "self._iter += 1"),
        ),
    ),
    (
        "fsdp1-rate-limiter",
        (
            Pin(
                "fsdp1.limiter.two_in_flight",
                FSDP1_LIMITER,
                "_FreeEventQueue.__init__",
                "self._max_num_inflight_all_gathers = 2",
            ),
            Pin(
                "fsdp1.limiter.enqueue_on_free",
                FSDP1_RUNTIME,
                "_reshard",
                "state._free_event_queue.enqueue(free_event)",
            ),
            Pin("fsdp1.limiter.synchronize", FSDP1_RUNTIME, "_unshard", "event.synchronize()"),
        ),
    ),
)


# --- the Markdown notes -----------------------------------------------------------------------


class NotesError(ValueError):
    """A notes file that cannot be read, or does not match :data:`READING`.

    The message starts with ``path:line:`` and names the key concerned."""


@dataclass(frozen=True)
class Entry:
    """One heading of a notes file and the paragraph under it."""

    kind: Kind
    key: str  # the section's name or the note's key
    title: str  # the section's title ("" for a note)
    text: str  # the section's introduction or the note, its lines joined with single spaces
    line: int  # line number of the heading, from 1


SECTION_HEADING = re.compile(r"## +(?P<title>\S.*?) *\{#(?P<key>[^\s{}]+)\}")
NOTE_HEADING = re.compile(r"### +(?P<key>[^\s{}#]+)")


def notes_file(lang: str, folder: Path | str = NOTES_DIR) -> Path:
    """The notes file of one language: ``<folder>/reading.<lang>.md``."""
    return Path(folder) / f"reading.{lang}.md"


def parse_notes(path: Path | str) -> list[Entry]:
    """The headings of a notes file and their paragraphs, in file order (not yet checked
    against :data:`READING`). Raises :class:`NotesError` on anything that is not a comment, a
    valid heading or one paragraph of text under a heading. The rules of a notes file:

    * ``## <title> {#<section name>}`` opens a section: the title is text (translated), the name in
      ``{#...}`` at the end of the line is its key. The paragraph under it is the section's intro.
    * ``### <note key>`` opens a note: the line is the key alone; the paragraph under it is the note.
    * A text is one paragraph. Its lines are stripped and joined with single spaces (spaces inside a
      line are kept as written), so it can be wrapped anywhere (we wrap at 100 columns) and loads as
      the same one-line string. A blank line ends the paragraph; more text after it, before the next
      heading, is an error (the reading prints every text as one paragraph). A line of text cannot
      start with ``#``: such a line is read as a heading and must be a valid one.
    * HTML comments on lines of their own (``<!--`` starts a line, ``-->`` ends one) are ignored: the
      files open with one that tells a translator these rules.
    """
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8-sig").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise NotesError(f"{path}: cannot read the notes ({exc})") from None
    entries: list[Entry] = []
    heading: tuple[Kind, str, str, int] | None = None  # the current heading: kind, key, title, line
    paragraph: list[str] = []
    paragraph_ended = False  # a blank line has closed the paragraph under the current heading
    comment_start = 0  # line number where the open HTML comment started (0: none is open)

    def finish() -> None:
        if heading is not None:
            kind, key, title, number = heading
            entries.append(Entry(kind, key, title, " ".join(paragraph), number))

    def error(number: int, what: str, under_heading: bool = True) -> NotesError:
        under = f" (under the heading {heading[1]!r})" if heading is not None and under_heading else ""
        return NotesError(f"{path}:{number}: {what}{under}")

    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if comment_start or line.startswith("<!--"):  # inside an HTML comment: skipped
            closes = "-->" in (line if comment_start else line[4:])
            if closes and not line.endswith("-->"):
                raise error(number, "text after '-->': a comment must end its line")
            comment_start = 0 if closes else (comment_start or number)
            continue
        if "<!--" in line or "-->" in line:
            raise error(number, "an HTML comment must start and end on lines of its own")
        if not line:
            paragraph_ended = bool(paragraph)
            continue
        if line.startswith("#"):
            section, note = SECTION_HEADING.fullmatch(line), NOTE_HEADING.fullmatch(line)
            if section is None and note is None:
                raise error(
                    number,
                    f"not a heading of a notes file: {line!r} (a section is "
                    f"'## Title {{#section-name}}', a note '### note.key'; a line of text "
                    f"cannot start with '#')",
                    under_heading=False,
                )
            finish()
            if section is not None:
                heading = ("section", section["key"], section["title"], number)
            else:
                assert note is not None
                heading = ("note", note["key"], "", number)
            paragraph, paragraph_ended = [], False
            continue
        if heading is None:
            raise error(number, "text before the first heading (only comments may come first)")
        if paragraph_ended:
            raise error(
                number,
                f"a second paragraph in {heading[1]!r}: each text is one paragraph, with "
                f"no blank line inside it (or is the heading of this text missing?)",
                under_heading=False,
            )
        paragraph.append(line)
    if comment_start:
        raise NotesError(f"{path}:{comment_start}: this HTML comment is never closed with '-->'")
    finish()
    return entries


def _expected(reading: Reading) -> list[tuple[Kind, str]]:
    """Every heading a notes file must have, in order: (kind, key)."""
    expected: list[tuple[Kind, str]] = []
    for name, pins in reading:
        expected.append(("section", name))
        expected += [("note", pin.key) for pin in pins]
    keys = [key for _, key in expected]
    duplicates = sorted({key for key in keys if keys.count(key) > 1})
    if duplicates:
        raise ValueError(f"READING names {', '.join(map(repr, duplicates))} more than once")
    return expected


def _heading_syntax(kind: str, key: str) -> str:
    return f"'## <title> {{#{key}}}'" if kind == "section" else f"'### {key}'"


def check_notes(path: Path | str, entries: list[Entry], reading: Reading = READING) -> None:
    """Raise :class:`NotesError` unless ``entries`` (parsed from ``path``) have exactly the
    headings of ``reading``, in its order, each with a non-empty text."""
    expected = _expected(reading)
    kinds = {key: kind for kind, key in expected}
    seen: dict[str, int] = {}
    for entry in entries:
        at = f"{path}:{entry.line}:"
        if entry.key in seen:
            raise NotesError(f"{at} {entry.key!r} appears twice (lines {seen[entry.key]} and {entry.line})")
        seen[entry.key] = entry.line
        if entry.key not in kinds:
            raise NotesError(
                f"{at} unknown {entry.kind} {entry.key!r}: annotations.py's READING has no "
                f"such {entry.kind} (a key is never translated)"
            )
        if kinds[entry.key] != entry.kind:
            raise NotesError(
                f"{at} {entry.key!r} is a {kinds[entry.key]}: its heading is "
                f"{_heading_syntax(kinds[entry.key], entry.key)}"
            )
        if not entry.text:
            raise NotesError(f"{at} {entry.kind} {entry.key!r} has no text under its heading")
    for i, (kind, key) in enumerate(expected):
        if key not in seen:
            missing = f"missing {kind} {key!r}: its heading {_heading_syntax(kind, key)} belongs"
            after = [k for _, k in expected[i + 1 :] if k in seen]
            if after:  # point at the heading it must come before
                previous = f", after {expected[i - 1][1]!r}" if i else ""
                raise NotesError(f"{path}:{seen[after[0]]}: {missing} before this line{previous}")
            if not entries:
                raise NotesError(f"{path}:1: {missing} here: the file has no headings")
            last = entries[-1]
            raise NotesError(
                f"{path}:{last.line}: {missing} at the end of the file, after the text of "
                f"{last.key!r} (whose heading is this line)"
            )
    for (_, key), entry in zip(expected, entries):
        if entry.key != key:
            raise NotesError(
                f"{path}:{entry.line}: {entry.kind} {entry.key!r} is out of order: "
                f"{key!r} comes here (the order of annotations.py's READING)"
            )


def read_notes(path: Path | str, reading: Reading = READING) -> dict[str, Entry]:
    """One notes file, parsed and checked against ``reading``: its entries by key, in order."""
    entries = parse_notes(path)
    check_notes(path, entries, reading)
    return {entry.key: entry for entry in entries}


def load_sections(folder: Path | str = NOTES_DIR, reading: Reading = READING) -> tuple[Section, ...]:
    """The sections of the reading: the pins of ``reading`` with the words of
    ``<folder>/reading.en.md`` and ``<folder>/reading.es.md``."""
    en = read_notes(notes_file("en", folder), reading)
    es = read_notes(notes_file("es", folder), reading)
    return tuple(
        Section(
            name=name,
            title_en=en[name].title,
            title_es=es[name].title,
            intro_en=en[name].text,
            intro_es=es[name].text,
            annotations=tuple(Annotation(**pin._asdict(), en=en[pin.key].text, es=es[pin.key].text) for pin in pins),
        )
        for name, pins in reading
    )


SECTIONS: tuple[Section, ...] = load_sections()

ANNOTATIONS: tuple[Annotation, ...] = tuple(a for section in SECTIONS for a in section.annotations)
