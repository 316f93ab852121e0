"""One reading order for the whole course, written once and followed everywhere.

The order is the course map of README.md, read row by row, the theory page before the lab guide:
theory 00, Lab 00, theory 01, Lab 01, ... . A lab without a theory page of its own links, in its
theory cell, the sections of an earlier theory page to read again (Lab 05: theory 02's tensor,
sequence and context sections): a reminder, not a new place in the order. Everything else must agree
with it:

* the other maps (README.es.md, docs/index.md, docs/index.es.md) link the same pages in the same
  order, reminders included, the Spanish maps the Spanish twins; every theory page and lab guide has
  one place in the map (its first link), and a reminder links a section of a page above it;
* each row's topic ("05 · Tensor and context parallelism") is its lab page's title without "Lab 05 · "
  (the site's navigation shows that title, so the two say the same);
* each page's "Read first" section (``{ #read-first }``) links only pages before it;
* each page's "What next" section (``{ #next }``) links the page right after it, and no page later
  than that (it may recall earlier ones); the last page links none after it;
* a Spanish page links Spanish pages, an English page English ones;
* the site's navigation (mkdocs.yml) lists the pages in the same order, so that the footer's "Next"
  of every page is its "What next".

Adding a lab: add its row to the maps and its guide to the navigation, and give the page before it
a "What next" that leads to it.
"""

from __future__ import annotations

import posixpath
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
COURSE_PAGE = re.compile(r"(?:theory|lab)/\d\d-[\w-]+\.md")
LINK = re.compile(r"\]\(\s*<?([^()\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
PAGES = sorted(p.relative_to(ROOT).as_posix() for d in ("theory", "lab") for p in (ROOT / d).glob("[0-9][0-9]-*.md"))
MAPS = {
    "README.md": "en",
    "README.es.md": "es",
    "docs/index.md": "en",
    "docs/index.es.md": "es",
}


def spanish(page: str) -> bool:
    return page.endswith(".es.md")


def english(page: str) -> str:
    """The English page of a page: 'lab/00-x.es.md' -> 'lab/00-x.md'."""
    return page[: -len(".es.md")] + ".md" if spanish(page) else page


def twin(page: str, lang: str) -> str:
    return english(page)[: -len(".md")] + ".es.md" if lang == "es" else english(page)


def course_links(markdown: str, source: str) -> list[str]:
    """The course pages (theory pages and lab guides, as repository paths) that ``markdown``, a part of
    the file ``source``, links to, in the order of the links. docs/theory and docs/lab are the
    site's links to theory/ and lab/."""
    pages = []
    for target in LINK.findall(markdown):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        path = posixpath.normpath(posixpath.join(posixpath.dirname(source), target.split("#")[0]))
        path = path.removeprefix("docs/")
        if COURSE_PAGE.fullmatch(path[: -len(".es.md")] + ".md" if path.endswith(".es.md") else path):
            pages.append(path)
    return pages


def section(page: str, heading_id: str) -> str:
    """The text of a page's section ``{ #heading_id }``, up to the next heading of level 1 or 2
    (lines in code blocks are not headings)."""
    lines = (ROOT / page).read_text(encoding="utf-8").splitlines()
    starts = [i for i, line in enumerate(lines) if re.match(rf"^#{{1,6}} .*\{{ *#{heading_id} *\}}\s*$", line)]
    assert len(starts) == 1, f"{page} must have one section {{ #{heading_id} }} (it has {len(starts)})"
    body, fenced = [], False
    for line in lines[starts[0] + 1 :]:
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"^#{1,2} ", line):
            break
        body.append(line)
    return "\n".join(body)


def map_rows(path: str) -> str:
    """The table rows of a file's course map (the table under the heading that says "course map" or
    "mapa del curso")."""
    lines = (ROOT / path).read_text(encoding="utf-8").splitlines()
    start = next(
        (i for i, line in enumerate(lines) if re.match(r"^## .*(course map|mapa del curso)", line, re.I)), None
    )
    assert start is not None, f"{path} has no course map (a heading 'The course map' / 'El mapa del curso')"
    rows = []
    for line in lines[start + 1 :]:
        if line.startswith("#"):
            break
        if line.startswith("|"):
            rows.append(line)
    return "\n".join(rows)


def map_links(path: str) -> list[str]:
    """The course pages of a file's course map, row by row, left to right."""
    return course_links(map_rows(path), path)


def map_targets(path: str) -> list[str]:
    """The link targets of a file's course map, row by row, anchors kept: ``theory/02-x.md#hsdp``."""
    return [t for t in LINK.findall(map_rows(path)) if COURSE_PAGE.search(t.split("#")[0].replace(".es.md", ".md"))]


@cache
def order() -> tuple[str, ...]:
    """The course's reading order (English pages): README.md's course map, each page at its first
    link (a later link to it is a reminder)."""
    return tuple(dict.fromkeys(map_links("README.md")))


