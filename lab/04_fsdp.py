"""Lab 04: FSDP from scratch. Our own FSDP trains MiniGPT, held against one process and FSDP2.

    torchrun --nproc_per_node=2 lab/04_fsdp.py                                   # train, tutor accuracy
    torchrun --nproc_per_node=2 lab/04_fsdp.py --check --report out/lab04.json   # ... and the proofs
    torchrun --nproc_per_node=4 lab/04_fsdp.py --check --report out/lab04-4.json # on 4 ranks
    torchrun --nproc_per_node=2 lab/04_fsdp.py --check --impl exercises          # with your exercises
    python lab/04_fsdp.py --render lab/results/04-fsdp-cpu.json                  # the page's tables

The run is minigpt/runners/lab04_fsdp.py; the FSDP, minigpt/parallel/fsdp_by_hand/; the tables,
minigpt/pages/lab04.py.
"""

import sys

from minigpt.runners.lab04_fsdp import main

if __name__ == "__main__":
    sys.exit(main())
