"""Lab 01's drift experiments: how one optimizer step turns a rounding difference into a weight
difference, and which weights make a step's drift.

    python lab/01_drift.py                                # the one-step amplification table
    python lab/01_drift.py --sources 0,286 --out lab/results   # the drift sources of steps 0 and 286

The measurements are :func:`minigpt.parallel.equivalence.one_step_amplification` and
:func:`~minigpt.parallel.equivalence.drift_sources`; the page's tables are drawn by
:mod:`minigpt.pages.lab01_check`.
"""

from __future__ import annotations

import json

import torch

from minigpt import cli
from minigpt.pages.lab01_check import amplification_tables, sources_tables
from minigpt.parallel.equivalence import drift_sources, one_step_amplification


def main(argv: list[str] | None = None) -> int:
    """``python lab/01_drift.py [--sources STEPS] [--out DIR]``.

    Without ``--sources``: measure the one-step amplification and print its table. With
    ``--sources 0,286``: find which weights make the step drift of those steps (:func:`drift_sources`).
    With ``--out DIR`` the JSON and the Lab 01 page's tables are written there too
    (``01-amplification*`` or ``01-drift-sources*``)."""
    parser = cli.ArgumentParser(
        prog="lab/01_drift.py",
        description="How one optimizer step turns a rounding difference into a "
        "weight difference, and which weights make a step's drift.",
    )
    parser.add_argument(
        "--sources",
        metavar="STEP[,STEP]",
        help="which weights make the drift of these steps of the default two-rank run "
        "(default: none, the one-step amplification table instead)",
    )
    parser.add_argument(
        "--optimizer",
        choices=("adamw", "sgd"),
        default="adamw",
        help="with --sources: the run's optimizer (default: adamw)",
    )
    parser.add_argument(
        "--out", metavar="DIR", help="also write the JSON and the page's tables in DIR (default: print only)"
    )
    args = parser.parse_args(argv)
    try:
        steps = []
        if args.sources is not None:
            try:
                steps = sorted({int(x) for x in args.sources.split(",") if x.strip()})
            except ValueError:
                steps = []
            if not steps or not all(0 <= x < 450 for x in steps):
                raise cli.BadInput(f"--sources {args.sources}: not a list of steps in 0..449; give e.g. 0,286")
        out = cli.output_dir(args.out, "--out") if args.out is not None else None
    except cli.BadInput as exc:
        return cli.refuse(parser.prog, str(exc))
    torch.set_num_threads(1)  # as each torchrun rank
    if steps:
        rows = drift_sources(steps, args.optimizer)
        tables, name = sources_tables(rows), f"01-drift-sources-{args.optimizer}"
    else:
        rows = [
            one_step_amplification(optimizer, dtype, at_step)
            for dtype in ("float32", "float64")
            for optimizer in ("sgd", "adamw")
            for at_step in (0, 100)
        ]
        tables, name = amplification_tables(rows), "01-amplification"
    print(tables["en"])
    if out is not None:
        cli.make_parents(out, is_dir=True)
        (out / f"{name}.json").write_text(json.dumps(rows, indent=2) + "\n")
        for lang, text in tables.items():
            (out / f"{name}-{lang}.txt").write_text(text)
    return 0
