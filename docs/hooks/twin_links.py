"""MkDocs hook: links that name a page's other language keep doing so on the site.

The pages are written to read well on GitHub too, so an English page says "*[Leer en español]
(00-minigpt-baseline.es.md)*" and its Spanish twin "*[Read in English](00-minigpt-baseline.md)*".
The i18n plugin builds each language on its own, and so on the site the first link would point to a
file the English build does not have (a broken link: ``mkdocs build --strict`` fails) and the
second would be taken for the Spanish page itself (the i18n plugin prefers ``.es.md`` for a link
to ``.md`` in the Spanish build).

This hook rewrites such links, before MkDocs resolves them, into plain links to the other
language's built page:

* in the English build, a link to ``page.es.md`` whose file exists;
* in the Spanish build, a link from a Spanish page (``*.es.md``) to ``page.md`` whose Spanish twin
  ``page.es.md`` also exists: Spanish pages link to Spanish twins (GLOSSARY.md), so a link to the
  English file is a deliberate link to the English page.

Every other link is left to MkDocs and its ``validation:`` settings. Fenced code is not touched.
"""

from __future__ import annotations

import os
import posixpath
import re

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import Files
from mkdocs.structure.pages import Page
from mkdocs.utils import get_relative_url

# an inline code span (left as it is) or a Markdown link to a .md file, with an optional anchor
LINK = re.compile(r"(?P<code>(?P<ticks>`+).+?(?P=ticks))"
                  r"|\[(?P<text>[^\]\n]*)\]\((?P<target>[^)\s#]+\.md)(?P<anchor>#[^)\s]*)?\)")
FENCE = re.compile(r"^(```+|~~~+).*?^\1\s*$", re.M | re.S)


def _languages(config: MkDocsConfig) -> tuple[str, str, list[str]]:
    i18n = config.plugins.get("i18n")
    if i18n is None:
        return "en", "en", ["en"]
    return i18n.current_language, i18n.default_language, list(i18n.build_languages)


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    language, default, languages = _languages(config)
    default_build = language == default
    if not default_build and getattr(page.file, "localization", None) != language:
        return markdown  # a fallback page: its .md links go to this language's twins, as usual

    def rewrite(match: re.Match) -> str:
        if match["code"]:
            return match[0]
        folder = posixpath.dirname(page.file.src_uri)
        src_uri = posixpath.normpath(posixpath.join(folder, match["target"]))
        stem = src_uri[: -len(".md")]  # theory/00-motivation or theory/00-motivation.es
        base, _, suffix = stem.rpartition(".")
        if default_build:  # English page: theory/x.es.md -> es/theory/x/
            if not base or suffix not in languages or suffix == default:
                return match[0]
            to_language, norm = suffix, base
        else:  # Spanish page: theory/x.md whose twin theory/x.es.md exists -> theory/x/
            if base and suffix in languages:
                return match[0]
            if not os.path.isfile(os.path.join(config.docs_dir, f"{stem}.{language}.md")):
                return match[0]
            to_language, norm = default, stem
        if not os.path.isfile(os.path.join(config.docs_dir, src_uri)):
            return match[0]  # not there: MkDocs reports the broken link
        path = posixpath.dirname(norm) if posixpath.basename(norm) in ("index", "README") else norm
        page_url = "/".join(p for p in (to_language if to_language != default else "", path) if p)
        url = get_relative_url(page_url + "/" if page_url else ".", page.url or ".")
        if not url.endswith("/"):
            url += "/"
        return f'<a href="{url}{match["anchor"] or ""}" lang="{to_language}">{match["text"]}</a>'

    out, last = [], 0
    for fence in FENCE.finditer(markdown):
        out.append(LINK.sub(rewrite, markdown[last:fence.start()]))
        out.append(fence.group(0))
        last = fence.end()
    out.append(LINK.sub(rewrite, markdown[last:]))
    return "".join(out)
