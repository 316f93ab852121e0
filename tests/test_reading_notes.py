"""Machinery tests (no points) for the Markdown notes of Lab 03's reading. No torch needed.

The words of the reading live in ``minigpt/fsdp/notes/reading.{en,es}.md``; what is pinned to
torch (keys, modules, functions, anchors) lives in :data:`minigpt.fsdp.annotations.READING`.
These tests hold both files to that table, heading for heading, and break copies of the files
to check that the loader stops each mistake with a message naming the file, the line and the key.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from minigpt.fsdp.annotations import (
    ANNOTATIONS,
    NOTES_DIR,
    READING,
    SECTIONS,
    NotesError,
    load_sections,
    notes_file,
    parse_notes,
    read_notes,
)

ROOT = Path(__file__).resolve().parent.parent
LANGS = ("en", "es")

NOTE = READING[3][1][1].key  # a note in the middle of the files
SECTION = READING[2][0]  # a section in the middle of the files


def expected_headings() -> list[tuple[str, str]]:
    """(kind, key) of every heading, in the order of the Python table."""
    out = []
    for name, pins in READING:
        out.append(("section", name))
        out += [("note", pin.key) for pin in pins]
    return out


# --- the shipped files -------------------------------------------------------------------------


@pytest.mark.parametrize("lang", LANGS)
def test_each_file_has_the_headings_of_the_python_table_in_its_order(lang):
    path = notes_file(lang)
    entries = parse_notes(path)
    assert [(e.kind, e.key) for e in entries] == expected_headings()
    # and nothing else in the file looks like a heading (the opening comment aside)
    lines = path.read_text(encoding="utf-8").splitlines()
    after_comment = lines.index("-->") + 1
    headings = [i for i, line in enumerate(lines, start=1) if line.startswith("#") and i > after_comment]
    assert headings == [e.line for e in entries]


def test_both_files_have_the_same_headings_in_the_same_order():
    en, es = (parse_notes(notes_file(lang)) for lang in LANGS)
    assert [(e.kind, e.key) for e in en] == [(e.kind, e.key) for e in es]
    assert all(a.title != b.title and a.text != b.text for a, b in zip(en, es) if a.kind == "section")


@pytest.mark.parametrize(
    "lang, source_line", [("en", "This English file is the source"), ("es", "El original es reading.en.md")]
)
def test_each_file_opens_with_the_rules_for_a_translator(lang, source_line):
    text = notes_file(lang).read_text(encoding="utf-8")
    assert text.startswith("<!--\n")
    comment = text[: text.index("\n-->\n")]
    for needed in (source_line, "{#", "###", "annotations.py", "tests/test_reading_notes.py"):
        assert needed in comment, needed


def test_every_title_intro_and_note_is_non_empty_in_both_languages():
    assert [s.name for s in SECTIONS] == [name for name, _ in READING]
    assert [a.key for a in ANNOTATIONS] == [pin.key for _, pins in READING for pin in pins]
    for section in SECTIONS:
        for text in (section.title_en, section.title_es, section.intro_en, section.intro_es):
            assert text.strip(), section.name
            assert "\n" not in text and "  " not in text and text == text.strip(), section.name
        assert section.title("en") == section.title_en and section.intro("es") == section.intro_es
    for (_, pins), section in zip(READING, SECTIONS, strict=True):
        for pin, a in zip(pins, section.annotations, strict=True):
            assert (a.key, a.module, a.qualname, a.anchor) == tuple(pin)
            assert a.en.strip() and a.es.strip() and a.en != a.es, a.key
            assert a.note("en") == a.en and a.note("es") == a.es


def test_the_notes_ship_with_the_package():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = config["tool"]["setuptools"]["package-data"]["minigpt"]
    package = ROOT / "minigpt"
    for lang in LANGS:
        relative = notes_file(lang).relative_to(package)
        assert any(relative.match(pattern) for pattern in patterns), relative


# --- broken copies -----------------------------------------------------------------------------


def broken_copy(tmp_path: Path, lang: str, edit: Callable[[list[str]], list[str]]) -> Path:
    """A copy of the notes folder in which the ``lang`` file's lines went through ``edit``;
    returns that file's path."""
    folder = tmp_path / "notes"
    shutil.copytree(NOTES_DIR, folder)
    path = notes_file(lang, folder)
    lines = edit(path.read_text(encoding="utf-8").splitlines())
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def heading_index(lines: list[str], key: str) -> int:
    """Index of the heading line of a section name or a note key."""
    return next(i for i, line in enumerate(lines) if line == f"### {key}" or line.endswith(f"{{#{key}}}"))


def block(lines: list[str], key: str) -> tuple[int, int, int]:
    """(heading, first text line, end) indices of a heading's block; ``end`` is the index of
    the blank line after its paragraph."""
    start = heading_index(lines, key)
    return start, start + 2, lines.index("", start + 2)


