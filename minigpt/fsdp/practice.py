"""FSDP in practice: how a model is cut into FSDP units, and what each choice costs.

Every function here runs on every rank of a process group (normally 2 ranks, gloo on CPU) with
PyTorch's own FSDP2 (``torch.distributed.fsdp.fully_shard``) on MiniGPT, and returns a dict of
measured numbers (the same on every rank unless a key says ``rank``):

* :func:`wrap_policies` - which modules become FSDP units: each block (``block``), the whole
  model only (``whole``), or every ``nn.Linear`` (``linear``). The units, the all-gathers and
  reduce-scatters of each step (counted by wrapping the ``torch.distributed`` functions FSDP2
  calls), the bytes they move, the memory of each phase of a step.
* :func:`activation_checkpointing` - each block (the same module as its FSDP unit) keeps only
  its input in forward and computes its activations again in backward: the same gradients,
  less memory, more time.
* :func:`diagnostics` - the report FSDP users ask for: the units and their parameters, each
  rank's shards (padding included), the memory after and during each phase of a step.

The rule FSDP2 follows, which the counts show: a unit all-gathers its parameters before its
forward and frees them after it (``reshard_after_forward``), all-gathers them again before its
backward, and reduce-scatters its gradients after it. The root unit is the exception: FSDP2
keeps it gathered from forward to backward (when ``reshard_after_forward`` is left at its
default), since its backward comes right after its forward. So a step with U units makes
2U - 1 all-gathers and U reduce-scatters.

Mixed precision, the gradient norm and the sharded checkpoint are in
:mod:`minigpt.fsdp.sharded_state`; the memory measurements in :mod:`minigpt.fsdp.memory`.
"""

from __future__ import annotations

import statistics
import time
import warnings
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import replace

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from minigpt import grammar
from minigpt.fsdp.memory import PeakMemory, local_tensor, model_state_bytes
from minigpt.model import MiniGPT
from minigpt.parallel import calls, equivalence
from minigpt.parallel.launch import DistContext
from minigpt.train import TrainConfig, build_model, build_optimizer, lr_at

POLICIES = ("whole", "block", "linear")
ROOT_UNIT = "(root)"  # how the reports name the unit fully_shard(model) makes


# ----------------------------------------------------------------------------------------------
# Wrapping, stepping, counting


def tied_parameter_ids(model: nn.Module) -> set[int]:
    """Parameters that more than one module uses (MiniGPT: the embedding shared by lm_head)."""
    owners: dict[int, int] = {}
    for module in model.modules():
        for p in module.parameters(recurse=False):
            owners[id(p)] = owners.get(id(p), 0) + 1
    return {pid for pid, n in owners.items() if n > 1}


def units_of_policy(model: MiniGPT, policy: str) -> list[nn.Module]:
    """The submodules ``policy`` makes into their own FSDP units (the root is always one more).

    ``linear`` leaves out a Linear whose weight is tied to a module outside it (``lm_head``,
    tied to ``wte``): FSDP2 refuses to put one parameter in two units, so it stays in the root.
    """
    if policy == "whole":
        return []
    if policy == "block":
        return list(model.blocks)
    if policy == "linear":
        tied = tied_parameter_ids(model)
        return [
            m for m in model.modules() if isinstance(m, nn.Linear) and not any(id(p) in tied for p in m.parameters())
        ]
    raise ValueError(f"unknown wrap policy {policy!r}; choose one of {', '.join(POLICIES)}")


def shard(
    model: MiniGPT,
    policy: str = "block",
    mp_policy: MixedPrecisionPolicy | None = None,
    device: torch.device | None = None,
) -> MiniGPT:
    """``fully_shard`` every unit of ``policy``, innermost first, then the root; in place.

    The mesh is on ``device`` (the parameters' device when not given): the ranks' device, not
    the machine's GPU. A model built on ``meta`` names the device its shards will live on.
    """
    from minigpt.fsdp.variants import world_mesh

    device = device or next(model.parameters()).device
    if device.type == "meta":
        raise ValueError("shard: a model on meta needs device= (where its shards will be allocated)")
    kwargs = {"mp_policy": mp_policy} if mp_policy is not None else {}
    kwargs["mesh"] = world_mesh(device)
    for module in units_of_policy(model, policy):
        fully_shard(module, **kwargs)
    fully_shard(model, **kwargs)
    return model


