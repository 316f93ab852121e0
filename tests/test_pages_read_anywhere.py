"""Pages that read anywhere: a theory page or a lab guide opened as a plain file (on the forge, in
an editor) shows every table and figure the site shows.

* every generated table and measured fragment is written into the page (``python -m
  minigpt.pages``, :mod:`minigpt.pages.inline`), and no block is out of date;
* no include line is left for a renderer to show as raw text;
* every image a page shows is a committed file where the page points (``figures/`` for the
  generated figures, ``lab/results/`` for the measured ones).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from minigpt.pages import inline, site

ROOT = Path(__file__).resolve().parent.parent
PAGES = inline.pages(ROOT)
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")


def without_code(text: str) -> str:
    return re.sub(r"^(```|~~~).*?^\1", "", text, flags=re.M | re.S)


def test_every_generated_block_is_up_to_date():
    assert PAGES and inline.stale({**site.TABLES, **site.FRAGMENTS}, ROOT) == [], (
        "generated blocks out of date: run python -m minigpt.pages and commit the pages"
    )


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_page_read_as_a_file_shows_its_tables_and_figures(page):
    text = without_code(page.read_text(encoding="utf-8"))
    assert not re.search(r'^\s*--8<-- "', text, re.M), f"{page.name}: an include line; run python -m minigpt.pages"
    for target in IMAGE.findall(text):
        if target.startswith(("http://", "https://")):
            continue
        path = (page.parent / target).resolve()
        assert path.is_file(), f"{page.name}: the image {target} is not a file in the repository"
        tracked = subprocess.run(
            ["git", "ls-files", "--error-unmatch", str(path.relative_to(ROOT))], cwd=ROOT, capture_output=True
        )
        assert tracked.returncode == 0, f"{page.name}: the image {target} is not committed"


def test_a_stale_block_is_found_and_refreshed(tmp_path):
    """The check fails on a block whose source changed, and the refresh writes the source's text;
    an include line becomes a block, a section of a fragment included alone."""
    (tmp_path / "lab" / "results").mkdir(parents=True)
    (tmp_path / "lab" / "results" / "x-en.txt").write_text(
        "<!-- --8<-- [start:a] -->\n| a |\n| --- |\n| 1 |\n<!-- --8<-- [end:a] -->\n\nrest\n"
    )
    page = tmp_path / "lab" / "09-x.md"
    generated = {"t": lambda lang: f"| t |\n| --- |\n| {lang} |\n"}
    page.write_text('# X\n\n--8<-- "build/tables/t-en.md"\n\n--8<-- "lab/results/x-en.txt:a"\n\nend\n')
    assert inline.stale(generated, tmp_path) == ["lab/09-x.md"]
    assert inline.update(generated, tmp_path) == [page]
    text = page.read_text()
    assert "| en |" in text and "| 1 |" in text and "rest" not in text and "--8<--" not in text
    assert inline.stale(generated, tmp_path) == []
    page.write_text(text.replace("| 1 |", "| 2 |"))  # someone edited the block by hand
    assert inline.stale(generated, tmp_path) == ["lab/09-x.md"]
    inline.update(generated, tmp_path)
    assert page.read_text() == text


def test_the_reading_of_pytorchs_code_is_never_committed():
    """Lab 03's annotated reading quotes the installed PyTorch: the pages ask for it at build time
    (docs/hooks/build_includes.py) and say how to print it; no page holds it."""
    for page in PAGES:
        assert "from build/tables/fsdp-reading-" not in page.read_text(encoding="utf-8"), page.name
    for lang, suffix in (("en", ""), ("es", ".es")):
        text = (ROOT / "lab" / f"03-fsdp-prefetch{suffix}.md").read_text(encoding="utf-8")
        assert f"<!-- build-time include: build/tables/fsdp-reading-{lang}.md -->" in text
        assert "python lab/03_fsdp_reading.py" in text
