"""The ways of running FSDP that Lab 03 compares, and what each should do.

* :data:`VARIANTS`: FSDP2 (``fully_shard`` per block, then the root) with implicit, explicit
  forward and explicit backward prefetch, ``reshard_after_forward`` off, and asynchronous
  unshards; FSDP1 (``FullyShardedDataParallel``) without prefetch, with ``BACKWARD_PRE``,
  ``BACKWARD_POST`` and ``forward_prefetch``;
* :func:`predict_event_order` / :func:`predict_all_gather_order`: the order in which a variant
  issues its all-gathers and reduce-scatters, derived from FSDP's rules (the lab holds it
  against the recorded run; a learner writes :func:`predict_all_gather_order` in Exercise 3.1);
* :func:`wrap`, :func:`sharded_optimizer`, :func:`clip_gradients`: MiniGPT wrapped, its AdamW over
  the shards, and gradient clipping by the global norm, for either API.

:mod:`minigpt.runners.lab03_fsdp_prefetch` runs them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from minigpt.fsdp.trace import FSDP1_WRAPPED
from minigpt.model import Block, MiniGPT
from minigpt.train import TrainConfig, build_model, build_optimizer
from minigpt.zero.comm import padded as padded_rows


@dataclass(frozen=True)
class Variant:
    """One way of running FSDP. Depths count units: 1 = the next (forward) or previous (backward) one."""

    api: str  # "fsdp2" (fully_shard) or "fsdp1" (FullyShardedDataParallel)
    en: str
    es: str
    forward_prefetch: int = 0  # units a pre-forward all-gathers ahead (0: none; FSDP2: an explicit list)
    backward_prefetch: int = 1  # units a pre-backward all-gathers ahead (0: none)
    explicit_backward: bool = False  # FSDP2: backward prefetch lists set by hand, not FSDP's default
    backward_post: bool = False  # FSDP1 BACKWARD_POST: prefetch after a block's backward
    reshard_after_forward: bool = True
    async_unshard: bool = False  # FSDP2: pre-forward/pre-backward unshards with async_op=True


VARIANTS: dict[str, Variant] = {
    "fsdp2-implicit": Variant(
        "fsdp2", "FSDP2 defaults (implicit backward prefetch)", "FSDP2 por defecto (precarga implícita en el backward)"
    ),
    "fsdp2-explicit-forward": Variant(
        "fsdp2",
        "FSDP2, explicit forward prefetch of the next block",
        "FSDP2, precarga explícita del bloque siguiente en el forward",
        forward_prefetch=1,
    ),
    "fsdp2-explicit-backward": Variant(
        "fsdp2",
        "FSDP2, explicit backward prefetch of the two previous blocks",
        "FSDP2, precarga explícita de los dos bloques anteriores en el backward",
        backward_prefetch=2,
        explicit_backward=True,
    ),
    "fsdp2-no-reshard": Variant(
        "fsdp2", "FSDP2, reshard_after_forward=False", "FSDP2, reshard_after_forward=False", reshard_after_forward=False
    ),
    "fsdp2-async-unshard": Variant(
        "fsdp2", "FSDP2 defaults, asynchronous unshard", "FSDP2 por defecto, unshard asíncrono", async_unshard=True
    ),
    "fsdp2-async-explicit": Variant(
        "fsdp2",
        "FSDP2, asynchronous unshard, explicit prefetch (forward 1, backward 2)",
        "FSDP2, unshard asíncrono, precarga explícita (forward 1, backward 2)",
        forward_prefetch=1,
        backward_prefetch=2,
        explicit_backward=True,
        async_unshard=True,
    ),
    "fsdp1-no-prefetch": Variant(
        "fsdp1", "FSDP1, backward_prefetch=None", "FSDP1, backward_prefetch=None", backward_prefetch=0
    ),
    "fsdp1-backward-pre": Variant("fsdp1", "FSDP1, BACKWARD_PRE (its default)", "FSDP1, BACKWARD_PRE (por defecto)"),
    "fsdp1-backward-post": Variant("fsdp1", "FSDP1, BACKWARD_POST", "FSDP1, BACKWARD_POST", backward_post=True),
    "fsdp1-forward-prefetch": Variant(
        "fsdp1",
        "FSDP1, forward_prefetch=True (and BACKWARD_PRE)",
        "FSDP1, forward_prefetch=True (y BACKWARD_PRE)",
        forward_prefetch=1,
    ),
}


# ----------------------------------------------------------------------------------------------
# What each variant should do: the order of one step's all-gathers, derived from FSDP's rules


def predict_event_order(n_blocks: int, variant: str) -> list[str]:
    """The training thread's order, in one step after the first, of ``"all-gather U"``,
    ``"forward B"``, ``"backward B"`` (a block's computation starts) and ``"reduce-scatter U"``.

    The rules, as FSDP's code applies them (for 2 or more ranks; one rank gathers nothing):

    * A unit's pre-forward (pre-backward) all-gathers it unless it is already gathered or in
      flight, then all-gathers the ``forward_prefetch`` next (``backward_prefetch`` previous)
      units; then the unit computes: the root its embeddings, a block itself.
    * After its forward a block is resharded (unless ``reshard_after_forward`` is off); the root
      is not: backward is about to use it. Backward begins with the root's pre-backward.
    * A unit's post-backward reshards it (BACKWARD_POST then prefetches the previous units) and
      reduce-scatters its gradients. FSDP2 runs it when the gradient reaches the unit's input,
      right after the block's backward (the root's at the very end). FSDP1 runs it when the
      unit's flat parameter has its gradient, and the autograd engine runs the most recently
      created work first: the flat parameter is reached through views made when the unit was
      gathered in forward, so its post-backward waits for the backward of every computation
      that began after that gather. A block prefetched in forward therefore reduce-scatters
      only after the backward of the computation before it.
    """
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose from {', '.join(VARIANTS)}")
    if n_blocks < 1:
        raise ValueError(f"n_blocks must be at least 1, got {n_blocks}")
    v = VARIANTS[variant]
    blocks = [f"blocks.{i}" for i in range(n_blocks)]
    order: list[str] = []
    gathered: set[str] = set()
    waits_for: dict[str, str] = {}  # unit -> the computation its post-backward waits for
    gathered_since_last_compute: list[str] = []

    def all_gather(unit: str) -> None:
        if unit not in gathered:
            gathered.add(unit)
            order.append(f"all-gather {unit}")
            gathered_since_last_compute.append(unit)  # (only read in forward)

    def compute_starts(computation: str) -> None:
        for unit in gathered_since_last_compute:
            waits_for[unit] = computation if v.api == "fsdp1" else ("embeddings" if unit == "root" else unit)
        gathered_since_last_compute.clear()

    units = ["root", *blocks]  # forward order
    for i, unit in enumerate(units):
        all_gather(unit)
        for ahead in units[i + 1 : i + 1 + v.forward_prefetch]:
            all_gather(ahead)
        compute_starts("embeddings" if unit == "root" else unit)
        if unit != "root":
            order.append(f"forward {unit}")
            if v.reshard_after_forward:
                gathered.discard(unit)

    def post_backward(unit: str) -> None:
        gathered.discard(unit)
        if v.backward_post and unit != "root":
            i = blocks.index(unit)
            for ahead in reversed(blocks[max(0, i - v.backward_prefetch) : i]):
                all_gather(ahead)
        order.append(f"reduce-scatter {unit}")

    def post_backwards_after(computation: str) -> None:
        ready = [u for u in reversed(list(waits_for)) if waits_for[u] == computation]  # latest gathered first
        for unit in ready:
            post_backward(unit)

    pre_depth = 0 if v.backward_post else v.backward_prefetch
    for ahead in reversed(blocks[len(blocks) - pre_depth :]):  # the root's pre-backward
        all_gather(ahead)
    for i in reversed(range(n_blocks)):
        all_gather(blocks[i])
        for ahead in reversed(blocks[max(0, i - pre_depth) : i]):
            all_gather(ahead)
        order.append(f"backward {blocks[i]}")
        post_backwards_after(blocks[i])
    post_backwards_after("embeddings")  # the last computation of backward
    return order


def predict_all_gather_order(n_blocks: int, variant: str) -> list[str]:
    """The units whose parameters are all-gathered in one step, in issue order (forward, then
    backward), e.g. ``["root", "blocks.0", ..., "blocks.3", "blocks.3", ..., "blocks.0"]``."""
    prefix = "all-gather "
    return [e[len(prefix) :] for e in predict_event_order(n_blocks, variant) if e.startswith(prefix)]


# ----------------------------------------------------------------------------------------------
# Wrapping MiniGPT


def world_mesh(device: torch.device):
    """A 1-D device mesh of every rank on ``device``'s type: what ``fully_shard`` builds when given none,
    but on the device the ranks really run on."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device.type, (dist.get_world_size(),))