def fsdp_units(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(name, module)`` of every FSDP unit in ``model``, in module order (the root first)."""
    return [(name or ROOT_UNIT, m) for name, m in model.named_modules() if isinstance(m, FSDPModule)]


def unit_parameters(unit: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """The parameters a unit manages itself: those not inside a nested unit."""
    nested = [m for _, m in fsdp_units(unit) if m is not unit]
    inner = {id(p) for m in nested for p in m.parameters()}
    return [(n, p) for n, p in unit.named_parameters() if id(p) not in inner]


def sharded_model(
    cfg: TrainConfig, ctx: DistContext, policy: str = "block", mp_policy: MixedPrecisionPolicy | None = None
) -> tuple[MiniGPT, torch.optim.Optimizer]:
    """A MiniGPT from ``cfg.seed`` (the same full weights on every rank), sharded, and its optimizer."""
    model = shard(build_model(cfg).to(ctx.device), policy, mp_policy)
    return model, build_optimizer(model, cfg)


def rank_batch(at_step: int, cfg: TrainConfig, ctx: DistContext) -> tuple[torch.Tensor, ...]:
    """This rank's slice of the global batch of ``at_step``: ``(x, y, loss_mask)`` on its device."""
    batch = grammar.get_batch(
        "train", at_step, cfg.batch_size, ctx.rank, ctx.world_size, seed=cfg.seed, block_size=cfg.block_size
    )
    return tuple(t.to(ctx.device) for t in batch)


def forward_backward(model: nn.Module, at_step: int, cfg: TrainConfig, ctx: DistContext) -> float:
    """Forward and backward on this rank's slice of the global batch of ``at_step``."""
    _, loss = model(*rank_batch(at_step, cfg, ctx))
    loss.backward()
    return loss.item()


def optimizer_step(model: nn.Module, optimizer: torch.optim.Optimizer, at_step: int, cfg: TrainConfig) -> None:
    """Clip (``clip_grad_norm_`` on sharded gradients computes the global norm), set the
    learning rate of ``at_step``, step, and drop the gradients: as :func:`minigpt.train.train_step`."""
    if cfg.grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    for group in optimizer.param_groups:
        group["lr"] = lr_at(at_step, cfg.lr, cfg.min_lr, cfg.warmup, cfg.steps)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    at_step: int,
    cfg: TrainConfig,
    ctx: DistContext,
    mem: PeakMemory | None = None,
    census: dict | None = None,
) -> float:
    """One training step, as :func:`minigpt.train.train_step` takes it, in three phases:
    ``forward`` (to the loss), ``backward``, ``optimizer`` (clipping and AdamW). With ``mem``
    each phase's peak is measured; with ``census`` the model states after each phase are
    counted into it."""
    batch = rank_batch(at_step, cfg, ctx)

    @contextmanager
    def phase(name: str) -> Iterator[None]:
        with mem.phase(name) if mem is not None else _nothing():
            yield
        if census is not None:
            census[name] = model_state_bytes(model, optimizer)

    with phase("forward"):
        _, loss = model(*batch)
    with phase("backward"):
        loss.backward()
    with phase("optimizer"):
        optimizer_step(model, optimizer, at_step, cfg)
    return loss.item()


@contextmanager
def _nothing() -> Iterator[None]:
    yield


COUNTED = ("all_gather_single", "reduce_scatter_single", "all_gather_into_tensor", "reduce_scatter_tensor")


class CollectiveCounter:
    """Counts the calls (and the bytes on this rank's side) of the ``torch.distributed``
    collectives FSDP2 uses, for the duration of a ``with`` (:func:`minigpt.parallel.calls.intercepted`).

    FSDP2 calls ``dist.all_gather_single`` and ``dist.reduce_scatter_single`` (older versions:
    ``all_gather_into_tensor`` / ``reduce_scatter_tensor``). A call made from inside another
    counted call is not counted again. ``bytes`` are the bytes of the larger side: the gathered
    output, the scattered input. (``clip_grad_norm_`` on sharded gradients reduces the norm
    with DTensor's functional collectives, which this does not count.)
    """

    def __init__(self) -> None:
        self.calls = {name: 0 for name in COUNTED}
        self.bytes = {name: 0 for name in COUNTED}
        self._block = ExitStack()

    def _note(self, name: str, args: tuple, kwargs: dict) -> None:
        self.calls[name] += 1
        self.bytes[name] += calls.largest_bytes(args, kwargs)

    def __enter__(self) -> CollectiveCounter:
        self._block.enter_context(calls.intercepted(COUNTED, self._note))
        return self

    def __exit__(self, *exc) -> None:
        self._block.close()

    def summary(self) -> dict[str, int]:
        return {
            "all_gathers": self.calls["all_gather_single"] + self.calls["all_gather_into_tensor"],
            "reduce_scatters": self.calls["reduce_scatter_single"] + self.calls["reduce_scatter_tensor"],
            "all_gather_bytes": self.bytes["all_gather_single"] + self.bytes["all_gather_into_tensor"],
            "reduce_scatter_bytes": self.bytes["reduce_scatter_single"] + self.bytes["reduce_scatter_tensor"],
        }


