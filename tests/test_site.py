"""The course website: it builds with ``mkdocs build --strict``, every page exists in English and in
Spanish, and a real browser (Playwright driving Debian's chromium) can use it offline: switch
language, see the formulas drawn, read a notebook, search in Spanish.

The site is built once for this module, into a fresh temporary folder (never ``site/``: a
half-written ``site/`` from an earlier failed build would mislead), after ``python -m
minigpt.pages`` has written the generated tables and figures the pages include. These tests check
the course's own machinery and carry no points.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import urlsplit

import pytest

from tests.limits import limit

ROOT = Path(__file__).resolve().parent.parent
# where make install's browser step put chromium (make's CHROMIUM), and its note saying why it could not
CHROMIUM = Path(os.environ.get("MINIGPT_CHROMIUM", "/usr/bin/chromium"))
BROWSER_NOTE = Path(os.environ.get("MINIGPT_BROWSER_NOTE", ROOT / ".venv" / "browser-not-installed.txt"))
ARTIFACTS = ROOT / "out" / "test-artifacts"
BROWSER_TIMEOUT_MS = int(1000 * limit(20))


def english_notebooks() -> list[Path]:
    """The English notebooks (``NN-name.ipynb``; the Spanish twin ``NN-name.es.ipynb`` is the same page in /es/)."""
    return sorted(p for p in (ROOT / "notebooks").glob("*.ipynb") if not p.name.endswith(".es.ipynb"))


def english_pages() -> list[str]:
    """Every English page of the site, as its URL path under the site root ('' is the home page)."""
    pages = [
        p for d in ("docs", "docs/theory", "docs/lab") for p in (ROOT / d).glob("*.md") if not p.name.endswith(".es.md")
    ]
    pages += english_notebooks()
    urls = []
    for page in pages:
        rel = page.relative_to(ROOT / "docs") if page.is_relative_to(ROOT / "docs") else page.relative_to(ROOT)
        rel = rel.with_suffix("").as_posix()
        urls.append("" if rel == "index" else rel + "/")
    return sorted(urls)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> SimpleNamespace:
    """Generate the tables, then build the whole site once, strictly. The figures are the committed ones
    and the pages' generated blocks are left as committed: tests/test_theory.py and tests/test_docs.py
    check that both are up to date, which they could not do if this build rewrote them first."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    tables = subprocess.run(
        [sys.executable, "-m", "minigpt.pages", "--no-figures", "--no-pages"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=limit(180),
    )
    out = tmp_path_factory.mktemp("site") / "site"
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=limit(180),
    )
    return SimpleNamespace(dir=out, tables=tables, build=build)


def built(site: SimpleNamespace) -> Path:
    """The built site's folder; fails, briefly, if the build did not pass (the details are in
    test_strict_build_passes)."""
    assert site.tables.returncode == 0 and site.build.returncode == 0, (
        "the site did not build: see test_strict_build_passes"
    )
    return site.dir


def test_strict_build_passes(site):
    assert site.tables.returncode == 0, f"python -m minigpt.pages failed:\n{site.tables.stderr}"
    assert site.build.returncode == 0, f"mkdocs build --strict failed:\n{site.build.stderr}"


def test_every_page_exists_in_both_languages(site):
    out = built(site)
    pages = english_pages()
    assert "theory/00-motivation/" in pages and "notebooks/00-minigpt-baseline/" in pages
    missing = [
        f"{prefix}{page}"
        for page in pages
        for prefix in ("", "es/")
        if not (out / prefix / page / "index.html").is_file()
    ]
    assert missing == [], f"pages missing from the built site: {missing}"
    for page in pages:
        assert '<html lang="es"' in (out / "es" / page / "index.html").read_text(encoding="utf-8"), page


