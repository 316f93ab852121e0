"""Lab 02: the ZeRO model against real runs of MiniGPT (hand-rolled DDP, a ZeRO-1 optimizer,
FSDP2), bytes and memory per rank, each step checked against one process.

    torchrun --nproc_per_node=2 lab/02_crosscheck.py --report out/lab02.json

The code is in minigpt/runners/lab02_crosscheck.py; this file only starts it.
"""

import sys

from minigpt.runners.lab02_crosscheck import main

if __name__ == "__main__":
    sys.exit(main())
