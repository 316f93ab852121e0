"""Lab 06: pipeline parallelism by hand. MiniGPT cut into stages, one rank each, its micro-batches
scheduled by GPipe or 1F1B, held against one process.

    torchrun --nproc_per_node=2 lab/06_pipeline.py                                            # train (1F1B), tutor accuracy
    torchrun --nproc_per_node=2 lab/06_pipeline.py --check --report out/lab06-pipeline.json   # ... and the proofs
    torchrun --nproc_per_node=4 lab/06_pipeline.py --check --schedule gpipe                   # 4 stages, GPipe
    torchrun --nproc_per_node=2 lab/06_pipeline.py --check --impl exercises                   # with your exercises

The run is minigpt/runners/lab06_pipeline.py; the stages and schedules, minigpt/parallel/pipeline/.
"""

import sys

from minigpt.runners.lab06_pipeline import main

if __name__ == "__main__":
    sys.exit(main())
