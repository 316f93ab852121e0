"""Lab 01: DDP from scratch. Train MiniGPT with the hand-rolled bucketed DDP.

    torchrun --nproc_per_node=2 lab/01_ddp.py --check --report out/lab01.json

The code lives in minigpt/parallel/ (train_ddp.py, ddp.py, ring.py); see lab/01-ddp-from-scratch.md.
"""

import sys

from minigpt.runners.lab01_ddp import main

if __name__ == "__main__":
    sys.exit(main())
