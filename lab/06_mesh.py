"""Lab 06: meshes. Four ranks read as a 2 x 2 grid: HSDP (FSDP2 sharded inside a node, replicated
across nodes) and DP x TP (Lab 05's tensor parallel inside a group, Lab 01's DDP across groups),
each held against one process.

    torchrun --nproc_per_node=4 lab/06_mesh.py --shard 2                                      # train both meshes
    torchrun --nproc_per_node=4 lab/06_mesh.py --shard 2 --check --report out/lab06-mesh.json # ... and the proofs
    # two "nodes" of two ranks on one machine: LOCAL_WORLD_SIZE=2 gives shard 2, replicate 2
    torchrun --nnodes=2 --nproc_per_node=2 --node_rank=0 --master_addr=127.0.0.1 --master_port=29511 lab/06_mesh.py --check &
    torchrun --nnodes=2 --nproc_per_node=2 --node_rank=1 --master_addr=127.0.0.1 --master_port=29511 lab/06_mesh.py --check

The run is minigpt/runners/lab06_mesh.py; the degrees and the per-dimension counter,
minigpt/parallel/mesh/.
"""

import sys

from minigpt.runners.lab06_mesh import main

if __name__ == "__main__":
    sys.exit(main())