def test_notebook_pages_show_every_cell(site):
    """The English page shows the English notebook, the Spanish page its Spanish twin (its title,
    every code cell, and not the note that says the notebook is in English)."""
    out = built(site)
    for notebook in english_notebooks():
        twin = notebook.with_name(notebook.stem + ".es.ipynb")
        for prefix, source in (("", notebook), ("es/", twin)):
            cells = json.loads(source.read_text(encoding="utf-8"))["cells"]
            code_cells = sum(c["cell_type"] == "code" for c in cells)
            title = "".join(cells[0]["source"]).splitlines()[0].removeprefix("# ")
            html = (out / prefix / "notebooks" / notebook.stem / "index.html").read_text(encoding="utf-8")
            assert html.count('class="nb-cell nb-code"') == code_cells, f"{prefix}{notebook.name}"
            assert "make install" in html  # the note that says how to run it
            assert title in html, f"{prefix}notebooks/{notebook.stem}/ does not show {source.name}"
            assert "El notebook está escrito en inglés" not in html, f"{prefix}{notebook.name}: the English fallback"


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 (the stdlib's signature)
        pass


@pytest.fixture(scope="module")
def server(site):
    """The built site on http://127.0.0.1:<free port>/, from a stdlib server in a thread."""
    handler = functools.partial(_QuietHandler, directory=str(built(site)))
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()
    httpd.server_close()


def theory_page_with_math() -> str:
    """The first theory page that has a display formula ($$ ... $$) in both languages."""
    for page in sorted((ROOT / "theory").glob("*.md")):
        spanish = page.with_name(page.stem + ".es.md")
        if (
            not page.name.endswith(".es.md")
            and spanish.is_file()
            and "$$" in page.read_text(encoding="utf-8")
            and "$$" in spanish.read_text(encoding="utf-8")
        ):
            return f"theory/{page.stem}/"
    pytest.fail("no theory page has a display formula ($$ ... $$) in both languages to check MathJax with")


MATH_DRAWN = """() => [...document.querySelectorAll('mjx-container')]
                      .some(e => e.getBoundingClientRect().width > 1)"""


@pytest.fixture(scope="module")
def chromium() -> Path:
    """Debian's chromium, or the test is not run (asked before the site is built: a skip costs nothing), with
    the reason make install's browser step noted when it could not install it (a held package lock, no root)."""
    if not CHROMIUM.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} is missing: `make install` (run by `make test`) installs Debian's chromium")
        why = BROWSER_NOTE.read_text(encoding="utf-8").strip() if BROWSER_NOTE.is_file() else ""
        pytest.skip(
            f"{CHROMIUM} is missing, so the website was not tested in a browser"
            + (f": make install could not install it, {why}" if why else "")
            + "; `make install` as root (or `sudo apt-get install chromium`) installs it"
        )
    return CHROMIUM


def test_site_in_a_real_browser(chromium, server):
    from playwright.sync_api import sync_playwright

    outside, local_errors, page_errors = [], [], []

    def only_this_host(route):
        """Every request to another host is aborted and recorded."""
        if urlsplit(route.request.url).hostname == "127.0.0.1":
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    def on_response(response):
        # Material's language selector looks for a sitemap.xml beside each alternate page (the i18n
        # plugin points alternates at pages, not language roots); a miss is harmless.
        if response.status >= 400 and not response.url.endswith("/sitemap.xml"):
            local_errors.append(f"{response.status} {response.url}")

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    theory = theory_page_with_math()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(chromium))
        try:
            context = browser.new_context(viewport={"width": 1280, "height": 900})
            context.set_default_timeout(BROWSER_TIMEOUT_MS)
            context.route("**/*", only_this_host)
            page = context.new_page()
            page.on("response", on_response)
            page.on("pageerror", lambda error: page_errors.append(str(error)))

            # a theory page in English, its formulas drawn by MathJax
            page.goto(server + theory)
            assert page.get_attribute("html", "lang") == "en"
            page.wait_for_function(MATH_DRAWN)
            page.screenshot(path=str(ARTIFACTS / "site-theory-en.png"), full_page=True)

            # the language switcher: to Spanish (same page, /es/) ...
            page.hover(".md-header__option .md-select")
            page.click("a[hreflang=es]")
            page.wait_for_url(f"**/es/{theory}")
            assert page.get_attribute("html", "lang") == "es"
            page.wait_for_function(MATH_DRAWN)
            page.screenshot(path=str(ARTIFACTS / "site-theory-es.png"), full_page=True)

            # ... and back to English
            page.hover(".md-header__option .md-select")
            page.click("a[hreflang=en]")
            page.wait_for_url(lambda url: "/es/" not in url and url.endswith(theory))
            assert page.get_attribute("html", "lang") == "en"

            # a notebook page: its cells are in the page
            page.goto(server + "notebooks/00-minigpt-baseline/")
            page.wait_for_selector(".nb-cell.nb-code")
            assert page.locator(".nb-cell.nb-code").count() >= 1
            assert page.locator(".nb-cell.nb-code code").first.inner_text().strip() != ""

            # search from the Spanish site finds a Spanish page by a Spanish word
            page.goto(server + "es/")
            page.click("input.md-search__input")
            page.locator("input.md-search__input").press_sequentially("exactitud", delay=40)
            page.wait_for_selector(".md-search-result__item")
            hrefs = [a.get_attribute("href") or "" for a in page.locator(".md-search-result__item a").all()]
            assert any("/es/" in href for href in hrefs), hrefs
        finally:
            browser.close()

    assert outside == [], f"the site requested other hosts: {outside}"
    assert local_errors == [], f"requests to the site failed: {local_errors}"
    assert page_errors == [], f"JavaScript errors: {page_errors}"
    for name in ("site-theory-en.png", "site-theory-es.png"):
        png = (ARTIFACTS / name).read_bytes()
        assert len(png) > 1000 and png[:8] == b"\x89PNG\r\n\x1a\n", name
