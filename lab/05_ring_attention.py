"""Lab 05: context parallelism by hand. Ring attention (K/V blocks round a ring, an online softmax),
held against full causal attention.

    torchrun --nproc_per_node=2 lab/05_ring_attention.py --check --report out/lab05-ring.json
    torchrun --nproc_per_node=4 lab/05_ring_attention.py --check
    torchrun --nproc_per_node=2 lab/05_ring_attention.py --check --impl exercises   # with your exercises

The run is minigpt/runners/lab05_ring_attention.py; the ring, minigpt/parallel/tensor_parallel/ring_attention.py.
"""

import sys

from minigpt.runners.lab05_ring_attention import main

if __name__ == "__main__":
    sys.exit(main())
