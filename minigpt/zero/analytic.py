"""The arithmetic of distributed training, as small pure functions.

Every number the theory pages print comes from here (through :mod:`minigpt.pages.theory`), so a
formula is written once, tested once, and reused by the labs. No torch: plain Python only.

Units. Memory is in bytes; ``GB`` is the ZeRO paper's gigabyte, 10**9 bytes. A model has
``psi`` (Ψ) parameters. Communication is counted per device, in bytes sent (a ring collective
receives exactly as much as it sends).

Sections, top to bottom:

1. model states: weights, gradients and optimizer state, and how ZeRO-1/2/3 shard them
   (Rajbhandari et al., 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter
   Models", Section 5 and Table 1);
2. communication: the ring collectives and the volume of each ZeRO stage (the same paper,
   Section 7);
3. activations (Korthikanti et al., 2022, "Reducing Activation Recomputation in Large
   Transformer Models", Table 2) and the compute of a training run (6 Ψ D, Kaplan et al., 2020);
4. the shape of a GPT (MiniGPT's layout, any size);
5. model, pipeline and hybrid parallelism: tensor-parallel traffic (Shoeybi et al., 2019,
   Megatron-LM), the pipeline bubble (Huang et al., 2019, GPipe), HSDP degrees, batch size and
   learning-rate scaling;
6. FSDP in practice: memory per device, checkpoints, gradient norms under sharding.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal

GB = 10**9  # the ZeRO paper's gigabyte
ADAM_K = 12  # bytes of optimizer state per parameter for mixed-precision Adam: fp32 copy, m, v
STAGES = (0, 1, 2, 3)  # 0 is plain data parallelism (DDP); 1, 2, 3 are ZeRO's P_os, P_os+g, P_os+g+p
STAGE_NAMES = {0: "DDP", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3"}
ZERO_PAPER_PSI = 7.5 * 10**9  # the model of the ZeRO paper's Table 1 (K = 12)


def _positive_int(name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


# --- 1. model states --------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelStates:
    """Bytes of model state held by one device."""

    params: float
    grads: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer


def bytes_per_param(param_bytes: int = 2, grad_bytes: int = 2, k: int = ADAM_K) -> int:
    """Bytes of model state per parameter on one unsharded device.

    The ZeRO paper's mixed-precision Adam recipe: fp16 (or bf16) weights (2) and gradients (2),
    plus K = 12 bytes of fp32 optimizer state (a master copy of the weights, Adam's m and v,
    4 bytes each): 2 + 2 + 12 = 16. Plain fp32 Adam happens to cost the same: 4 + 4 + 8.
    """
    return param_bytes + grad_bytes + k


def model_state_bytes(psi: float, n_devices: int = 1, stage: int = 0, k: int = ADAM_K) -> ModelStates:
    """Model-state bytes per device for ZeRO ``stage`` over ``n_devices`` (mixed precision).

    stage 0 (DDP)   (2 + 2 + K) Ψ
    stage 1 (P_os)  2Ψ + 2Ψ + KΨ/N
    stage 2 (P_os+g) 2Ψ + (2 + K)Ψ/N
    stage 3 (P_os+g+p) (2 + 2 + K)Ψ/N
    """
    if psi <= 0:
        raise ValueError(f"psi (the number of parameters) must be positive, got {psi!r}")
    _positive_int("n_devices", n_devices)
    if stage not in STAGES:
        raise ValueError(f"stage must be one of {STAGES} (0 = DDP, 3 = ZeRO-3), got {stage!r}")
    if k < 0:
        raise ValueError(f"k (optimizer bytes per parameter) must be >= 0, got {k!r}")
    n = n_devices
    return ModelStates(
        params=2 * psi / (n if stage >= 3 else 1),
        grads=2 * psi / (n if stage >= 2 else 1),
        optimizer=k * psi / (n if stage >= 1 else 1),
    )


def paper_round(gigabytes: float) -> str:
    """Round a GB figure the way the ZeRO paper's Table 1 prints it.

    From 100 GB up the paper prints whole gigabytes, cut (not rounded): 4187.5 -> "4187",
    513.5 -> "513", 257.75 -> "257". Below that, one decimal from 10 GB up and two below, halves
    rounded up, trailing zeros dropped: 41.25 -> "41.3", 7.5 -> "7.5", 1.875 -> "1.88",
    0.1171875 -> "0.12". (Read off every cell of its Table 1; ``tests/test_lab02_model.py``
    checks all 54.)
    """
    if gigabytes >= 100:
        return str(math.floor(gigabytes))
    places = Decimal("0.1") if gigabytes >= 10 else Decimal("0.01")
    rounded = Decimal(repr(gigabytes)).quantize(places, rounding=ROUND_HALF_UP)
    text = format(rounded, "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


# --- 2. communication -------------------------------------------------------------------------

RING_OPS = ("all-reduce", "reduce-scatter", "all-gather")


def ring_factor(n: int, op: str = "all-reduce") -> float:
    """Bytes each of ``n`` workers sends, as a multiple of the full buffer S, in a ring.

    A reduce-scatter (or an all-gather) is N - 1 steps, each moving a chunk of S/N: (N-1)/N.
    An all-reduce is a reduce-scatter followed by an all-gather: 2(N-1)/N, below 2 for any N.
    """
    _positive_int("n", n)
    if op not in RING_OPS:
        raise ValueError(f"op must be one of {RING_OPS}, got {op!r}")
    one_pass = (n - 1) / n
    return 2 * one_pass if op == "all-reduce" else one_pass


def ring_steps(n: int, op: str = "all-reduce") -> int:
    """Sequential send/recv steps of a ring collective (the latency term): 2(N-1) or N-1."""
    _positive_int("n", n)
    if op not in RING_OPS:
        raise ValueError(f"op must be one of {RING_OPS}, got {op!r}")
    return 2 * (n - 1) if op == "all-reduce" else n - 1


def ring_bytes_per_worker(size_bytes: float, n: int, op: str = "all-reduce") -> float:
    """Bytes one worker sends in a ring collective on a buffer of ``size_bytes``."""
    return ring_factor(n, op) * size_bytes


def naive_root_bytes(size_bytes: float, n: int) -> float:
    """Bytes the root receives when every worker sends its whole buffer to one root (which then
    sends the sum back, as much again): (N - 1) S, growing with N."""
    _positive_int("n", n)
    return (n - 1) * size_bytes


RING_PASSES = {"all-reduce": 2, "reduce-scatter": 1, "all-gather": 1}  # passes over the buffer

# The collectives one training step runs on the parameters/gradients, per ZeRO stage.
STEP_COLLECTIVES = {
    0: ("all-reduce",),  # DDP: gradients
    1: ("reduce-scatter", "all-gather"),  # gradients to their owner; updated parameters back
    2: ("reduce-scatter", "all-gather"),
    3: ("all-gather", "all-gather", "reduce-scatter"),  # params in forward, again in backward; grads
}


def comm_volume(psi: float, stage: int, n_devices: int | None = None) -> float:
    """Elements each device sends per step at ZeRO ``stage``.

    Without ``n_devices``, the paper's accounting (each pass over the buffer counts Ψ, the
    (N-1)/N factor taken as 1): 2Ψ for DDP, ZeRO-1 and ZeRO-2; 3Ψ for ZeRO-3. With it, the exact
    ring volume: the same times (N-1)/N. Multiply by the bytes of an element (2 in fp16/bf16).
    """
    if stage not in STAGES:
        raise ValueError(f"stage must be one of {STAGES}, got {stage!r}")
    passes = sum(RING_PASSES[op] for op in STEP_COLLECTIVES[stage])
    if n_devices is None:
        return passes * psi
    return passes * psi * ring_factor(n_devices, "all-gather")


# --- 3. activations and compute ---------------------------------------------------------------

RECOMPUTE = ("none", "selective", "full")


def activation_bytes_per_layer(
    seq_len: int,
    batch: int,
    hidden: int,
    heads: int,
    tensor_parallel: int = 1,
    sequence_parallel: bool = False,
    recompute: str = "none",
) -> float:
    """Activation bytes one transformer layer keeps for backward (Korthikanti et al., 2022).

    Their Table 2, with s = ``seq_len``, b = ``batch``, h = ``hidden``, a = ``heads``,
    t = ``tensor_parallel``; 16-bit activations and 1-byte dropout masks:

    none                      s b h (34 + 5 a s / h)        (t = 1)
    none, tensor parallel     s b h (10 + 24/t + 5 a s/(h t))
    + sequence parallel       s b h (34/t + 5 a s/(h t))
    selective recompute       drops the 5 a s/h term (the attention scores are recomputed)
    full recompute            2 s b h (only the layer's input is kept)
    """
    for name, value in (
        ("seq_len", seq_len),
        ("batch", batch),
        ("hidden", hidden),
        ("heads", heads),
        ("tensor_parallel", tensor_parallel),
    ):
        _positive_int(name, value)
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {RECOMPUTE}, got {recompute!r}")
    s, b, h, a, t = seq_len, batch, hidden, heads, tensor_parallel
    sbh = s * b * h
    if recompute == "full":
        return 2 * sbh
    attention_scores = 0.0 if recompute == "selective" else 5 * a * s / (h * t)
    if sequence_parallel:
        return sbh * (34 / t + attention_scores)
    return sbh * (10 + 24 / t + attention_scores)


def training_flops(psi: float, tokens: float) -> float:
    """Compute of a training run: about 6 Ψ D (2 Ψ per token forward, 4 Ψ backward)."""
    return 6 * psi * tokens


def training_days(flops: float, devices: int, sustained_flops_per_device: float) -> float:
    """Wall-clock days at a sustained rate per device, assuming perfect scaling."""
    _positive_int("devices", devices)
    return flops / (devices * sustained_flops_per_device) / 86400


# --- 4. the shape of a GPT --------------------------------------------------------------------


def gpt_block_params(n_embd: int, bias: bool = True) -> int:
    """Parameters of one MiniGPT block: 12 h^2 weights (attention 4 h^2, MLP 8 h^2), plus two
    LayerNorms and the MLP biases (9 h) when ``bias``. The attention has no bias (see model.py)."""
    h = n_embd
    weights = 3 * h * h + h * h + 4 * h * h + 4 * h * h
    return weights + (2 * 2 * h + 4 * h + h if bias else 2 * h)


def gpt_params(vocab_size: int, block_size: int, n_layer: int, n_embd: int, bias: bool = True) -> int:
    """Parameters of a GPT laid out like :class:`minigpt.model.MiniGPT` (tied output layer)."""
    h = n_embd
    embeddings = vocab_size * h + block_size * h
    final_norm = 2 * h if bias else h
    return embeddings + n_layer * gpt_block_params(h, bias) + final_norm


# --- 5. model, pipeline and hybrid parallelism ------------------------------------------------


def tensor_parallel_bytes_per_layer(
    seq_len: int, batch: int, hidden: int, tp: int, bytes_per_element: int = 2
) -> float:
    """Bytes one device sends per transformer layer (forward + backward) under Megatron-style
    tensor parallelism over ``tp`` devices: two all-reduces forward (attention, MLP) and two
    backward, each over the b s h activations."""
    _positive_int("tp", tp)
    return 4 * ring_bytes_per_worker(seq_len * batch * hidden * bytes_per_element, tp)


def context_parallel_bytes_per_layer(
    seq_len: int, batch: int, kv_hidden: int, cp: int, bytes_per_element: int = 2, gradients_home: bool = False
) -> float:
    """Bytes one device sends per transformer layer (forward + backward) under ring attention over
    ``cp`` devices, each holding s/c tokens, so that a key and value block is 2 s b h_kv / c
    elements. Forward: the blocks go round the ring, c - 1 hops. Backward: they go round again,
    and with them their partial gradients, as many elements, so the backward sends twice the
    forward's bytes: 6 (c - 1)/c s b h_kv elements in all, comparable with
    ``tensor_parallel_bytes_per_layer`` (forward + backward too). ``gradients_home`` adds the one
    more hop that brings each gradient block back to the device that owns it, as PyTorch's ring
    attention (``torch.distributed.tensor.experimental.context_parallel``) sends it."""
    _positive_int("cp", cp)
    _positive_int("kv_hidden", kv_hidden)
    block = 2 * seq_len * batch * kv_hidden * bytes_per_element / cp
    hops = 3 * (cp - 1) + (1 if gradients_home and cp > 1 else 0)
    return hops * block


def bubble_fraction(stages: int, micro_batches: int) -> float:
    """Fraction of a pipeline step each device sits idle (GPipe, and 1F1B as well):
    (p - 1) / (m + p - 1)."""
    _positive_int("stages", stages)
    _positive_int("micro_batches", micro_batches)
    return (stages - 1) / (micro_batches + stages - 1)


def hsdp_degrees(
    world_size: int, devices_per_node: int, shard_degree: int | None = None, replicas: int | None = None
) -> tuple[int, int]:
    """Choose and validate HSDP's (shard degree, replica count).

    * both given: their product must equal the world size;
    * one given: it must divide the world size, and the other is the quotient;
    * none given: shard inside a node (shard degree = devices per node) and replicate across
      nodes (replicas = world size / devices per node).
    """
    _positive_int("world_size", world_size)
    _positive_int("devices_per_node", devices_per_node)
    for name, value in (("shard_degree", shard_degree), ("replicas", replicas)):
        if value is not None:
            _positive_int(name, value)
    if shard_degree is not None and replicas is not None:
        if shard_degree * replicas != world_size:
            raise ValueError(
                f"shard_degree {shard_degree} x replicas {replicas} = "
                f"{shard_degree * replicas}, but the world size is {world_size}: "
                "the product must equal the world size"
            )
        return shard_degree, replicas
    if shard_degree is not None:
        if world_size % shard_degree:
            raise ValueError(
                f"shard_degree {shard_degree} does not divide the world size "
                f"{world_size}: pick a divisor of {world_size}"
            )
        return shard_degree, world_size // shard_degree
    if replicas is not None:
        if world_size % replicas:
            raise ValueError(
                f"replicas {replicas} does not divide the world size {world_size}: pick a divisor of {world_size}"
            )
        return world_size // replicas, replicas
    if world_size % devices_per_node:
        raise ValueError(
            f"the world size {world_size} is not a whole number of nodes of "
            f"{devices_per_node} devices: give shard_degree or replicas explicitly"
        )
    return devices_per_node, world_size // devices_per_node


def hsdp_groups(shard_degree: int, replicas: int) -> tuple[list[list[int]], list[list[int]]]:
    """The rank groups of an HSDP layout: shard groups are consecutive ranks (one node each by
    default); replica group j holds rank j of every shard group."""
    _positive_int("shard_degree", shard_degree)
    _positive_int("replicas", replicas)
    shard_groups = [list(range(r * shard_degree, (r + 1) * shard_degree)) for r in range(replicas)]
    replica_groups = [list(range(j, shard_degree * replicas, shard_degree)) for j in range(shard_degree)]
    return shard_groups, replica_groups


def effective_batch_size(micro_batch: int, accum: int, data_parallel: int) -> int:
    """Sequences per optimizer step: micro-batch x accumulation steps x data-parallel ranks."""
    for name, value in (("micro_batch", micro_batch), ("accum", accum), ("data_parallel", data_parallel)):
        _positive_int(name, value)
    return micro_batch * accum * data_parallel


def data_parallel_degree(
    world_size: int, tensor_parallel: int = 1, pipeline_parallel: int = 1, context_parallel: int = 1
) -> int:
    """The data-parallel degree a launcher derives: the devices left once the model-parallel
    dimensions are taken, W / (t p c), with W = processes per host x hosts. Tensor- and
    context-parallel ranks work on the same sequences and pipeline stages on the same
    micro-batches, so only these W / (t p c) groups see different samples."""
    for name, value in (
        ("world_size", world_size),
        ("tensor_parallel", tensor_parallel),
        ("pipeline_parallel", pipeline_parallel),
        ("context_parallel", context_parallel),
    ):
        _positive_int(name, value)
    model_parallel = tensor_parallel * pipeline_parallel * context_parallel
    if world_size % model_parallel:
        raise ValueError(
            f"tensor_parallel {tensor_parallel} x pipeline_parallel {pipeline_parallel} x context_parallel "
            f"{context_parallel} = {model_parallel} does not divide the world size {world_size}"
        )
    return world_size // model_parallel


def min_global_batch(
    world_size: int, tensor_parallel: int = 1, pipeline_parallel: int = 1, context_parallel: int = 1
) -> int:
    """The smallest global batch (sequences per optimizer step): one sequence per data-parallel
    rank, a micro-batch of 1 without accumulation. Model parallelism lowers it by t p c."""
    return effective_batch_size(
        1, 1, data_parallel_degree(world_size, tensor_parallel, pipeline_parallel, context_parallel)
    )


LR_RULES = ("linear", "sqrt")


def scaled_lr(base_lr: float, base_batch: int, batch: int, rule: str = "linear") -> float:
    """A learning rate tuned at ``base_batch`` moved to ``batch``: linear (Goyal et al., 2017)
    or square-root (Krizhevsky, 2014; Malladi et al., 2022 for Adam) scaling."""
    _positive_int("base_batch", base_batch)
    _positive_int("batch", batch)
    if rule not in LR_RULES:
        raise ValueError(f"rule must be one of {LR_RULES}, got {rule!r}")
    ratio = batch / base_batch
    return base_lr * (ratio if rule == "linear" else math.sqrt(ratio))


# --- 6. FSDP in practice ----------------------------------------------------------------------


@dataclass(frozen=True)
class FsdpMemory:
    """Bytes per device under FSDP with mixed precision (fp32 shards, bf16 compute)."""

    sharded_params: float
    sharded_grads: float
    optimizer: float
    gathered: float  # unsharded low-precision parameters of the units in flight
    unsharded_grad: float  # the running unit's whole gradient, before its reduce-scatter

    @property
    def total(self) -> float:
        return self.sharded_params + self.sharded_grads + self.optimizer + self.gathered + self.unsharded_grad


def fsdp_memory(
    psi: float,
    n_devices: int,
    unit_params: float,
    units_in_flight: int = 2,
    master_bytes: int = 4,
    compute_bytes: int = 2,
    optimizer_bytes: int = 8,
) -> FsdpMemory:
    """FSDP's peak model-state bytes per device, in the backward pass: fp32 sharded parameters and
    gradients and Adam's two moments (4 + 4 + 8 bytes per parameter, over N), the
    ``units_in_flight`` wrap units whose parameters are all-gathered in the compute dtype (the one
    running and the one prefetched), and the running unit's whole gradient in the compute dtype,
    which exists until its reduce-scatter (what PyTorch's ``BackwardPrefetch.BACKWARD_PRE`` counts:
    the current parameters, the next ones and the current gradient). Lab 02's ZeRO-3 working buffer
    (``minigpt.zero.memory.working_buffer``) counts the same unit's weights and gradient. A
    ``reduce_dtype`` wider than the compute dtype adds a short-lived cast copy, not counted."""
    _positive_int("n_devices", n_devices)
    _positive_int("units_in_flight", units_in_flight)
    return FsdpMemory(
        sharded_params=master_bytes * psi / n_devices,
        sharded_grads=master_bytes * psi / n_devices,
        optimizer=optimizer_bytes * psi / n_devices,
        gathered=units_in_flight * unit_params * compute_bytes,
        unsharded_grad=unit_params * compute_bytes,
    )


def checkpoint_bytes(psi: float, param_bytes: int = 4, optimizer_bytes: int = 8) -> float:
    """Bytes of a training checkpoint: fp32 parameters and Adam's two moments."""
    return psi * (param_bytes + optimizer_bytes)


def global_grad_norm(local_norms: Sequence[float], norm_type: float = 2.0, replicated_norm: float = 0.0) -> float:
    """The norm of the whole gradient from each shard's local norm.

    For a p-norm, each rank raises the norm of its shard to the p-th power, the powers are summed
    with an all-reduce, and the p-th root is taken: sqrt(sum of squares) for p = 2. For the
    max-norm the all-reduce takes the maximum instead. ``replicated_norm`` is the norm of the
    gradients every rank holds whole (parameters left unsharded): it is added once, after the
    all-reduce, since summing it over the ranks would count it N times (FSDP's
    ``clip_grad_norm_`` does the same).
    """
    if not local_norms:
        raise ValueError("local_norms is empty: pass one norm per shard")
    if math.isinf(norm_type):
        return max(max(local_norms), replicated_norm)
    if norm_type <= 0:
        raise ValueError(f"norm_type must be positive or inf, got {norm_type!r}")
    total = sum(x**norm_type for x in local_norms) + replicated_norm**norm_type
    return total ** (1 / norm_type)


def clip_coefficient(total_norm: float, max_norm: float, eps: float = 1e-6) -> float:
    """The factor every gradient is multiplied by when clipping to ``max_norm`` (as
    torch.nn.utils.clip_grad_norm_ computes it: max_norm / (norm + 1e-6), capped at 1)."""
    return min(1.0, max_norm / (total_norm + eps))
