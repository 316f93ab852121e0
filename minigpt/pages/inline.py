"""Pages that read anywhere: every generated table and measured fragment written into the page.

A course is often read on its forge, file by file, not on the built site. An include line
(``--8<-- "build/tables/zero-memory-en.md"``) shows there as raw text, and its target under
``build/`` does not even exist in a clone. So the pages carry the generated text themselves,
between two markers that Markdown renderers hide (HTML comments)::

    <!-- generated from build/tables/zero-memory-en.md by `python -m minigpt.pages`: edit the source, not this block -->
    | stage | ... |
    <!-- end of build/tables/zero-memory-en.md -->

``python -m minigpt.pages`` rewrites every block from its source (and turns any include line
left in a page into a block): ``build/tables/<name>-<lang>.md`` is computed by the page modules'
registry (:mod:`minigpt.pages.site`), ``lab/results/*.txt`` is the committed, rendered fragment of
a measured run, and ``file.txt:section`` is the part of that file between its
``--8<-- [start:section]`` and ``[end:section]`` markers. :func:`stale` lists the pages whose
blocks no longer match their sources; ``tests/test_pages_read_anywhere.py`` fails on any.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE_GLOBS = ("theory/*.md", "lab/*.md", "README*.md")
INCLUDE = re.compile(r'^--8<-- "([^"]+)"[ \t]*$', re.M)
BLOCK = re.compile(
    r"^<!-- generated from (?P<source>\S+) by `python -m minigpt\.pages`: edit the source, not this block -->\n"
    r"(?P<body>.*?)"
    r"^<!-- end of (?P=source) -->$",
    re.M | re.S,
)
SECTION_MARK = re.compile(r"^.*--8<-- \[(?:start|end):[\w-]+\].*\n?", re.M)
TABLE_SOURCE = re.compile(r"^build/tables/(?P<name>[\w-]+)-(?P<lang>en|es)\.md$")


def pages(root: Path = ROOT) -> list[Path]:
    return sorted(p for pattern in PAGE_GLOBS for p in root.glob(pattern))


def source_text(source: str, generated: dict[str, Callable[[str], str]], root: Path = ROOT) -> str:
    """The text a block holds: a generated table or fragment, or a committed file (or a section
    of it), without the section markers."""
    path, _, section = source.partition(":")
    table = TABLE_SOURCE.match(path)
    if table and table["name"] in generated:
        text = generated[table["name"]](table["lang"])
    else:
        file = root / path
        if not file.is_file():
            raise FileNotFoundError(f"a page includes {source}, and {path} does not exist")
        text = file.read_text(encoding="utf-8")
    if section:
        found = re.search(
            rf"--8<-- \[start:{re.escape(section)}\][^\n]*\n(.*?)^[^\n]*--8<-- \[end:{re.escape(section)}\]",
            text,
            re.M | re.S,
        )
        if found is None:
            raise ValueError(f"{path} has no section {section!r}")
        text = found.group(1)
    return SECTION_MARK.sub("", text).strip("\n") + "\n"


def block(source: str, text: str) -> str:
    """The markers on lines of their own, blank lines around the text: a renderer reads the text
    as Markdown, not as part of an HTML block."""
    return (
        f"<!-- generated from {source} by `python -m minigpt.pages`: edit the source, not this block -->\n\n"
        f"{text}\n"
        f"<!-- end of {source} -->"
    )


def render(page: str, generated: dict[str, Callable[[str], str]], root: Path = ROOT) -> str:
    """``page`` with every include line turned into a block and every block refreshed."""
    page = INCLUDE.sub(lambda m: block(m.group(1), source_text(m.group(1), generated, root)), page)
    return BLOCK.sub(lambda m: block(m["source"], source_text(m["source"], generated, root)), page)


def update(generated: dict[str, Callable[[str], str]], root: Path = ROOT) -> list[Path]:
    """Rewrite every page whose blocks are out of date; return those pages."""
    changed = []
    for path in pages(root):
        old = path.read_text(encoding="utf-8")
        new = render(old, generated, root)
        if new != old:
            path.write_text(new, encoding="utf-8")
            changed.append(path)
    return changed


def stale(generated: dict[str, Callable[[str], str]], root: Path = ROOT) -> list[str]:
    """The pages (relative paths) that ``python -m minigpt.pages`` would change."""
    return [
        str(path.relative_to(root))
        for path in pages(root)
        if render(path.read_text(encoding="utf-8"), generated, root) != path.read_text(encoding="utf-8")
    ]