def measured_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, at_step: int, cfg: TrainConfig, ctx: DistContext
) -> dict:
    """One step with its per-phase peaks (from the step's start) and the census after each phase."""
    census = {"start": model_state_bytes(model, optimizer)}
    with PeakMemory(ctx.device) as mem:
        step(model, optimizer, at_step, cfg, ctx, mem, census)
    return {"phase_peak_bytes": mem.phase_peaks, "peak_bytes": mem.peak_bytes, "census": census}


def unsharded(t: torch.Tensor) -> torch.Tensor:
    """A detached copy of the whole tensor: a DTensor's shards gathered (a collective)."""
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()


def full_gradients(model: nn.Module) -> torch.Tensor:
    """All gradients, unsharded and flattened into one fp32 vector (a collective)."""
    return torch.cat([unsharded(p.grad).float().flatten() for p in model.parameters()])


@torch.no_grad()
def probe_logits(model: nn.Module, probe: torch.Tensor) -> torch.Tensor:
    """The model's logits on the probe batch, as fp32."""
    return model(probe)[0].float()


# ----------------------------------------------------------------------------------------------
# 1. Wrap policies


def wrap_policies(cfg: TrainConfig, ctx: DistContext, steps: int = 3) -> dict:
    """For each policy: its units, the collectives of each of ``steps`` steps, and one measured
    step (per-phase peaks and census) on the training batch and on one sentence per rank (where
    the parameters, not the activations, fill the memory).

    Step 0 runs first, uncounted (FSDP2 initialises lazily at the first forward).
    """
    results = {}
    tiny = replace(cfg, batch_size=ctx.world_size)
    for policy in POLICIES:
        model, optimizer = sharded_model(cfg, ctx, policy)
        with warnings.catch_warnings():
            # FSDP2 warns that a Linear unit returns a view (an in-place op on it would skip the
            # all-gather of backward); MiniGPT never changes a Linear's output in place
            warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view")
            step(model, optimizer, 0, cfg, ctx)
            per_step = []
            for s in range(1, steps + 1):
                with CollectiveCounter() as counter:
                    step(model, optimizer, s, cfg, ctx)
                per_step.append(counter.summary())
            units = fsdp_units(model)
            results[policy] = {
                "units": [name for name, _ in units],
                "unit_elements": [sum(p.numel() for _, p in unit_parameters(m)) for _, m in units],
                "collectives_per_step": per_step,
                **measured_step(model, optimizer, steps + 1, cfg, ctx),
                "one_sentence": measured_step(model, optimizer, steps + 2, tiny, ctx),
            }
    results["tied_lm_head_error"] = tied_head_error(cfg, ctx)
    return results


def tied_head_error(cfg: TrainConfig, ctx: DistContext) -> str:
    """What FSDP2 says when ``lm_head`` (tied to ``wte``) is made a unit of its own (it says it
    at the first forward, when it initialises)."""
    model = build_model(cfg).to(ctx.device)
    try:
        fully_shard(model.lm_head)
        fully_shard(model)
        model(equivalence.probe_batch(2, cfg.block_size).to(ctx.device))
    except ValueError as exc:
        return str(exc)
    return ""


# ----------------------------------------------------------------------------------------------
# 2. Activation checkpointing, on the same unit as the wrap


