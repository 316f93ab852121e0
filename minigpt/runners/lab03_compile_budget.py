"""Lab 03's compiler budget run: MiniGPT under ``torch.compile`` with the partitioner's
``activation_memory_budget`` at 1, 0.5 and 0, in one process (inductor on the CPU).

    python lab/03_compile_budget.py --report lab/results/03-compile-budget-cpu.json
    python lab/03_compile_budget.py --render lab/results/03-compile-budget-cpu.json

The measurement is :func:`minigpt.fsdp.practice.compile_budgets`; the page's table,
:mod:`minigpt.pages.lab03_options`. Compiling takes most of its minute, so no check runs it.
"""

from __future__ import annotations

import platform
import sys
import time

from minigpt import cli

PROG = "lab/03_compile_budget.py"
RESULT_KEYS = ("budgets",)


def main(argv: list[str] | None = None) -> int:
    p = cli.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--report", metavar="FILE", help="write the measurements as JSON here, and its table beside it")
    p.add_argument("--render", metavar="JSON", help="only render an existing result (no measuring)")
    args = p.parse_args(argv)
    from minigpt.pages.lab03_options import render_budgets

    try:
        if args.render:
            path = cli.input_json(args.render, "--render", RESULT_KEYS, "lab/results/03-compile-budget-cpu.json")
            for written in render_budgets(path):
                print(f"wrote {written}")
            return 0
        if args.report is not None:
            cli.output_file(args.report, "--report")
    except cli.BadInput as exc:
        return cli.refuse(PROG, str(exc))
    import torch

    from minigpt.fsdp.practice import compile_budgets
    from minigpt.parallel import launch
    from minigpt.train import TrainConfig

    torch.set_num_threads(1)
    report = {
        "device": f"{platform.processor() or platform.machine()}, one thread",
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "budgets": compile_budgets(TrainConfig()),
    }
    from minigpt.pages.lab03_options import budgets_table

    print(budgets_table(report, "en"), flush=True)
    if args.report:
        launch.write_report(args.report, report)
        for written in [args.report, *render_budgets(args.report)]:
            print(f"wrote {written}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
