"""Device meshes: the ranks laid out as a grid, one parallelism per dimension.

A world of W ranks can be read as a table. With HSDP on two nodes of two ranks each, W = 4 is a
2 x 2 mesh with dimensions named ``("replicate", "shard")``::

                 shard 0   shard 1
    replicate 0   rank 0    rank 1      <- node 0: one shard group
    replicate 1   rank 2    rank 3      <- node 1: another shard group

Each *row* is a shard group (consecutive ranks, one node: fast links); each *column* is a
replica group (the ranks that hold the same shard, one per node: slow links). A collective runs
along one dimension, inside the groups of that dimension:

* ``shard``: FSDP2's all-gathers of the weights (forward and backward) and the reduce-scatter of
  the gradients: (S-1)/S of each unit per rank, S ranks per group;
* ``replicate``: after each reduce-scatter, the all-reduce of the unit's gradient *shard* (1/S of
  the unit) with the other replicas: 2(R-1)/R of it, across nodes.

The same grid read as ``("dp", "tp")`` is data parallelism across tensor-parallel groups: along
``tp`` the activations' all-reduces of Lab 05 (every layer, every micro-batch), along ``dp`` the
gradient all-reduce of DDP (once per step, of this rank's cut of the model).
``torch.distributed.device_mesh.init_device_mesh`` builds the grid and its groups
(``mesh.get_group("shard")`` is this rank's row); this package resolves the degrees
(:mod:`.degrees`, pure arithmetic as launchers do it) and counts what runs on each dimension
(:mod:`.hsdp`).
"""

from minigpt.parallel.mesh.degrees import (
    BatchPlan,
    resolve_accelerate,
    resolve_hsdp,
    sagemaker_dp_degree,
    torchrun_layout,
)

__all__ = ["BatchPlan", "resolve_accelerate", "resolve_hsdp", "sagemaker_dp_degree", "torchrun_layout"]