def checkpoint_blocks(model: MiniGPT) -> MiniGPT:
    """Put every block in a ``checkpoint_wrapper`` (before ``fully_shard``, so the wrapper is
    the unit): its forward keeps only its input; backward runs the block forward again."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    for i, block in enumerate(model.blocks):
        model.blocks[i] = checkpoint_wrapper(block)
    return model


def activation_checkpointing(cfg: TrainConfig, ctx: DistContext, steps: int = 5) -> dict:
    """Block-wrapped FSDP with and without checkpointing each block, from the same weights.

    Checks the first step's logits and (unsharded) gradients are the same; then measures one
    step's per-phase peaks, the collectives of a step, and the median time of ``steps`` steps
    (the two variants take turns, so a busy moment of the machine hits both).
    """
    probe = equivalence.probe_batch(block_size=cfg.block_size).to(ctx.device)
    variants = {"plain": lambda m: m, "checkpointed": checkpoint_blocks}
    runs, logits, grads = {}, {}, {}
    for name, prepare in variants.items():
        model = shard(prepare(build_model(cfg).to(ctx.device)), "block")
        runs[name] = (model, build_optimizer(model, cfg))
        logits[name] = probe_logits(model, probe)
        forward_backward(model, 0, cfg, ctx)
        grads[name] = full_gradients(model)
        optimizer_step(model, runs[name][1], 0, cfg)
    same = {
        "max_logit_difference": float((logits["plain"] - logits["checkpointed"]).abs().max()),
        "max_grad_difference": float((grads["plain"] - grads["checkpointed"]).abs().max()),
    }
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    results = {}
    for s in range(1, steps + 1):
        for name, (model, optimizer) in runs.items():
            dist.barrier()
            t0 = time.perf_counter()
            step(model, optimizer, s, cfg, ctx)
            seconds[name].append(time.perf_counter() - t0)
    for name, (model, optimizer) in runs.items():
        with CollectiveCounter() as counter:
            step(model, optimizer, steps + 1, cfg, ctx)
        results[name] = {
            "median_step_s": statistics.median(seconds[name]),
            "step_s": seconds[name],
            **counter.summary(),
            **measured_step(model, optimizer, steps + 2, cfg, ctx),
        }
    return {**same, "variants": results}


# ----------------------------------------------------------------------------------------------
# 3. Diagnostics


def shard_layout(model: nn.Module) -> list[dict]:
    """This rank's shard of every parameter FSDP manages: unit, name, full shape, elements
    held (real), elements stored (padded: every rank stores the same length), bytes stored."""
    names = {id(p): n for n, p in model.named_parameters()}
    layout = []
    for unit_name, unit in fsdp_units(model):
        for group in unit._get_fsdp_state()._fsdp_param_groups:
            for fsdp_param in group.fsdp_params:  # FSDP2's record of one sharded parameter
                element_size = local_tensor(fsdp_param.sharded_param).element_size()
                layout.append(
                    {
                        "unit": unit_name,
                        "name": names[id(fsdp_param.sharded_param)],
                        "shape": list(fsdp_param._orig_size),
                        "elements": fsdp_param.sharded_size.numel(),
                        "padded_elements": fsdp_param.padded_sharded_param_size.numel(),
                        "bytes": fsdp_param.padded_sharded_param_size.numel() * element_size,
                    }
                )
    return layout


def diagnostics(cfg: TrainConfig, ctx: DistContext) -> dict:
    """A block-wrapped MiniGPT: its units, every rank's shard layout, and the memory of each
    phase: ``init`` (building the full model on every rank, sharding it, the optimizer), then
    the first step's forward, backward and optimizer step. Each phase has its census after it
    (model states kept) and its peak during it (from the start of init)."""
    with PeakMemory(ctx.device) as mem:
        with mem.phase("init"):
            model, optimizer = sharded_model(cfg, ctx, "block")
        census = {"init": model_state_bytes(model, optimizer)}
        step(model, optimizer, 0, cfg, ctx, mem, census)
    layouts: list[list[dict] | None] = [None] * ctx.world_size
    dist.all_gather_object(layouts, shard_layout(model))
    units = [
        {
            "unit": name,
            "parameters": [n for n, _ in unit_parameters(m)],
            "elements": sum(p.numel() for _, p in unit_parameters(m)),
        }
        for name, m in fsdp_units(model)
    ]
    return {
        "world_size": ctx.world_size,
        "parameters": sum(u["elements"] for u in units),
        "units": units,
        "shards_per_rank": layouts,
        "phase_peak_bytes": mem.phase_peaks,
        "census": census,
    }


def compile_budgets(cfg: TrainConfig, budgets: tuple[float, ...] = (1.0, 0.5, 0.0), steps: int = 5) -> list[dict]:
    """MiniGPT compiled by ``torch.compile`` under each ``activation_memory_budget`` of the partitioner
    (one process, the compiler's caches off): the seconds of the first step (compilation included), the peak of the forward pass
    (what it keeps for backward, and its temporaries) and of the whole step, and the median step."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    x, y, mask = grammar.get_batch("train", 0, cfg.batch_size, seed=cfg.seed, block_size=cfg.block_size)
    saved = functorch_config.activation_memory_budget, inductor_config.force_disable_caches
    inductor_config.force_disable_caches = True  # the first step compiles for real, as on a new machine
    found = []
    try:
        for budget in budgets:
            torch._dynamo.reset()
            functorch_config.activation_memory_budget = budget
            model = build_model(cfg)
            compiled = torch.compile(model)
            start = time.perf_counter()
            compiled(x, y, mask)[1].backward()
            first = time.perf_counter() - start
            model.zero_grad(set_to_none=True)
            with PeakMemory() as mem:
                with mem.phase("forward"):
                    loss = compiled(x, y, mask)[1]
                with mem.phase("backward"):
                    loss.backward()
            times = []
            for _ in range(steps):
                model.zero_grad(set_to_none=True)
                start = time.perf_counter()
                compiled(x, y, mask)[1].backward()
                times.append(time.perf_counter() - start)
            found.append(
                {
                    "budget": budget,
                    "first_step_seconds": first,
                    "forward_peak_bytes": mem.phase_peaks["forward"],
                    "step_peak_bytes": mem.peak_bytes,
                    "step_seconds": statistics.median(times),
                }
            )
    finally:
        functorch_config.activation_memory_budget, inductor_config.force_disable_caches = saved
        torch._dynamo.reset()
    return found
