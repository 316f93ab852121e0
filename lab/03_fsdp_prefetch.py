"""Lab 03: FSDP prefetch. Run PyTorch's real FSDP (fully_shard and FullyShardedDataParallel) on
MiniGPT with every prefetch setting; trace, time and check each against one process.

    torchrun --nproc_per_node=2 lab/03_fsdp_prefetch.py --trace-dir out/lab03

The run is minigpt/runners/lab03_fsdp_prefetch.py; what it runs and traces is minigpt/fsdp/
(variants.py, trace.py); its tables and timelines, minigpt/pages/lab03_prefetch.py.
"""

import sys

from minigpt.runners.lab03_fsdp_prefetch import main

if __name__ == "__main__":
    sys.exit(main())