def wrap(variant: Variant, model: MiniGPT, device: torch.device) -> tuple[nn.Module, list]:
    """The wrapped model, and the ``(name, inner, outer)`` blocks :class:`FSDPTracer` hooks."""
    if variant.api == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        # the mesh FSDP2 would build by itself, on this run's device: left alone it takes the machine's
        # accelerator, a GPU even when the ranks run on the CPU (launch.place's fallback)
        mesh = world_mesh(device)
        blocks = list(model.blocks)
        for block in blocks:
            fully_shard(block, mesh=mesh, reshard_after_forward=variant.reshard_after_forward)
        fully_shard(model, mesh=mesh)
        units = [model, *blocks]  # forward order
        if variant.forward_prefetch:
            for i, unit in enumerate(units):
                unit.set_modules_to_forward_prefetch(blocks[i : i + variant.forward_prefetch])
        if variant.explicit_backward:
            for i, unit in enumerate(units):  # backward: the root first, then blocks 3, 2, 1, 0
                before = blocks[: i - 1] if unit is not model else blocks
                unit.set_modules_to_backward_prefetch(before[::-1][: variant.backward_prefetch])
        if variant.async_unshard:
            model._set_unshard_async_op(True)  # every FSDP module below the root too
        return model, [(f"blocks.{i}", b, b) for i, b in enumerate(blocks)]
    from torch.distributed.fsdp import BackwardPrefetch, FullyShardedDataParallel
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    backward = None
    if variant.backward_prefetch:
        backward = BackwardPrefetch.BACKWARD_POST if variant.backward_post else BackwardPrefetch.BACKWARD_PRE
    wrapped = FullyShardedDataParallel(
        model,
        auto_wrap_policy=ModuleWrapPolicy({Block}),
        backward_prefetch=backward,
        forward_prefetch=variant.forward_prefetch > 0,
        use_orig_params=True,  # named parameters for AdamW's groups
        device_id=device,
    )  # on a CPU FSDP1 refuses to start without device_id=torch.device("cpu")
    return wrapped, [(f"blocks.{i}", b.module, b) for i, b in enumerate(wrapped.module.blocks)]


