"""Lab 01's benchmark: step time of one process, a naive DDP, the hand-rolled BucketedDDP and
PyTorch's DDP; a bucket-cap sweep; the timeline of one step.

    torchrun --nproc_per_node=2 lab/01_benchmark.py --out lab/results

The run is minigpt/runners/lab01_benchmark.py; its tables and figure, minigpt/pages/lab01_benchmark.py.
"""

import sys

from minigpt.runners.lab01_benchmark import main

if __name__ == "__main__":
    sys.exit(main())
