"""Lab 03's compiler budget run: MiniGPT under ``torch.compile`` with the partitioner's
``activation_memory_budget`` at 1, 0.5 and 0, in one process (inductor on the CPU).

    python lab/03_compile_budget.py --report lab/results/03-compile-budget-cpu.json
    python lab/03_compile_budget.py --render lab/results/03-compile-budget-cpu.json

The measurement is :func:`minigpt.fsdp.practice.compile_budgets`; the page's table,
:mod:`minigpt.pages.lab03_options`. Compiling takes most of its minute, so no check runs it.
"""

from __future__ import annotations

from minigpt.runners import entry

PROG = "lab/03_compile_budget.py"
RESULT_KEYS = ("budgets",)


def main(argv: list[str] | None = None) -> int:
    from minigpt.pages.lab03_options import budgets_table

    def measure() -> dict:
        from minigpt.fsdp.practice import compile_budgets
        from minigpt.train import TrainConfig

        return {"budgets": compile_budgets(TrainConfig())}

    example = "lab/results/03-compile-budget-cpu.json"
    return entry.one_process(PROG, __doc__.splitlines()[0], argv, budgets_table, RESULT_KEYS, example, measure)
