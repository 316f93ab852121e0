"""Lab 00's batch-scaling run: MiniGPT on the same sentences at batch 64 and at batch 256, with the
learning rate kept, scaled by the square root and scaled linearly (one process, a few minutes).

    python lab/00_batch_scaling.py --report out/00-batch-scaling.json

The run is minigpt/runners/lab00_batch_scaling.py; its table, minigpt/pages/lab00_scaling.py.
"""

import sys

from minigpt.runners.lab00_batch_scaling import main

if __name__ == "__main__":
    sys.exit(main())
