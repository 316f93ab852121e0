"""Lab 01: DDP from scratch. Train MiniGPT with the hand-rolled bucketed DDP.

    torchrun --nproc_per_node=2 lab/01_ddp.py --check --report out/lab01.json

The run is minigpt/runners/lab01_ddp.py; the DDP it trains with is minigpt/parallel/ddp.py (on
minigpt/parallel/ring.py). See lab/01-ddp-from-scratch.md and CONTRIBUTING.md's layout table.
"""

import sys

from minigpt.runners.lab01_ddp import main

if __name__ == "__main__":
    sys.exit(main())
