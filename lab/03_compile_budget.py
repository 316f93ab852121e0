"""Lab 03's compiler budget run: MiniGPT under torch.compile with the partitioner's
activation_memory_budget at 1, 0.5 and 0 (one process, inductor on the CPU, about a minute).

    python lab/03_compile_budget.py --report out/03-compile-budget.json

The run is minigpt/runners/lab03_compile_budget.py; its table, minigpt/pages/lab03_options.py.
"""

import sys

from minigpt.runners.lab03_compile_budget import main

if __name__ == "__main__":
    sys.exit(main())
