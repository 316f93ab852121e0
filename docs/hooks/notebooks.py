"""MkDocs hook: the course's Jupyter notebooks as pages of the site, in both languages.

Why a hook and not mkdocs-jupyter: the i18n plugin (mkdocs-static-i18n) rebuilds the list of files
for each language, and a notebook, not being Markdown, comes out of it as a plain asset: copied as
raw JSON, and with no page under ``/es/``. This hook runs after the i18n plugin, once per language
build, and turns every ``*.ipynb`` of that build into a documentation page:

* ``on_files`` replaces each notebook asset with a ``NotebookFile`` whose destination is a page
  (``notebooks/00-minigpt-baseline/`` in English, ``es/notebooks/00-minigpt-baseline/`` in Spanish)
  and gives it the i18n attributes the language switcher reads. The nav names the notebook by its
  source path, ``notebooks/00-minigpt-baseline.ipynb``, and links to it from a page work the same.
* ``on_page_read_source`` hands MkDocs the notebook written as Markdown: markdown cells as they are,
  code cells as fenced code, each cell in a ``<div class="nb-cell ...">``. So the notebook gets the
  theme's code highlighting, headings in the table of contents, math, and a place in the search.

The notebooks are stored without outputs and are not executed here (the docs build stays fast; the
test suite runs them). Stored outputs, if a notebook has any, are shown: text as a text block,
PNG images inline. A note at the top of the page says the notebook is meant to be run. A Spanish
notebook, ``name.es.ipynb`` beside ``name.ipynb``, is picked up by the i18n plugin's usual rules;
without one, the Spanish site shows the English notebook with a Spanish note that says so.
"""

from __future__ import annotations

import json
import posixpath

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

NOTE = {
    "en": (
        '!!! note "Run this notebook"\n'
        "    This page shows `{path}` as it is stored: the code, without its outputs. The notebook\n"
        "    is meant to be run: after `make install`, open it with `.venv/bin/jupyter lab {path}`\n"
        "    and run the cells from top to bottom.\n"
    ),
    "es": (
        '!!! note "Ejecuta este notebook"\n'
        "    Esta página muestra `{path}` tal como está guardado: el código, sin sus salidas. El\n"
        "    notebook está pensado para ejecutarlo: después de `make install`, ábrelo con\n"
        "    `.venv/bin/jupyter lab {path}` y ejecuta las celdas de arriba abajo.{fallback}\n"
    ),
}
FALLBACK = {"es": " El notebook está escrito en inglés."}


class NotebookFile(File):
    """A ``.ipynb`` file that MkDocs builds as a page instead of copying it."""

    def is_documentation_page(self) -> bool:
        return True


def _languages(config: MkDocsConfig) -> tuple[str, str, list[str]]:
    """(language of this build, default language, every language built)."""
    i18n = config.plugins.get("i18n")
    if i18n is None:
        language = config.theme.get("language") or "en"
        return language, language, [language]
    return i18n.current_language, i18n.default_language, list(i18n.build_languages)


def _page_uri(norm_src_uri: str, language: str, default: str) -> str:
    """notebooks/x.ipynb -> notebooks/x/index.html, or es/notebooks/x/index.html for Spanish."""
    prefix = "" if language == default else f"{language}/"
    return f"{prefix}{norm_src_uri[: -len('.ipynb')]}/index.html"


class _Alternate:
    """What the i18n plugin reads from a page's alternate (language switcher, sitemap): its url."""

    page = None

    def __init__(self, url: str, locale: str):
        self.url, self.locale = url, locale


@event_priority(-200)  # after the i18n plugin (priority -100) has made this language's files
def on_files(files: Files, config: MkDocsConfig) -> Files:
    language, default, languages = _languages(config)
    for old in [f for f in files if f.src_uri.endswith(".ipynb")]:
        localization = getattr(old, "localization", None)
        norm = old.src_uri.replace(f".{localization}.ipynb", ".ipynb") if localization else old.src_uri
        new = NotebookFile(old.src_uri, config.docs_dir, config.site_dir, config.use_directory_urls,
                           dest_uri=_page_uri(norm, language, default), inclusion=old.inclusion)
        # what the i18n plugin records on its own files (read by the language switcher)
        new.locale = localization or default
        new.localization = localization
        new.locale_alternate_of = language
        new.norm_src_uri = norm
        new.alternates = {lang: _Alternate(posixpath.dirname(_page_uri(norm, lang, default)) + "/", lang)
                          for lang in languages}
        new.alternates[language] = new
        files.remove(old)
        files.append(new)
        i18n = config.plugins.get("i18n")
        if i18n is not None:  # the pages the i18n plugin lists in sitemap.xml
            i18n.i18n_files_per_language.setdefault(language, []).append(new)
    return files


def notebook_markdown(notebook: dict, path: str, language: str, fallback: str | None = None) -> str:
    """The notebook as a Markdown page: its title, a note to run it, then every cell. ``fallback``
    is the notebook's own language when the page shows it in another language's site."""
    cells = notebook.get("cells", [])
    code_language = (notebook.get("metadata", {}).get("kernelspec", {}).get("language")
                     or notebook.get("metadata", {}).get("language_info", {}).get("name") or "python")
    title = ""
    if cells and cells[0]["cell_type"] == "markdown":
        first = _source(cells[0]).lstrip()
        if first.startswith("# "):
            title, _, rest = first.partition("\n")
            cells = [{**cells[0], "source": rest}] + cells[1:]
    note = NOTE.get(language, NOTE["en"]).format(
        path=path, fallback=FALLBACK.get(language, "") if fallback else "")
    lang_attr = f' lang="{fallback}"' if fallback else ""
    parts = [title or f"# {posixpath.basename(path)}", note]
    for cell in cells:
        source = _source(cell).strip("\n")
        if cell["cell_type"] == "markdown":
            if source.strip():
                parts.append(_div("nb-cell nb-markdown", source, lang_attr))
        elif cell["cell_type"] == "code":
            parts.append(_div("nb-cell nb-code", _fence(source, code_language), lang_attr))
            outputs = [o for o in map(_output, cell.get("outputs", [])) if o]
            if outputs:
                parts.append(_div("nb-output", "\n\n".join(outputs)))
        # raw cells are not shown
    return "\n\n".join(parts) + "\n"


def _source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def _div(css_class: str, body: str, attributes: str = "") -> str:
    return f'<div class="{css_class}"{attributes} markdown>\n\n{body}\n\n</div>'


def _fence(text: str, lang: str) -> str:
    ticks = "```"
    while ticks in text:
        ticks += "`"
    return f"{ticks}{lang}\n{text}\n{ticks}"


def _output(output: dict) -> str:
    kind = output.get("output_type")
    if kind == "stream":
        return _fence(_source({"source": output.get("text", "")}).rstrip("\n"), "text")
    if kind == "error":
        return _fence(f"{output.get('ename', 'Error')}: {output.get('evalue', '')}", "text")
    data = output.get("data", {})
    if "image/png" in data:
        png = "".join(data["image/png"]) if isinstance(data["image/png"], list) else data["image/png"]
        return f"![output](data:image/png;base64,{png.strip()})"
    if "text/plain" in data:
        return _fence(_source({"source": data["text/plain"]}).rstrip("\n"), "text")
    return ""


def on_page_read_source(page: Page, config: MkDocsConfig) -> str | None:
    if not isinstance(page.file, NotebookFile):
        return None
    language, default, _ = _languages(config)
    notebook = json.loads(page.file.content_string)
    fallback = default if language != default and page.file.localization != language else None
    return notebook_markdown(notebook, page.file.norm_src_uri, language, fallback)