def position(page: str) -> int:
    return order().index(english(page))


def describe(pages) -> str:
    return " -> ".join(english(p).removesuffix(".md") for p in pages)


def test_the_map_lists_every_page_once():
    pages = order()
    english_pages = sorted(p for p in PAGES if not spanish(p))
    assert all(not spanish(p) for p in map_links("README.md")), "README.md's course map links Spanish pages"
    missing = sorted(set(english_pages) - set(pages))
    assert not missing, f"README.md's course map leaves out {missing}: every theory page and lab guide has its place"


@pytest.mark.parametrize("path", MAPS)
def test_a_page_linked_again_is_a_section_of_a_theory_page_above(path):
    """A map links a page a second time only as a reminder: a section (an anchor that exists) of a
    theory page, in the theory cell of a later row, in the map's language."""
    seen: set[str] = set()
    for target in map_targets(path):
        page = course_links(f"]({target})", path)[0]
        if english(page) in seen:
            assert page.startswith("theory/") and "#" in target, (
                f"{path} links {target} again: only a theory section may be"
            )
            heading_id = target.split("#", 1)[1]
            assert re.search(rf"\{{ *#{heading_id} *\}}", (ROOT / page).read_text(encoding="utf-8")), target
            assert spanish(page) == (MAPS[path] == "es"), f"{path} links {target}: a page in the other language"
        seen.add(english(page))


def lab_title(page: str) -> str:
    """A lab page's title without its "Lab NN · " (or "Laboratorio NN · "), and its number."""
    first = (ROOT / page).read_text(encoding="utf-8").splitlines()[0]
    found = re.match(r"^# (?:Lab|Laboratorio) (\d\d) · (.+?) \{ *#[\w-]+ *\}$", first)
    assert found, f"{page} must open with '# Lab NN · Title {{ #lab-NN }}'"
    return found.group(1), found.group(2)


@pytest.mark.parametrize("path", MAPS)
def test_the_map_s_topics_are_the_lab_pages_titles(path):
    """Each row's topic is its lab page's title (the site's navigation shows the page's title, so the
    map and the navigation name a lab the same way), and its theory cell links the theory to read."""
    lines = (ROOT / path).read_text(encoding="utf-8").splitlines()
    rows = [line for line in lines if re.match(r"^\| \d\d · ", line)]
    assert rows, f"{path}: no course map rows"
    for row in rows:
        topic = row.split("|")[1].strip()
        lab = next(p for p in course_links(row, path) if p.startswith("lab/"))
        number, title = lab_title(lab)
        assert topic == f"{number} · {title}", f"{path}: the row '{topic}' and {lab}'s title '{title}' differ"
        theory = [p for p in course_links(row.split("|")[2], path) if p.startswith("theory/")]
        assert theory, f"{path}: the row '{topic}' links no theory page in its theory cell"


@pytest.mark.parametrize("path", [p for p in MAPS if p != "README.md"])
def test_every_map_gives_the_same_order(path):
    lang = MAPS[path]
    expected = [twin(p, lang) for p in map_links("README.md")]
    assert map_links(path) == expected, (
        f"{path}'s course map must list {expected} in this order (README.md's map: {describe(order())})"
    )


def test_the_site_navigation_follows_the_order():
    """mkdocs.yml's nav lists the pages in the reading order (the footer's "Next" follows the nav)."""
    text = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    nav = text[text.index("\nnav:") :]
    listed = [p for p in re.findall(r"^\s*-\s+(?:[^:\n]+:\s+)?((?:theory|lab)/[\w./-]+\.md)\s*$", nav, re.M)]
    assert listed == list(order()), f"mkdocs.yml's nav lists {describe(listed)}; the course map: {describe(order())}"


@pytest.mark.parametrize("page", PAGES)
def test_read_first_names_only_earlier_pages(page):
    me = position(page)
    for linked in course_links(section(page, "read-first"), page):
        assert spanish(linked) == spanish(page), f"{page}'s Read first links {linked}: a page in the other language"
        assert position(linked) < me, (
            f"{page}'s Read first names {linked}, which comes after it in the course's order "
            f"({describe(order())}): a page can only ask for pages before it"
        )


@pytest.mark.parametrize("page", PAGES)
def test_what_next_leads_to_the_next_page(page):
    me = position(page)
    links = course_links(section(page, "next"), page)
    for linked in links:
        assert spanish(linked) == spanish(page), f"{page}'s What next links {linked}: a page in the other language"
        assert position(linked) <= me + 1 and linked != page, (
            f"{page}'s What next links {linked}, which is not the next page in the course's order "
            f"({describe(order())}); it may link the next page and pages before it"
        )
    if me + 1 < len(order()):
        following = twin(order()[me + 1], "es" if spanish(page) else "en")
        assert following in links, (
            f"{page}'s What next must link the page after it in the course's order, {following} "
            f"({describe(order())}); it links {links}"
        )