def line_of(path: Path, text: str, last: bool = False) -> int:
    """Line number (from 1) of the first (or last) line of ``path`` equal to ``text``."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return len(lines) - lines[::-1].index(text) if last else lines.index(text) + 1


def message(path: Path) -> str:
    with pytest.raises(NotesError) as exc:
        load_sections(path.parent)
    return str(exc.value)


@pytest.mark.parametrize("lang", LANGS)
def test_a_missing_note_is_named_with_the_file_and_line_where_it_belongs(tmp_path, lang):
    pins = READING[3][1]
    assert pins[1].key == NOTE

    def drop(lines):
        start, _, end = block(lines, NOTE)
        return lines[:start] + lines[end + 1 :]

    path = broken_copy(tmp_path, lang, drop)
    text = message(path)
    assert text.startswith(f"{path}:{line_of(path, f'### {pins[2].key}')}: missing note {NOTE!r}"), text
    assert f"after {pins[0].key!r}" in text


def test_a_missing_section_is_named(tmp_path):
    def drop(lines):
        start, _, end = block(lines, SECTION)
        return lines[:start] + lines[end + 1 :]

    path = broken_copy(tmp_path, "es", drop)
    first_note = READING[2][1][0].key
    assert message(path).startswith(f"{path}:{line_of(path, f'### {first_note}')}: missing section {SECTION!r}")


def test_swapped_notes_are_out_of_order(tmp_path):
    first, second = READING[0][1][0].key, READING[0][1][1].key

    def swap(lines):
        a, b = heading_index(lines, first), heading_index(lines, second)
        lines[a], lines[b] = lines[b], lines[a]
        return lines

    path = broken_copy(tmp_path, "en", swap)
    assert message(path).startswith(
        f"{path}:{line_of(path, f'### {second}')}: note {second!r} is out of order: {first!r} comes here"
    )


def test_a_note_moved_to_the_next_section_is_out_of_order(tmp_path):
    moved, next_section = READING[0][1][-1].key, READING[1][0]

    def move(lines):
        start, _, end = block(lines, moved)
        note = lines[start : end + 1]
        del lines[start : end + 1]
        _, _, after_intro = block(lines, next_section)
        lines[after_intro + 1 : after_intro + 1] = note  # the first note of the next section
        return lines

    path = broken_copy(tmp_path, "es", move)
    heading = next(
        line for line in path.read_text(encoding="utf-8").splitlines() if line.endswith(f"{{#{next_section}}}")
    )
    assert message(path).startswith(
        f"{path}:{line_of(path, heading)}: section {next_section!r} is out of order: {moved!r} comes here"
    )


def test_a_lost_heading_is_reported_at_its_orphan_text(tmp_path):
    """Deleting a section's heading leaves its introduction under the previous note."""
    orphan = []

    def drop_heading(lines):
        start, first, _ = block(lines, SECTION)
        orphan.append(lines[first])
        return lines[:start] + lines[start + 2 :]

    path = broken_copy(tmp_path, "en", drop_heading)
    text = message(path)
    assert text.startswith(f"{path}:{line_of(path, orphan[0])}: a second paragraph in {READING[1][1][-1].key!r}")
    assert "heading of this text missing" in text


def _duplicate(lines):
    _, first, end = block(lines, NOTE)
    return lines[:end] + ["", f"### {NOTE}", ""] + lines[first:end] + lines[end:]


def _unknown(lines):
    _, _, end = block(lines, NOTE)
    return lines[:end] + ["", "### fsdp1.no_such_note", "", "Some text."] + lines[end:]


def _empty(lines):
    _, first, end = block(lines, NOTE)
    return lines[:first] + lines[end + 1 :]


def _two_paragraphs(lines):
    _, _, end = block(lines, NOTE)
    return lines[:end] + ["", "A second paragraph."] + lines[end:]


def _section_as_note(lines):
    lines[heading_index(lines, SECTION)] = f"### {SECTION}"
    return lines


def _heading_without_key(lines):
    start = heading_index(lines, SECTION)
    lines[start] = lines[start].replace(f" {{#{SECTION}}}", "")
    return lines


def _comment_not_closed(lines):
    lines.remove("-->")
    return lines


# (how to break the file, the line the message must point at (None: the broken heading), what it says)
BREAKS = {
    "duplicate": (_duplicate, (f"### {NOTE}", True), f"{NOTE!r} appears twice"),
    "unknown": (_unknown, ("### fsdp1.no_such_note", False), "unknown note 'fsdp1.no_such_note'"),
    "empty": (_empty, (f"### {NOTE}", False), f"note {NOTE!r} has no text under its heading"),
    "two-paragraphs": (_two_paragraphs, ("A second paragraph.", False), f"a second paragraph in {NOTE!r}"),
    "section-as-note": (
        _section_as_note,
        (f"### {SECTION}", False),
        f"{SECTION!r} is a section: its heading is '## <title> {{#{SECTION}}}'",
    ),
    "heading-without-key": (_heading_without_key, None, "not a heading of a notes file"),
    "comment-not-closed": (_comment_not_closed, ("<!--", False), "this HTML comment is never closed"),
}


@pytest.mark.parametrize("lang", LANGS)
@pytest.mark.parametrize("name", BREAKS)
def test_a_broken_file_is_stopped_with_its_file_line_and_key(tmp_path, lang, name):
    edit, where, says = BREAKS[name]
    path = broken_copy(tmp_path, lang, edit)
    if where is None:
        lines = path.read_text(encoding="utf-8").splitlines()
        line = next(i for i, text in enumerate(lines, start=1) if text.startswith("## ") and "{#" not in text)
    else:
        line = line_of(path, *where)
    text = message(path)
    assert text.startswith(f"{path}:{line}: ") and says in text, text


def test_lines_are_joined_with_single_spaces_however_they_are_wrapped(tmp_path):
    def one_word_per_line(lines):
        _, first, end = block(lines, NOTE)
        words = " ".join(lines[first:end]).split(" ")
        return lines[:first] + [f"  {word}   " for word in words] + lines[end:]

    path = broken_copy(tmp_path, "es", one_word_per_line)
    assert load_sections(path.parent) == SECTIONS
    assert read_notes(path)[NOTE].text == {a.key: a for a in ANNOTATIONS}[NOTE].es
