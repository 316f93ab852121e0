"""How launchers turn a world size into the degrees of a mesh: small, pure functions.

Every framework asks for the same arithmetic with different names. The degrees of the mesh's
dimensions must multiply to the world size W; a launcher lets you give some and infers the rest:

* **OLMo-core (HSDP)**: by default shard inside a node and replicate across nodes, so the shard
  degree is the ranks per node (``LOCAL_WORLD_SIZE``) and the replicate degree the number of
  nodes; give one and the other is W divided by it (:func:`resolve_hsdp`);
* **Accelerate** (``ParallelismConfig``): ``dp_replicate x dp_shard x tp x cp = W``, every degree 1
  unless given, and only the all-ones case inferred (``dp_replicate = W``) (:func:`resolve_accelerate`);
* **SageMaker model parallelism**: the data-parallel degree is what is left once the pipeline
  takes its stages, ``processes_per_host x instance_count / pipeline_degree``
  (:func:`sagemaker_dp_degree`).

Only the data-parallel ranks see different samples, so the batch an optimizer step sees is
``micro_batch x grad_accum x dp`` (:class:`BatchPlan`), and a learning rate tuned for one rank is
moved to it by the linear or the square-root rule. Nothing here touches ``torch.distributed``:
the degrees are checked before any process group exists, and every error names every number
involved and the world size.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from minigpt.zero import analytic as za


def _positive(name: str, value: int, world_size: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} {value!r} is not a positive integer (world size {world_size})")


def resolve_hsdp(
    world_size: int, local_world_size: int, shard: int | None = None, replicate: int | None = None
) -> tuple[int, int]:
    """HSDP's ``(replicate, shard)`` degrees, OLMo-core style.

    * neither given: shard over the ranks of a node (``local_world_size``), replicate over the
      nodes (``world_size // local_world_size``); the world must be a whole number of nodes;
    * one given: it must divide the world size, the other is the quotient;
    * both given: their product must be the world size.
    """
    _positive("world size", world_size, world_size)
    _positive("local world size", local_world_size, world_size)
    for name, value in (("shard", shard), ("replicate", replicate)):
        if value is not None:
            _positive(name, value, world_size)
    if shard is not None and replicate is not None and shard * replicate != world_size:
        raise ValueError(
            f"replicate {replicate} x shard {shard} = {replicate * shard}, but the world size is {world_size}: "
            "the product must equal it"
        )
    if shard is not None and replicate is None and world_size % shard:
        raise ValueError(
            f"shard {shard} does not divide the world size {world_size}: replicate = {world_size} / {shard} "
            f"is not whole; use a divisor of {world_size}"
        )
    if replicate is not None and shard is None and world_size % replicate:
        raise ValueError(
            f"replicate {replicate} does not divide the world size {world_size}: shard = {world_size} / "
            f"{replicate} is not whole; use a divisor of {world_size}"
        )
    if shard is None and replicate is None and world_size % local_world_size:
        raise ValueError(
            f"the world size {world_size} is not a whole number of nodes of {local_world_size} ranks "
            f"(local world size {local_world_size}): give the shard or the replicate degree"
        )
    shard_degree, replicas = za.hsdp_degrees(world_size, local_world_size, shard, replicate)
    return replicas, shard_degree


def resolve_accelerate(
    world_size: int, dp_replicate: int = 1, dp_shard: int = 1, tp: int = 1, cp: int = 1
) -> dict[str, int]:
    """Accelerate's ``ParallelismConfig`` checked against ``world_size`` processes: every degree
    defaults to 1; when all four are 1, ``dp_replicate`` becomes the world size (plain DDP);
    otherwise ``dp_replicate x dp_shard x tp x cp`` must equal the world size, nothing is inferred,
    and tensor or context parallelism is refused beside pure replication (``dp_replicate > 1``
    with ``dp_shard == 1``: Accelerate composes TP or CP with FSDP or HSDP only). Returns the four
    degrees and ``dp = dp_replicate x dp_shard`` (the ranks that see different samples)."""
    _positive("world size", world_size, world_size)
    for name, value in (("dp_replicate", dp_replicate), ("dp_shard", dp_shard), ("tp", tp), ("cp", cp)):
        _positive(name, value, world_size)
    given = f"dp_replicate {dp_replicate} x dp_shard {dp_shard} x tp {tp} x cp {cp}"
    if (tp > 1 or cp > 1) and dp_replicate > 1 and dp_shard == 1:
        raise ValueError(
            f"{given}: tensor or context parallelism beside pure replication (dp_shard 1) is refused; "
            f"shard instead (dp_shard > 1, dp_replicate 1) or use HSDP (both > 1), world size {world_size}"
        )
    if dp_replicate * dp_shard * tp * cp == 1:
        dp_replicate = world_size  # every degree left at 1: plain data parallelism over the world
    product = dp_replicate * dp_shard * tp * cp
    if product != world_size:
        raise ValueError(
            f"{given} = {product}, but the world size is {world_size}: the product must equal it "
            "(nothing is inferred unless every degree is 1)"
        )
    return {"dp_replicate": dp_replicate, "dp_shard": dp_shard, "tp": tp, "cp": cp, "dp": dp_replicate * dp_shard}


def sagemaker_dp_degree(processes_per_host: int, instance_count: int, pipeline_degree: int) -> int:
    """SageMaker's data-parallel degree: ``processes_per_host x instance_count / pipeline_degree``."""
    world_size = processes_per_host * instance_count if processes_per_host > 0 and instance_count > 0 else 0
    for name, value in (
        ("processes_per_host", processes_per_host),
        ("instance_count", instance_count),
        ("pipeline_degree", pipeline_degree),
    ):
        _positive(name, value, world_size)
    if world_size % pipeline_degree:
        raise ValueError(
            f"pipeline_degree {pipeline_degree} does not divide the world size {world_size} "
            f"(processes_per_host {processes_per_host} x instance_count {instance_count})"
        )
    return world_size // pipeline_degree


@dataclass(frozen=True)
class BatchPlan:
    """The batch one optimizer step sees, and a learning rate moved to it.

    ``base_lr`` was tuned at ``base_batch`` sequences per step (default: one rank's own,
    ``micro_batch x grad_accum``); at ``effective_batch`` the linear rule (Goyal et al., 2017)
    multiplies it by the ratio, the square-root rule (Malladi et al., 2022, for Adam) by its root.
    """

    micro_batch: int
    grad_accum: int
    dp_world_size: int
    base_lr: float
    base_batch: int | None = None

    def __post_init__(self) -> None:
        for name in ("micro_batch", "grad_accum", "dp_world_size"):
            _positive(name, getattr(self, name), self.dp_world_size)
        if self.base_batch is not None:
            _positive("base_batch", self.base_batch, self.dp_world_size)
        if not self.base_lr > 0:
            raise ValueError(f"base_lr {self.base_lr!r} is not a positive learning rate")

    @property
    def effective_batch(self) -> int:
        return za.effective_batch_size(self.micro_batch, self.grad_accum, self.dp_world_size)

    @property
    def reference_batch(self) -> int:
        return self.micro_batch * self.grad_accum if self.base_batch is None else self.base_batch

    def lr(self, rule: str) -> float:
        """``base_lr`` moved from :attr:`reference_batch` to :attr:`effective_batch` by ``rule``."""
        return za.scaled_lr(self.base_lr, self.reference_batch, self.effective_batch, rule)

    def describe(self) -> str:
        return (
            f"effective batch {self.micro_batch} x {self.grad_accum} x {self.dp_world_size} (micro-batch x "
            f"accumulation x data-parallel ranks) = {self.effective_batch} sequences | lr {self.base_lr:g} tuned "
            f"at {self.reference_batch}: linear rule {self.lr('linear'):.4g}, sqrt rule {self.lr('sqrt'):.4g}"
        )


def torchrun_layout(environ: Mapping[str, str] | None = None) -> tuple[int, int]:
    """``(world_size, local_world_size)`` from torchrun's ``WORLD_SIZE`` and ``LOCAL_WORLD_SIZE``
    (a world of one when unset; the local world is the whole world when only ``WORLD_SIZE`` is set)."""
    environ = os.environ if environ is None else environ

    def read(name: str, default: int) -> int:
        text = environ.get(name)
        if text is None:
            return default
        try:
            value = int(text.strip())
        except ValueError:
            value = 0
        if value < 1:
            raise ValueError(f"{name}={text}: not a positive integer; torchrun sets it to the number of processes")
        return value

    world_size = read("WORLD_SIZE", 1)
    local_world_size = read("LOCAL_WORLD_SIZE", world_size)
    if world_size % local_world_size:
        raise ValueError(
            f"LOCAL_WORLD_SIZE={local_world_size} does not divide WORLD_SIZE={world_size}: every node runs "
            "the same number of processes"
        )
    return world_size, local_world_size
