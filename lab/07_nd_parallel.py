"""Lab 07: every dimension at once. Eight ranks as one 4-D mesh, dp_replicate x dp_shard x cp x tp,
built from the course's own pieces (Lab 05's tensor parallelism and ring attention inside Lab 04's
fully_shard, the replicas of Lab 06's HSDP), each layout held against one process.

    torchrun --nproc_per_node=8 lab/07_nd_parallel.py --check --report out/lab07.json      # both layouts, proved
    torchrun --nproc_per_node=8 lab/07_nd_parallel.py --dp-replicate 1 --dp-shard 2 --cp 2 --tp 2
    # two "nodes" of four ranks on one machine:
    torchrun --nnodes=2 --nproc_per_node=4 --node_rank=0 --master_addr=127.0.0.1 --master_port=29517 lab/07_nd_parallel.py --check &
    torchrun --nnodes=2 --nproc_per_node=4 --node_rank=1 --master_addr=127.0.0.1 --master_port=29517 lab/07_nd_parallel.py --check

The run is minigpt/runners/lab07_nd_parallel.py; the mesh, minigpt/parallel/mesh/nd.py; the
composition, minigpt/parallel/mesh/compose.py.
"""

import sys

from minigpt.runners.lab07_nd_parallel import main

if __name__ == "__main__":
    sys.exit(main())
