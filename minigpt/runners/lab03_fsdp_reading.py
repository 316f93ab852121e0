"""Lab 03's annotated reading of PyTorch's FSDP prefetch code, from the command line.

    python lab/03_fsdp_reading.py                  # the whole reading, in English
    python lab/03_fsdp_reading.py --lang es        # en español
    python lab/03_fsdp_reading.py --section fsdp1-rate-limiter
    python lab/03_fsdp_reading.py --key fsdp2.unshard.pending
    python lab/03_fsdp_reading.py --list           # sections and keys (does not import torch)
    python lab/03_fsdp_reading.py --check          # is every anchor still where the notes say?
    python lab/03_fsdp_reading.py --markdown build/tables/fsdp-reading-en.md [--lang es]

The lines are found by :mod:`minigpt.fsdp.reading`, the notes are in ``minigpt/fsdp/notes/`` and
the layout is :mod:`minigpt.pages.lab03_reading`.
"""

from __future__ import annotations

import sys
from pathlib import Path

from minigpt import cli
from minigpt.fsdp import reading
from minigpt.fsdp.annotations import ANNOTATIONS, SECTIONS
from minigpt.pages.lab03_reading import render_list, render_markdown, render_terminal
from minigpt.pages.lang import LANGS


def main(argv: list[str] | None = None) -> int:
    parser = cli.ArgumentParser(prog="lab/03_fsdp_reading.py", description=__doc__.splitlines()[0])
    parser.add_argument("--lang", choices=LANGS, default="en", help="language of the notes (default: en)")
    only = parser.add_mutually_exclusive_group()
    only.add_argument("--section", metavar="NAME", help="show one section (see --list)")
    only.add_argument("--key", metavar="KEY", help="show one note (see --list)")
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--list", action="store_true", help="list sections and note keys")
    action.add_argument(
        "--check", action="store_true", help="check that every anchor is found exactly once in the installed torch"
    )
    action.add_argument(
        "--markdown", metavar="PATH", type=Path, help="write the site's Markdown fragment (in --lang) to PATH"
    )
    args = parser.parse_args(argv)

    section_names = [s.name for s in SECTIONS]
    if args.section is not None and args.section not in section_names:
        parser.error(f"--section {args.section!r} is not a section; choose from: {', '.join(section_names)}")
    keys = [a.key for a in ANNOTATIONS]
    if args.key is not None and args.key not in keys:
        parser.error(f"--key {args.key!r} is not a note key; choose from: {', '.join(keys)}")
    if args.markdown is not None:
        try:
            cli.output_file(args.markdown, "--markdown")
        except cli.BadInput as exc:
            return cli.refuse(parser.prog, str(exc))

    if args.list:
        sys.stdout.write(render_list())
        return 0
    if args.check:
        problems = reading.check_anchors(ANNOTATIONS)
        for problem in problems:
            print(problem, file=sys.stderr)
        if problems:
            print(f"{len(problems)} of {len(ANNOTATIONS)} anchors are broken", file=sys.stderr)
            return 1
        print(f"OK: all {len(ANNOTATIONS)} anchors found, each on exactly one line, in torch {reading.torch_version()}")
        return 0
    try:
        if args.markdown is not None:
            text = render_markdown(args.lang, args.section, args.key)
            args.markdown.parent.mkdir(parents=True, exist_ok=True)
            args.markdown.write_text(text, encoding="utf-8")
            print(f"wrote {args.markdown}")
        else:
            sys.stdout.write(render_terminal(args.lang, args.section, args.key))
    except reading.AnchorError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0