def sharded_optimizer(wrapped: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """The optimizer :func:`minigpt.train.build_optimizer` makes, over the sharded parameters.

    Its groups (weight decay on matrices only) are chosen by parameter name, since FSDP1 shows
    each parameter as a flat 1-D shard: the hyperparameters come from ``build_optimizer`` itself.
    """
    template_model = build_model(cfg)
    template = build_optimizer(template_model, cfg)
    group_of = {
        name: g
        for g, group in enumerate(template.param_groups)
        for name, p in template_model.named_parameters()
        if any(p is q for q in group["params"])
    }
    groups = [{**{k: v for k, v in group.items() if k != "params"}, "params": []} for group in template.param_groups]
    for name, p in wrapped.named_parameters():
        groups[group_of[name.replace(FSDP1_WRAPPED, "")]]["params"].append(p)
    return type(template)(groups)


def clip_gradients(variant: Variant, wrapped: nn.Module, max_norm: float) -> None:
    if variant.api == "fsdp1":  # each rank holds a flat shard: FSDP1 all-reduces the norm itself
        wrapped.clip_grad_norm_(max_norm)
    else:  # FSDP2 gradients are DTensors: the ordinary function computes the global norm
        torch.nn.utils.clip_grad_norm_(wrapped.parameters(), max_norm)


def fsdp2_unit_sizes(model: torch.nn.Module, world_size: int) -> tuple[list[int], list[int]]:
    """(unpadded, padded) parameter counts of the FSDP2 units of MiniGPT: the root (what is not in
    a block: embeddings, tied output layer, final norm) and each block. FSDP2 cuts every
    parameter along its first dimension, padded to a multiple of the world size."""

    def sizes(params) -> tuple[int, int]:
        plain = padded = 0
        for p in params:
            rows = p.shape[0]
            plain += p.numel()
            padded += padded_rows(rows, world_size) * (p.numel() // rows)
        return plain, padded

    in_blocks = {id(p) for b in model.blocks for p in b.parameters()}
    root = sizes([p for p in model.parameters() if id(p) not in in_blocks])
    blocks = [sizes(list(b.parameters())) for b in model.blocks]
    return [root[0]] + [b[0] for b in blocks], [root[1]] + [b[1] for b in blocks]
