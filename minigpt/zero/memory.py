"""How many bytes one device holds under DDP and ZeRO-1/2/3: the model of Lab 02.

:mod:`minigpt.zero.analytic` has the ZeRO paper's headline formula (mixed-precision Adam, model
states only). This module widens it to what a learner meets in practice:

* a **precision recipe** (:data:`RECIPES`): bytes per parameter of the weights the device computes
  with, of the gradients, and of the optimizer state K;
* a **working buffer**: the one unit (layer, bucket) that stages 2 and 3 must hold whole for a
  moment: its full gradient before the reduce-scatter (stage 2), and also its all-gathered weights
  (stage 3). The paper leaves it out of Table 1; :func:`device_memory` adds it when a largest
  layer is given, and the simulator (:mod:`minigpt.zero.simulate`) really holds it;
* **CPU offload** (ZeRO-Offload): the optimizer state, and from stage 2 the gradient shards it
  updates, live in host memory; at stage 3 the weight shards can go too (ZeRO-Infinity's
  ``offload_param``), leaving only the working buffer on the device;
* **HSDP**: shard over a group of S devices, replicate over R groups: memory is that of ZeRO over
  S devices, whatever R is;
* **activations**, per layer from Korthikanti et al. (2022), Table 2
  (:func:`minigpt.zero.analytic.activation_bytes_per_layer`), with or without checkpointing;
* **DeepSpeed's own estimators**, re-derived in :func:`deepspeed_estimate`, for comparison with
  the tool a learner would otherwise use.

Everything is in bytes, per device. No torch, no numpy needed: the command line
(``python lab/02_zero.py memory ...``) answers at once.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from minigpt.zero import analytic as za


@dataclass(frozen=True)
class Recipe:
    """Bytes per parameter of each kind of model state, on one unsharded device."""

    name: str
    param_bytes: int  # the weights forward and backward compute with
    grad_bytes: int  # the gradients held (all gradient buffers together)
    optimizer_bytes: int  # K: what the optimizer keeps (master weights, Adam's m and v)
    reduce_bytes: int  # bytes per element of the gradient that is communicated
    description: str

    @property
    def total(self) -> int:
        return self.param_bytes + self.grad_bytes + self.optimizer_bytes


RECIPES = {
    "mixed": Recipe(
        "mixed",
        2,
        2,
        12,
        2,
        "fp16/bf16 weights and gradients; fp32 master weights, Adam m and v (K = 12): the ZeRO paper's recipe",
    ),
    "mixed-fp32-grads": Recipe(
        "mixed-fp32-grads",
        2,
        2 + 4,
        12,
        4,
        "as mixed, plus an fp32 gradient-accumulation buffer (4 bytes), "
        "which is what is reduced (Megatron-LM's main_grad)",
    ),
    "fp32": Recipe("fp32", 4, 4, 8, 4, "fp32 weights and gradients, Adam m and v (no master copy): MiniGPT's own runs"),
}


def recipe(name: str) -> Recipe:
    """The recipe called ``name`` (ValueError naming the valid ones)."""
    if name not in RECIPES:
        raise ValueError(f"unknown precision recipe {name!r}; choose one of {', '.join(RECIPES)}")
    return RECIPES[name]


def _check_psi(psi: float) -> None:
    if not psi > 0:
        raise ValueError(f"the parameter count must be positive, got {psi!r}")


def _check_stage(stage: int) -> None:
    if stage not in za.STAGES:
        raise ValueError(f"stage {stage!r} does not exist; choose one of 0 (DDP), 1, 2, 3")


@dataclass(frozen=True)
class DeviceMemory:
    """Model-state bytes of one device (and of the host memory it offloads to)."""

    params: float
    grads: float
    optimizer: float
    working: float  # the unit held whole for a moment (stage 2: its gradient; stage 3: + weights)
    host_params: float = 0.0
    host_grads: float = 0.0
    host_optimizer: float = 0.0

    @property
    def device(self) -> float:
        return self.params + self.grads + self.optimizer + self.working

    @property
    def host(self) -> float:
        return self.host_params + self.host_grads + self.host_optimizer

    def as_dict(self) -> dict:
        return {**asdict(self), "device": self.device, "host": self.host}


def working_buffer(stage: int, largest_layer: float, rec: Recipe) -> float:
    """Bytes of the one unit a stage must hold whole: none for DDP and ZeRO-1 (the whole gradient
    is there anyway), the unit's gradient for ZeRO-2, its weights and gradient for ZeRO-3."""
    if largest_layer < 0:
        raise ValueError(f"the largest layer must have >= 0 parameters, got {largest_layer!r}")
    if stage == 2:
        return rec.grad_bytes * largest_layer
    if stage == 3:
        return (rec.param_bytes + rec.grad_bytes) * largest_layer
    return 0.0


