"""MkDocs hook: text that is made on the reader's own machine, included only when the site is built.

Lab 03's annotated reading shows PyTorch's FSDP code as the *installed* package has it (the course
quotes PyTorch only that way, never by committing its source). A page asks for it with a line

    <!-- build-time include: build/tables/fsdp-reading-en.md -->

which Markdown renderers hide (so a page read on the forge shows the sentence around it, telling the
reader how to print the reading), and which this hook replaces with the file's text before MkDocs
converts the page. ``python -m minigpt.pages`` (run by ``make docs`` and ``make serve``) writes the
file first. Every other table of the pages is written into the pages themselves
(``minigpt/pages/inline.py``).
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError

INCLUDE = re.compile(r"^<!-- build-time include: (\S+) -->[ \t]*$", re.M)


def on_page_markdown(markdown: str, page, config: MkDocsConfig, files) -> str:
    root = Path(config.config_file_path).parent

    def text_of(match: re.Match) -> str:
        path = root / match.group(1)
        if not path.is_file():
            raise PluginError(f"{page.file.src_uri}: {match.group(1)} is missing; run python -m minigpt.pages first")
        return path.read_text(encoding="utf-8")

    return INCLUDE.sub(text_of, markdown)
