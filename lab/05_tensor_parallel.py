"""Lab 05: tensor parallelism by hand. MiniGPT cut over the ranks (heads, MLP columns, vocabulary rows),
held against one process.

    torchrun --nproc_per_node=2 lab/05_tensor_parallel.py                                      # train, tutor accuracy
    torchrun --nproc_per_node=2 lab/05_tensor_parallel.py --check --report out/lab05-tp.json   # ... and the proofs
    torchrun --nproc_per_node=4 lab/05_tensor_parallel.py --check --sequence-parallel          # 4 ranks, Megatron's SP
    torchrun --nproc_per_node=2 lab/05_tensor_parallel.py --check --impl exercises             # with your exercises

The run is minigpt/runners/lab05_tensor_parallel.py; the layers, minigpt/parallel/tensor_parallel/.
"""

import sys

from minigpt.runners.lab05_tensor_parallel import main

if __name__ == "__main__":
    sys.exit(main())