def device_memory(
    psi: float,
    n_devices: int,
    stage: int,
    recipe_name: str = "mixed",
    largest_layer: float = 0,
    offload_optimizer: bool = False,
    offload_params: bool = False,
) -> DeviceMemory:
    """Bytes of model state on one of ``n_devices`` at ZeRO ``stage``.

    Stage s shards the optimizer state (s >= 1), the gradients (s >= 2) and the weights (s = 3)
    over the N devices; what is not sharded is replicated. With ``largest_layer = 0`` and the
    ``mixed`` recipe this is exactly the ZeRO paper's (2 + 2 + K)Ψ family.

    ``offload_optimizer`` moves the optimizer state to the host, and from stage 2 the gradient
    shards too (the optimizer that updates them runs there); ``offload_params`` (stage 3 only)
    moves the weight shards as well. Host figures are per device: a node with G devices needs G
    times as much.
    """
    _check_psi(psi)
    za._positive_int("n_devices", n_devices)
    _check_stage(stage)
    rec = recipe(recipe_name)
    if offload_params and stage != 3:
        raise ValueError(f"offloading the parameters needs stage 3 (they are sharded only there), got stage {stage}")
    n = n_devices
    params = rec.param_bytes * psi / (n if stage >= 3 else 1)
    grads = rec.grad_bytes * psi / (n if stage >= 2 else 1)
    optimizer = rec.optimizer_bytes * psi / (n if stage >= 1 else 1)
    host_params = host_grads = host_optimizer = 0.0
    if offload_optimizer:
        host_optimizer, optimizer = optimizer, 0.0
        if stage >= 2:
            host_grads, grads = grads, 0.0
    if offload_params:
        host_params, params = params, 0.0
    return DeviceMemory(
        params, grads, optimizer, working_buffer(stage, largest_layer, rec), host_params, host_grads, host_optimizer
    )


def hsdp_memory(
    psi: float, shard_degree: int, replicas: int, stage: int = 3, recipe_name: str = "mixed", largest_layer: float = 0
) -> DeviceMemory:
    """HSDP: ZeRO ``stage`` inside a shard group of ``shard_degree`` devices, the group replicated
    ``replicas`` times. Memory depends on the shard degree only: replicas add copies, not
    savings."""
    za._positive_int("replicas", replicas)
    if stage == 0:
        raise ValueError("HSDP shards inside a group: it needs stage 1, 2 or 3, got stage 0")
    return device_memory(psi, shard_degree, stage, recipe_name, largest_layer)


RECOMPUTE = ("none", "full")


def activation_bytes(
    layers: int, seq_len: int, micro_batch: int, hidden: int, heads: int, checkpointing: bool = False
) -> float:
    """Activation bytes of ``layers`` transformer layers for one micro-batch (16-bit activations).

    Korthikanti et al., 2022, "Reducing Activation Recomputation in Large Transformer Models",
    Table 2: a layer keeps s b h (34 + 5 a s / h) bytes for backward. With activation
    checkpointing every layer keeps only its input (2 s b h), and the layer being recomputed
    needs its full set again for its own backward: L * 2sbh + sbh (34 + 5as/h).
    """
    za._positive_int("layers", layers)
    full = za.activation_bytes_per_layer(seq_len, micro_batch, hidden, heads)
    if not checkpointing:
        return layers * full
    kept = za.activation_bytes_per_layer(seq_len, micro_batch, hidden, heads, recompute="full")
    return layers * kept + full


def logits_bytes(batch: int, seq_len: int, vocab: int, bytes_per: int = 4, with_grad: bool = True) -> float:
    """Bytes of the language-model head's output, the [B, S, V] logits: B S V bytes_per, twice
    with their gradient (the same shape, made in the backward pass of the loss).

    Nothing in Korthikanti et al.'s per-layer count holds it, and activation checkpointing of the
    layers leaves it whole. With a vocabulary of 10^5 tokens it is the largest single tensor of a
    step; cross-entropy computed in fp32 makes (and keeps, for backward) an fp32 copy even when
    the logits are 16-bit. A chunked or fused cross-entropy never makes the whole of it.
    """
    for name, value in (("batch", batch), ("seq_len", seq_len), ("vocab", vocab), ("bytes_per", bytes_per)):
        za._positive_int(name, value)
    return batch * seq_len * vocab * bytes_per * (2 if with_grad else 1)


