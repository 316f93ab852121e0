"""Machinery tests (no points) for Lab 03's annotated reading of PyTorch's FSDP prefetch code.

The reading (:mod:`minigpt.fsdp.reading`) shows torch's source from the installed package, keyed
by the notes in :mod:`minigpt.fsdp.annotations`. These tests hold it to the installed torch:

* every anchor is on exactly one line of its function, found here independently of the code
  under test (with :mod:`ast` on the module's file, not with ``inspect``);
* a changed anchor, a missing function or module, an ambiguous anchor and an anchor that only
  exists elsewhere in the file are all reported, by the note's key, with the torch version;
* the terminal output (one run of ``python lab/03_fsdp_reading.py`` per language) shows real
  source lines at their real line numbers, every note, and marks the anchored lines;
* the Markdown fragment for the site has correct ``linenums``/``hl_lines`` (checked by rendering
  it with the site's own Markdown extensions) and the notes in its language;
* the notes exist in both languages and none of them copies a stretch of torch's text.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import html
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from minigpt.fsdp import reading
from minigpt.fsdp.annotations import ANNOTATIONS, SECTIONS, Annotation
from minigpt.pages import lab03_reading as reading_page
from minigpt.runners import lab03_fsdp_reading as reading_command
from tests.limits import limit

ROOT = Path(__file__).resolve().parent.parent
TORCH_DIR = Path(torch.__file__).resolve().parent
NUMBER = {a.key: i for i, a in enumerate(ANNOTATIONS, start=1)}
COPY_LIMIT = 60  # a note may share at most this many characters in a row with torch's text
# The files the notes are about, plus the two whose docstrings they paraphrase.
TORCH_TEXTS = sorted({a.module for a in ANNOTATIONS}) + [
    "torch.distributed.fsdp.fully_sharded_data_parallel",
    "torch.distributed.fsdp.api",
]


def squash(text: str) -> str:
    return " ".join(text.split())


def module_file(module: str) -> Path:
    return Path(importlib.import_module(module).__file__).resolve()


@functools.cache
def _file_lines(path: Path) -> tuple[str, ...]:
    return tuple(path.read_text(encoding="utf-8").splitlines())


def file_lines(path: Path) -> list[str]:
    return list(_file_lines(path))


@functools.cache
def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def function_range(annotation: Annotation) -> tuple[Path, int, int]:
    """(file, first line incl. decorators, last line) of the annotated function, found with ast."""
    path = module_file(annotation.module)
    body = parsed(path).body
    node = None
    for part in annotation.qualname.split("."):
        node = next(
            n for n in body if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == part
        )
        body = node.body
    first = min([node.lineno] + [d.lineno for d in node.decorator_list])
    return path, first, node.end_lineno


def anchored_line(annotation: Annotation) -> tuple[Path, int]:
    """The one line of the function that holds the anchor, found with ast and a plain search."""
    path, first, last = function_range(annotation)
    lines = file_lines(path)
    hits = [n for n in range(first, last + 1) if annotation.anchor in lines[n - 1]]
    assert len(hits) == 1, f"{annotation.key}: anchor on lines {hits} of {path.name}:{first}-{last}"
    return path, hits[0]


# --- the notes themselves ----------------------------------------------------------------------


def test_notes_are_complete_in_both_languages():
    keys = [a.key for a in ANNOTATIONS]
    assert len(keys) == len(set(keys)), "duplicate keys"
    assert 20 <= len(ANNOTATIONS) <= 40
    assert [s.name for s in SECTIONS] == [
        "fsdp2-forward",
        "fsdp2-backward",
        "fsdp2-explicit",
        "fsdp1-prefetch",
        "fsdp1-exec-order",
        "fsdp1-rate-limiter",
    ]
    for section in SECTIONS:
        assert section.annotations, section.name
        for text in (section.title_en, section.title_es, section.intro_en, section.intro_es):
            assert text.strip(), section.name
        assert section.title_en != section.title_es and section.intro_en != section.intro_es
    for a in ANNOTATIONS:
        assert a.en.strip() and a.es.strip() and a.en != a.es, a.key
        assert len(a.en) <= 700 and len(a.es) <= 800, f"{a.key}: a note is 1-4 sentences"
        assert 0 < len(a.anchor) <= COPY_LIMIT and "\n" not in a.anchor, a.key


@functools.lru_cache(maxsize=1)
def torch_windows() -> frozenset[str]:
    """Every COPY_LIMIT-character stretch of the torch files the notes are about (spaces squashed)."""
    text = " ".join(squash(module_file(m).read_text(encoding="utf-8")) for m in TORCH_TEXTS)
    return frozenset(text[i : i + COPY_LIMIT] for i in range(len(text) - COPY_LIMIT + 1))


def copied_from_torch(text: str) -> list[str]:
    text = squash(text)
    return [
        text[i : i + COPY_LIMIT]
        for i in range(len(text) - COPY_LIMIT + 1)
        if text[i : i + COPY_LIMIT] in torch_windows()
    ]


def test_no_note_copies_torch_text():
    """No title, introduction or note shares COPY_LIMIT characters in a row (spaces squashed)
    with the torch files it talks about: the repository explains torch, it does not paste it."""
    texts = [(s.name, t) for s in SECTIONS for t in (s.title_en, s.title_es, s.intro_en, s.intro_es)]
    texts += [(a.key, t) for a in ANNOTATIONS for t in (a.en, a.es)]
    for name, text in texts:
        copied = copied_from_torch(text)
        assert not copied, f"{name} copies torch's text: {copied[0]!r}"


def test_the_copy_guard_catches_a_pasted_line():
    path, line = anchored_line(PENDING)
    pasted = " ".join(file_lines(path)[line - 1 : line + 3])  # four lines of torch, re-indented
    assert copied_from_torch(PENDING.en + " For example: " + pasted)
    assert not copied_from_torch(PENDING.en + " " + PENDING.anchor)  # an anchor alone is short


# --- anchors against the installed torch -------------------------------------------------------


@pytest.mark.parametrize("annotation", ANNOTATIONS, ids=[a.key for a in ANNOTATIONS])
def test_anchor_is_on_exactly_one_line_of_its_function(annotation: Annotation):
    path, line = anchored_line(annotation)
    located = reading.locate(annotation)
    _, first, last = function_range(annotation)
    assert located.path.resolve() == path
    assert (located.first_line, located.last_line, located.line) == (first, last, line)
    assert located.text(line) == file_lines(path)[line - 1]


def test_check_anchors_finds_every_anchor():
    assert reading.check_anchors(ANNOTATIONS) == []
    assert [loc.number for loc in reading.locate_all(ANNOTATIONS)] == list(range(1, len(ANNOTATIONS) + 1))


def broken(annotation: Annotation, **change) -> Annotation:
    return dataclasses.replace(annotation, **change)


BY_KEY = {a.key: a for a in ANNOTATIONS}
PENDING = BY_KEY["fsdp2.unshard.pending"]
COPY_OUT = BY_KEY["fsdp2.wait_for_unshard.copy_out"]


@pytest.mark.parametrize(
    "bad, says",
    [
        (broken(PENDING, anchor=PENDING.anchor + " and renamed"), "anchor not found"),
        (broken(BY_KEY["fsdp1.limiter.two_in_flight"], anchor="_max_num_inflight_all_gathers = 3"), "anchor not found"),
        (broken(PENDING, anchor=COPY_OUT.anchor), "anchor not found"),  # in the file, not in unshard
        (broken(PENDING, anchor="self."), "must match exactly one"),
        (broken(PENDING, qualname="FSDPParamGroup.unshard_renamed"), "not found"),
        (broken(PENDING, qualname="FSDPParamGroupRenamed.unshard"), "not found"),
        (broken(PENDING, module=PENDING.module + "_moved"), "cannot be imported"),
    ],
    ids=[
        "changed-anchor",
        "changed-constant",
        "anchor-outside-function",
        "ambiguous-anchor",
        "missing-method",
        "missing-class",
        "missing-module",
    ],
)
def test_a_broken_annotation_is_reported_by_its_key(bad: Annotation, says: str):
    problems = reading.check_anchors([bad])
    assert len(problems) == 1
    assert bad.key in problems[0] and says in problems[0]
    assert bad.qualname in problems[0] and repr(bad.anchor) in problems[0]
    assert torch.__version__ in problems[0]
    with pytest.raises(ValueError, match=re.escape(bad.key)):
        reading.locate(bad)
    assert issubclass(reading.AnchorError, ValueError)


def test_check_command_exits_1_naming_a_changed_anchor(monkeypatch, capsys):
    assert reading_command.main(["--check"]) == 0
    assert f"OK: all {len(ANNOTATIONS)} anchors" in capsys.readouterr().out
    monkeypatch.setattr(reading_command, "ANNOTATIONS", ANNOTATIONS[:5] + (broken(PENDING, anchor="pending_wait()"),))
    assert reading_command.main(["--check"]) == 1
    err = capsys.readouterr().err
    assert "fsdp2.unshard.pending" in err and "'pending_wait()'" in err and "1 of 6 anchors are broken" in err


# --- the terminal ------------------------------------------------------------------------------


def run_reading(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "lab/03_fsdp_reading.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=limit(120)
    )


@pytest.fixture(scope="module")
def printed() -> dict[str, str]:
    """The whole reading, printed once in each language."""
    out = {}
    for lang in ("en", "es"):
        proc = run_reading("--lang", lang)
        assert proc.returncode == 0, proc.stderr
        out[lang] = proc.stdout
    return out


CODE_LINE = re.compile(r"^ *(\d+) │ (.*?)((?:   ◀(?: \[\d+\])+)?)$")
HEADER = re.compile(r"^--- (\S+)  \((torch/\S+\.py):(\d+)-(\d+)\) -+$")


def test_printed_source_lines_are_the_installed_files(printed):
    for lang, text in printed.items():
        assert f"torch {torch.__version__} · {TORCH_DIR}" in text
        path, shown, marked = None, 0, {}
        for row in text.splitlines():
            if header := HEADER.match(row):
                path = TORCH_DIR.parent / header.group(2)
                lines = file_lines(path)
            elif code := CODE_LINE.match(row):
                number, source, marker = int(code.group(1)), code.group(2), code.group(3)
                assert source == lines[number - 1], f"{lang}: {path.name}:{number} is not the file's line"
                shown += 1
                for n in re.findall(r"\[(\d+)\]", marker):
                    marked[int(n)] = (path, number)
        assert shown > 300
        for a in ANNOTATIONS:  # each note's marker sits on its anchored line
            assert marked[NUMBER[a.key]] == anchored_line(a), a.key


def test_printed_notes_are_in_the_chosen_language(printed):
    for lang, other in (("en", "es"), ("es", "en")):
        text = squash(printed[lang])
        for a in ANNOTATIONS:
            path, line = anchored_line(a)
            assert squash(a.note(lang)) in text, f"{lang}: note {a.key} missing"
            assert squash(a.note(other)) not in text, f"{lang}: note {a.key} printed in {other}"
            assert f"[{NUMBER[a.key]}] {a.key} · {'line' if lang == 'en' else 'línea'} {line}" in text
        for s in SECTIONS:
            assert squash(s.title(lang)) in text and squash(s.intro(lang)) in text


def test_section_and_key_select_part_of_the_reading(capsys):
    assert reading_command.main(["--key", "fsdp1.limiter.synchronize"]) == 0
    out = capsys.readouterr().out
    path, line = anchored_line(BY_KEY["fsdp1.limiter.synchronize"])
    assert f"{line:>5} │ {file_lines(path)[line - 1]}   ◀ [{NUMBER['fsdp1.limiter.synchronize']}]" in out
    assert out.count("◀") == 1 and "_FreeEventQueue" not in out
    assert reading_command.main(["--section", "fsdp1-rate-limiter", "--lang", "es"]) == 0
    out = capsys.readouterr().out
    limiter = next(s for s in SECTIONS if s.name == "fsdp1-rate-limiter")
    assert out.count("◀") == len(limiter.annotations) and "FSDPParamGroup" not in out
    assert reading_command.main(["--list"]) == 0
    out = capsys.readouterr().out
    assert all(a.key in out for a in ANNOTATIONS) and all(s.name in out for s in SECTIONS)


def test_bad_lang_exits_2_naming_the_value():
    proc = run_reading("--lang", "fr")
    assert proc.returncode == 2 and proc.stdout == ""
    # argparse's wording (and its quotes) vary by Python version: only the words are checked
    assert all(re.search(rf"\b{lang}\b", proc.stderr) for lang in ("fr", "en", "es")), proc.stderr


@pytest.mark.parametrize(
    "args, says",
    [
        (["--section", "fsdp3"], "'fsdp3' is not a section; choose from: fsdp2-forward"),
        (["--key", "fsdp2.nothing"], "'fsdp2.nothing' is not a note key; choose from: fsdp2.root_pre_forward"),
        (["--markdown", "."], "--markdown '.': give a file name"),
        (["--markdown", "/dev/null/x.md"], "/dev/null is a file, not a folder"),
    ],
)
def test_bad_flag_values_exit_2(args, says, capsys):
    try:
        code = reading_command.main(args)  # our path checks return 2 ...
    except SystemExit as exit_info:  # ... argparse's exit with it
        code = exit_info.code
    assert code == 2
    captured = capsys.readouterr()
    assert says in captured.err and captured.out == ""


# --- the site ----------------------------------------------------------------------------------


FENCE = re.compile(r'^```python linenums="(\d+)"(?: hl_lines="([\d ]+)")? title="([^"]+)"$')
FUNCTION = re.compile(r"^\*\*`([\w.]+)`\*\* · `(torch/\S+\.py)`, (?:lines|líneas) (\d+)–(\d+)$")


def function_groups() -> list[Annotation]:
    """The first note of each function the reading shows, in order (a function gets one block
    of notes per section in which consecutive notes are about it)."""
    firsts, last = [], None
    for s in SECTIONS:
        for a in s.annotations:
            if (s.name, a.module, a.qualname) != last:
                firsts.append(a)
            last = (s.name, a.module, a.qualname)
    return firsts


@pytest.mark.parametrize("lang", ["en", "es"])
def test_markdown_fragment_shows_real_lines_with_the_right_numbers(lang):
    md = reading_page.render_markdown(lang)
    rows = md.splitlines()
    functions, highlighted, blocks = [], {}, 0
    path = None
    i = 0
    while i < len(rows):
        if function := FUNCTION.match(rows[i]):
            path = TORCH_DIR.parent / function.group(2)
            functions.append((function.group(1), path, int(function.group(3)), int(function.group(4))))
        elif fence := FENCE.match(rows[i]):
            start, marks = int(fence.group(1)), fence.group(2) or ""
            assert path is not None and fence.group(3) == path.name
            blocks += 1
            end = rows.index("```", i + 1)
            block = rows[i + 1 : end]
            assert block == file_lines(path)[start - 1 : start - 1 + len(block)], f"{path.name}:{start}"
            for mark in marks.split():
                highlighted.setdefault(path, set()).add(start + int(mark) - 1)
            i = end
        i += 1
    assert functions == [(a.qualname, *function_range(a)) for a in function_groups()]
    assert blocks == sum(row.startswith("```") for row in rows) // 2 >= len(functions)
    anchored = {}
    for a in ANNOTATIONS:
        p, line = anchored_line(a)
        anchored.setdefault(p, set()).add(line)
        assert f"**[{NUMBER[a.key]}]** {'line' if lang == 'en' else 'línea'} {line}: {a.note(lang)}" in md
    assert highlighted == anchored
    for s in SECTIONS:
        assert f"### {s.title(lang)} {{ #reading-{s.name} }}" in md and s.intro(lang) in md
    assert torch.__version__ in rows[0]


def test_markdown_renders_with_the_site_extensions():
    """pymdownx.highlight counts hl_lines from 1 inside each block, whatever linenums says: render
    the fragment as the site does and check that every highlighted line holds an anchor."""
    import markdown

    html_out = markdown.markdown(
        reading_page.render_markdown("en"), extensions=["attr_list", "pymdownx.superfences", "pymdownx.highlight"]
    )
    spans = re.findall(r'<span class="hll">(.*?)\n</span>', html_out, flags=re.S)
    texts = [html.unescape(re.sub(r"<[^>]+>", "", span)) for span in spans]
    assert len(texts) == len({anchored_line(a) for a in ANNOTATIONS})
    for a in ANNOTATIONS:
        assert sum(a.anchor in t for t in texts) >= 1, a.key
    assert all(any(a.anchor in t for a in ANNOTATIONS) for t in texts)
    assert 'id="reading-fsdp1-rate-limiter"' in html_out


def test_markdown_command_writes_the_fragment(tmp_path, capsys):
    out = tmp_path / "tables" / "fsdp-reading-es.md"
    assert reading_command.main(["--markdown", str(out), "--lang", "es"]) == 0
    assert out.read_text(encoding="utf-8") == reading_page.render_markdown("es")
    assert str(out) in capsys.readouterr().out
