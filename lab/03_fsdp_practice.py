"""Lab 03, part 3: FSDP in practice. Six demonstrations on real FSDP2 runs of MiniGPT.

    torchrun --nproc_per_node=2 lab/03_fsdp_practice.py                        # all six
    torchrun --nproc_per_node=2 lab/03_fsdp_practice.py --only wrap,clipping   # some
    python lab/03_fsdp_practice.py --load-resharded out/lab03-checkpoints     # the world-1 reload, again
    python lab/03_fsdp_practice.py --render lab/results/03-practice-cpu.json   # tables and figures, en + es

The code is in minigpt/runners/lab03_fsdp_practice.py (and practice.py, sharded_state.py, memory.py,
practice_tables.py); this file only starts it.
"""

import sys

from minigpt.runners.lab03_fsdp_practice import main

if __name__ == "__main__":
    sys.exit(main())