def young_interval(save_seconds: float, mtbf_seconds: float) -> tuple[float, float]:
    """Young's checkpoint interval ``τ = sqrt(2 δ M)`` for a save of ``δ`` seconds and a mean time
    between failures ``M``, and the fraction of time it loses: ``δ/τ`` saving plus ``τ/(2M)`` of work
    redone after a failure (on average half an interval)."""
    if not (save_seconds > 0 and mtbf_seconds > 0):
        raise ValueError(
            f"a save of {save_seconds} s and a mean time between failures of {mtbf_seconds} s: both must be > 0"
        )
    tau = math.sqrt(2 * save_seconds * mtbf_seconds)
    return tau, save_seconds / tau + tau / (2 * mtbf_seconds)


# --- DeepSpeed's estimators -------------------------------------------------------------------
# DeepSpeed prints memory estimates with estimate_zero2_model_states_mem_needs (in
# deepspeed/runtime/zero/stage_1_and_2.py) and estimate_zero3_model_states_mem_needs (stage3.py).
# The arithmetic below is ours, re-derived from those functions as of DeepSpeed's main branch of
# 2026-08-22 (commit edaa722); the figures are per node for the CPU and per GPU, and carry a
# 1.5x "additional buffer factor" on the CPU side. DeepSpeed's docs (memory.rst) still print an
# older stage-2 GPU formula, 4Ψ + 16Ψ/N; the code now says 2Ψ + 18Ψ/N (fp16 weights whole;
# fp16 and fp32 gradients, fp32 weights and Adam's m and v sharded).

DEEPSPEED_STAGES = (2, 3)


@dataclass(frozen=True)
class DeepSpeedEstimate:
    cpu: int  # bytes of CPU memory per node
    gpu: int  # bytes per GPU
    options: str  # the options as DeepSpeed prints them


def deepspeed_estimate(
    stage: int,
    total_params: float,
    largest_layer_params: float = 0,
    gpus_per_node: int = 1,
    nodes: int = 1,
    offload_optimizer: bool = True,
    offload_params: bool = True,
    zero_init: bool = True,
    buffer_factor: float = 1.5,
) -> DeepSpeedEstimate:
    """What DeepSpeed's estimator of ``stage`` (2 or 3) answers for these inputs."""
    if stage not in DEEPSPEED_STAGES:
        raise ValueError(f"DeepSpeed estimates stages 2 and 3 only, got stage {stage!r}")
    _check_psi(total_params)
    za._positive_int("gpus_per_node", gpus_per_node)
    za._positive_int("nodes", nodes)
    psi, g, total_gpus = total_params, gpus_per_node, gpus_per_node * nodes
    if stage == 2:
        if offload_optimizer:
            gpu = 2 * psi  # fp16 weights only
            cpu = psi * max(4 * total_gpus, 16) * buffer_factor
        else:
            gpu = 2 * psi + int(18 * psi / total_gpus)
            cpu = psi * 4 * g * buffer_factor
        return DeepSpeedEstimate(int(cpu), int(gpu), f"offload_optimizer={'cpu' if offload_optimizer else 'none'}")
    largest = 4 * largest_layer_params  # fp16 weights gathered + fp16 gradient of the largest layer
    per_node = 1 / nodes
    if offload_optimizer and offload_params:
        gpu = largest
        cpu_factor = 18 * per_node if zero_init else max(4 * g, 18 * per_node)
        cpu = psi * cpu_factor * buffer_factor
    elif offload_optimizer:
        gpu = largest + int(2 * psi / total_gpus)
        cpu_factor = 16 * per_node if zero_init else max(4 * g, 16 * per_node)
        cpu = psi * cpu_factor * buffer_factor
    else:
        gpu = largest + int(18 * psi / total_gpus)
        cpu = (largest_layer_params if zero_init else psi) * 4 * g * buffer_factor
    options = (
        f"offload_param={'cpu' if offload_params and offload_optimizer else 'none'}, "
        f"offload_optimizer={'cpu' if offload_optimizer else 'none'}, zero_init={int(zero_init)}"
    )
    return DeepSpeedEstimate(int(cpu), int(gpu), options)


def deepspeed_rows(
    stage: int, total_params: float, largest_layer_params: float = 0, gpus_per_node: int = 1, nodes: int = 1
) -> list[DeepSpeedEstimate]:
    """Every option combination DeepSpeed's ``..._all_cold`` printer lists, in its order."""
    if stage == 2:
        return [deepspeed_estimate(2, total_params, 0, gpus_per_node, nodes, offload) for offload in (True, False)]
    rows = []
    for offload_optimizer, offload_params in ((True, True), (True, False), (False, False)):
        for zero_init in (True, False):
            rows.append(
                deepspeed_estimate(
                    3,
                    total_params,
                    largest_layer_params,
                    gpus_per_node,
                    nodes,
                    offload_optimizer,
                    offload_params,
                    zero_init,
                )
            )
    return rows
