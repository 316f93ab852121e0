"""Lab 03's options run: what FSDP1 (use_orig_params False and True) and FSDP2 hand the optimizer, which
dtype a matmul runs in when autocast and FSDP's mixed precision are both set, and CPU offload.

    torchrun --nproc_per_node=2 lab/03_fsdp_options.py --report out/03-options.json

The run is minigpt/runners/lab03_fsdp_options.py; its tables, minigpt/pages/lab03_options.py.
"""

import sys

from minigpt.runners.lab03_fsdp_options import main

if __name__ == "__main__":
    sys.exit(main())
