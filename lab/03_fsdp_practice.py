"""Lab 03, part 3: FSDP in practice. Eight demonstrations on real FSDP2 runs of MiniGPT.

    torchrun --nproc_per_node=2 lab/03_fsdp_practice.py                        # all eight
    torchrun --nproc_per_node=2 lab/03_fsdp_practice.py --only wrap,clipping   # some
    python lab/03_fsdp_practice.py --load-resharded out/lab03-checkpoints     # the world-1 reload, again
    python lab/03_fsdp_practice.py --render lab/results/03-practice-cpu.json   # tables and figures, en + es

The run is minigpt/runners/lab03_fsdp_practice.py; what it measures is minigpt/fsdp/ (practice.py,
sharded_state.py, memory.py, loading.py, export.py, failed_save.py); its tables and figures,
minigpt/pages/lab03_practice.py.
"""

import sys

from minigpt.runners.lab03_fsdp_practice import main

if __name__ == "__main__":
    sys.exit(main())
