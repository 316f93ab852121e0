"""One rank of the Lab 04 test launch: ``python tests/fsdp_scratch_worker.py OUTDIR`` under
RANK/WORLD_SIZE (started by tests/launcher.py through the ``fsdp_scratch`` fixture, 2 ranks).

It runs the multi-process scenarios of tests/test_lab04.py and tests/test_lab04_reference.py that
``MINIGPT_SCENARIOS`` asks for (an exercise, "all", "maintainer"; every one when unset), each with
only its exercise the learner's (``MINIGPT_EXERCISE``), and writes ``OUTDIR/rank<r>.json`` after
every scenario. Every scenario gets its own process group with a short timeout, created up front
in the same order on every rank, so a learner's move that skips or reorders a collective costs
only the tests that read that scenario; the learner's scenarios that can crash inside backward run
after the others.
"""

from __future__ import annotations

import copy
import datetime
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from minigpt import grammar, impl
from minigpt.parallel import fsdp_by_hand as fsdp
from minigpt.parallel.fsdp_by_hand import sharding
from minigpt.parallel.fsdp_by_hand.sharding import gather_rows, padded_rows
from minigpt.parallel.fsdp_by_hand.unit import FSDPUnit as ReferenceUnit
from minigpt.train import TrainConfig, build_model, build_optimizer, train_step
from tests import launcher
from tests.limits import limit
from tests.watch import collectives
from tests.words import say

OUT = Path(sys.argv[1]) if __name__ == "__main__" else None
RANK, WORLD = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
RESULTS: dict[str, dict] = {}
GATHER_ROWS = (1, 3, 7, 609, 610)


def record(name: str, fn) -> None:
    launcher.record(RESULTS, OUT, RANK, name, fn)


def learners(name: str):
    return impl.load("lab04_fsdp", name)


def shard_model(model: nn.Module, unit_class, group, recorder=None) -> nn.Module:
    """The course's policy: each block a unit, then the root."""
    for block in model.blocks:
        fsdp.fully_shard(block, group=group, recorder=recorder, unit_class=unit_class)
    return fsdp.fully_shard(model, group=group, recorder=recorder, unit_class=unit_class)


def batch(step: int, rank: int, world: int, cfg: TrainConfig):
    return grammar.get_batch("train", step, cfg.batch_size, rank, world, seed=cfg.seed, block_size=cfg.block_size)


def shard_grads(model: nn.Module) -> dict[str, list | None]:
    """Each shard's gradient (None when it has none), by the model's parameter names."""
    return {n: (None if p.grad is None else p.grad.clone()) for n, p in model.named_parameters()}


def full_grad_rows(grad: torch.Tensor, rows: int, rank: int, world: int) -> torch.Tensor:
    """Rank ``rank``'s rows of a full gradient, padded with zero rows as its shard is."""
    per = padded_rows(rows, world) // world
    out = grad.new_zeros((per, *grad.shape[1:]))
    start, stop = rank * per, min((rank + 1) * per, rows)
    if stop > start:
        out[: stop - start] = grad[start:stop]
    return out


# ----------------------------------------------------------------------------------------------
# Exercise 4.1


def gather_round_trip(group) -> dict:
    """The learner's gather_rows on the reference's shards: a wrong shard_rows costs its own test (in
    tests/test_lab04.py, in one process), never this one's collective."""
    gather_rows = learners("gather_rows")
    cases = []
    for rows in GATHER_ROWS:
        for shape in ((rows, 5), (rows,)):
            full = torch.randn(shape, generator=torch.Generator().manual_seed(rows))  # the same on both ranks
            with collectives() as calls:
                got = gather_rows(sharding.shard_rows(full, RANK, 2), rows, group)
            cases.append(
                {
                    "shape": list(shape),
                    "got": list(got.shape),
                    "equal": bool(got.shape == full.shape and torch.equal(got, full)),
                    "collectives": [name for name, _ in calls],
                }
            )
    return {"cases": cases}


# ----------------------------------------------------------------------------------------------
# Exercise 4.3: the learner's four moves against the reference's, on MiniGPT


def _freed(unit) -> list[str]:
    """The names of the unit's parameters whose gathered tensor holds no storage (0 bytes)."""
    return [p.slots[0][2] for p in unit.params if p.full.untyped_storage().nbytes() == 0]


def _whole(unit) -> bool:
    """Whether any of the unit's gathered tensors holds its storage (the unit is not freed)."""
    return len(_freed(unit)) < len(unit.params)


def watched(unit_class, seen: dict | None = None):
    """``unit_class`` with what each move promises checked as it returns: a unit is whole from its
    ``before_forward`` to its forward's end (the root until backward reaches it), and whole again from
    its ``before_backward`` on. A move that breaks it fails the scenario with the move's name, before
    autograd reads a freed parameter ("storage of size 0", which names no method).

    ``seen`` (optional) collects, without failing anything, what backward's peak is made of:
    ``"peaks"`` the bytes held at each event of backward and at each reduce-scatter's start (its
    buffer counted: the contract's buffer, alive while the collective runs), ``"kept"`` the units whose
    ``after_backward`` was done but which were still whole when another unit's backward started,
    ``"from_forward"`` the units still whole from their forward at another unit's backward, and
    ``"reduced_whole"`` the units that began their reduce-scatter still whole."""

    def check(unit, move: str, why_en: str, why_es: str) -> None:
        freed = _freed(unit)
        if freed:
            shown = ", ".join(freed[:3]) + (", ..." if len(freed) > 3 else "")
            flying = unit._in_flight is not None  # a gather issued (a prefetch, maybe) and never waited for
            raise RuntimeError(
                say(
                    f"{move} of {unit.name} returned with the unit's parameters freed ({shown}: 0 bytes): {why_en}"
                    + ("; its all-gather was still in flight: issued, never finished" if flying else ""),
                    f"{move} de {unit.name} terminó con los parámetros de la unidad liberados ({shown}: 0 bytes): "
                    f"{why_es}" + ("; su all-gather seguía en curso: lanzado, nunca terminado" if flying else ""),
                )
            )

    started: set[str] = set()  # units whose backward started in this step
    done: set[str] = set()  # ... and whose after_backward ran

    class Watched(unit_class):
        def before_forward(self):
            if self.root is self and torch.is_grad_enabled():
                started.clear()
                done.clear()
            super().before_forward()
            check(
                self,
                "before_forward",
                "its forward reads them next (a unit is whole from before_forward to the end of its forward)",
                "su pasada hacia delante los lee a continuación (una unidad está entera desde before_forward hasta "
                "el final de su pasada hacia delante)",
            )

        def after_forward(self):
            super().after_forward()
            if self is self.root:
                check(
                    self,
                    "after_forward",
                    "the root keeps its parameters after its forward: backward starts with it",
                    "la raíz conserva sus parámetros tras su pasada hacia delante: la pasada hacia atrás empieza por "
                    "ella",
                )

        def before_backward(self):
            if seen is not None and self is not self.root:
                for other in self.root.units:
                    if other is self or other is self.root or not _whole(other):
                        continue
                    if other.name in done:
                        seen["kept"].append((other.name, self.name))
                    elif other.name not in started:
                        seen["from_forward"].append((other.name, self.name))
            started.add(self.name)
            super().before_backward()
            check(
                self,
                "before_backward",
                "its backward reads them next (a unit is whole again from before_backward to its after_backward)",
                "su pasada hacia atrás los lee a continuación (una unidad vuelve a estar entera desde "
                "before_backward hasta su after_backward)",
            )

        def after_backward(self):
            super().after_backward()
            done.add(self.name)

        def reduce_gradients(self):
            if seen is not None:
                with_grad = [p for p in self.params if p.full.grad is not None]
                buffer = self.world_size * sum(p.shard.numel() for p in with_grad)
                size = torch.empty((), dtype=self.reduce_dtype).element_size()
                seen["peaks"].append(self.root.held_bytes() + buffer * size)
                if _whole(self):
                    seen["reduced_whole"].append(self.name)
            super().reduce_gradients()

    Watched.__name__ = Watched.__qualname__ = unit_class.__name__
    return Watched


def backward_peak(model: nn.Module, recorder, seen: dict, x, y, mask) -> int:
    """One step of ``model`` (made of :func:`watched` units that fill ``seen``): the largest number of
    bytes of parameters and gradients it held during backward, reduce-scatter buffers counted."""
    for key in ("peaks", "kept", "from_forward", "reduced_whole"):
        seen[key] = []
    recorder.begin()
    loss = model(x, y, mask)[1]
    start = len(recorder.current.timeline)
    loss.backward()
    return max([held for _, _, _, held in recorder.current.timeline[start:]] + seen["peaks"])


def hooks_on_minigpt(group) -> dict:
    cfg = TrainConfig()
    theirs, seen_theirs = fsdp.Recorder(), {}
    reference = shard_model(build_model(cfg), watched(ReferenceUnit, seen_theirs), group, theirs)
    recorder, seen = fsdp.Recorder(), {}
    model = shard_model(build_model(cfg), watched(learners("FSDPUnit"), seen), group, recorder)
    blocks = [u for u in fsdp.find_units(model) if u.name != "root"]
    root = fsdp.find_units(model)[0]
    held_in_backward: dict[str, list[int]] = {}
    for unit in blocks:
        for k, p in enumerate(unit.params):
            if p.full.requires_grad:
                key = f"{unit.name}#{k}"
                p.full.register_hook(
                    lambda grad, p=p, key=key: held_in_backward.setdefault(key, []).append(
                        p.full.untyped_storage().nbytes()
                    )
                )
    out = {"steps": []}
    for step in range(2):
        x, y, mask = batch(step, RANK, 2, cfg)
        reference_peak = backward_peak(reference, theirs, seen_theirs, x, y, mask)
        recorder.begin()
        loss = model(x, y, mask)[1]
        after_forward = {u.name: sum(p.full.untyped_storage().nbytes() for p in u.params) for u in blocks}
        root_after_forward = sum(p.full.untyped_storage().nbytes() for p in root.params)
        start = len(recorder.current.timeline)
        for key in ("peaks", "kept", "from_forward", "reduced_whole"):
            seen[key] = []
        loss.backward()
        peak = max([held for _, _, _, held in recorder.current.timeline[start:]] + seen["peaks"])
        ours, theirs_grads = shard_grads(model), shard_grads(reference)
        differ = [
            n
            for n in theirs_grads
            if theirs_grads[n] is None or ours[n] is None or not torch.equal(ours[n], theirs_grads[n])
        ]
        after_step = sum(p.full.untyped_storage().nbytes() for u in fsdp.find_units(model) for p in u.params)
        out["steps"].append(
            {
                "differ": differ,
                "after_forward": after_forward,
                "root_after_forward": root_after_forward,
                "after_step": after_step,
                "backward_peak": peak,
                "reference_backward_peak": reference_peak,
                "kept": seen["kept"],
                "from_forward": seen["from_forward"],
                "reduced_whole": seen["reduced_whole"],
            }
        )
        for m in (model, reference):
            m.zero_grad(set_to_none=True)
    out["held_in_backward"] = held_in_backward
    out["schedule"] = recorder.steps[-1].schedule
    out["bytes_sent"] = recorder.steps[-1].bytes_sent()
    return out


def forward_prefetch_on_minigpt(group) -> dict:
    """The learner's moves with an explicit forward prefetch (each block's ``forward_prefetch`` is the
    next block), two steps: after each ``before_forward``, the units of its list whose gather was not
    in flight (never started, or already waited for), and each ``before_forward`` that had to gather
    its own unit but issued a prefetch's all-gather first (the order the stub's contract states)."""
    late, checked, issued, order = [], [0], [], []

    class Prefetching(watched(learners("FSDPUnit"))):
        def unshard(self, async_op: bool = False):
            if not self.gathered and self._in_flight is None:
                issued.append(self.name)  # an all-gather issued now
            return super().unshard(async_op=async_op)

        def before_forward(self):
            own = not self.gathered and self._in_flight is None  # its own gather still to issue
            issued.clear()
            super().before_forward()
            if own and self.forward_prefetch and issued and issued[0] != self.name:
                order.append(f"{self.name}: {' then '.join(issued)}")
            for ahead in self.forward_prefetch:
                checked[0] += 1
                if ahead._in_flight is None:
                    late.append(
                        f"{self.name} -> {ahead.name} ({'gathered, waited for' if ahead.gathered else 'not gathered'})"
                    )

    cfg = TrainConfig()
    model = shard_model(build_model(cfg), Prefetching, group)
    for block, after in zip(model.blocks, list(model.blocks)[1:]):
        fsdp.set_modules_to_forward_prefetch(block, [after])
    for step in range(2):
        model(*batch(step, RANK, 2, cfg))[1].backward()
        model.zero_grad(set_to_none=True)
    return {"late": late, "checked": checked[0], "order": order}


class Twice(nn.Module):
    """A unit (``twice``) called twice in one forward."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(13, 8)
        self.twice = nn.Sequential(nn.Linear(8, 8), nn.Tanh())
        self.out = nn.Linear(8, 5)

    def forward(self, idx):
        return self.out(self.twice(self.twice(self.embed(idx)))).square().mean()


def unit_called_twice(group) -> dict:
    """The learner's hooks against the reference's on :class:`Twice`, two steps: the shards'
    gradients, the reduce-scatters of each unit per step (the learner's, from its records), and the
    all-gathers of each unit per step, the learner's and the reference's."""
    torch.manual_seed(0)
    one, theirs_recorder, recorder = Twice(), fsdp.Recorder(), fsdp.Recorder()
    models = []
    for unit_class, rec in ((ReferenceUnit, theirs_recorder), (watched(learners("FSDPUnit")), recorder)):
        model = copy.deepcopy(one)
        for sub in (model.twice, model.out, model):
            fsdp.fully_shard(sub, group=group, recorder=rec, unit_class=unit_class)
        models.append(model)
    reference, model = models
    out = {"steps": []}
    for step in range(2):
        idx = torch.randint(0, 13, (6, 4), generator=torch.Generator().manual_seed(100 * step + RANK))
        theirs_recorder.begin()
        reference(idx).backward()
        recorder.begin()
        model(idx).backward()
        ours, theirs = shard_grads(model), shard_grads(reference)
        differ = [n for n in theirs if theirs[n] is None or ours[n] is None or not torch.equal(ours[n], theirs[n])]

        def count(rec, kind: str) -> dict[str, int]:
            units = [c["unit"] for c in rec.steps[-1].collectives if c["kind"] == kind]
            return {u: units.count(u) for u in sorted(set(units))}

        out["steps"].append(
            {
                "differ": differ,
                "reduce_scatters": count(recorder, "reduce-scatter"),
                # a unit freed after its first use's backward is gathered once more for the other's
                "all_gathers": count(recorder, "all-gather"),
                "reference_all_gathers": count(theirs_recorder, "all-gather"),
            }
        )
        for m in models:
            m.zero_grad(set_to_none=True)
    return out


# ----------------------------------------------------------------------------------------------
# Exercise 4.4


class Padded(nn.Module):
    """A 609-row embedding (padded to 610 on 2 ranks) in the root, a 3-row Linear as a unit."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(609, 6)
        self.head = nn.Linear(6, 3)

    def forward(self, idx):
        return self.head(torch.tanh(self.embed(idx))).square().mean()


def padded_batch(rank: int) -> torch.Tensor:
    return torch.randint(0, 609, (8, 5), generator=torch.Generator().manual_seed(50 + rank))


class Pair(nn.Module):
    """Two Linears, the second never used in forward: its parameters get no gradient."""

    def __init__(self):
        super().__init__()
        self.used = nn.Linear(6, 3)
        self.unused = nn.Linear(6, 3)

    def forward(self, h):
        return self.used(h)


class Partly(nn.Module):
    """A frozen unit (no parameter gets a gradient) and a unit with a layer unused in forward."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(7, 6)
        self.frozen = nn.Linear(6, 6)
        self.frozen.requires_grad_(False)
        self.pair = Pair()

    def forward(self, idx):
        return self.pair(torch.tanh(self.frozen(self.embed(idx)))).square().mean()


def watch_reductions(model: nn.Module) -> list[dict]:
    """Each reduce-scatter of ``model``'s units, as it runs: the collectives the learner's function
    called, in order, and the elements its buffer should hold (the parameters with a gradient, each
    padded as its shard: 0 when none has one)."""
    seen: list[dict] = []
    for unit in fsdp.find_units(model):

        def reduce(unit=unit, reduce=unit.reduce_gradients) -> None:
            expected = sum(p.shard.numel() for p in unit.params if p.full.grad is not None) * unit.world_size
            with collectives() as calls:
                reduce()
            seen.append({"unit": unit.name, "expected": expected, "calls": calls})

        unit.reduce_gradients = reduce
    return seen


def reduce_scatter_padded(group) -> dict:
    torch.manual_seed(0)
    one = Padded()
    expected = {}
    for r in range(2):
        one.zero_grad(set_to_none=True)
        one(padded_batch(r)).backward()
        for n, p in one.named_parameters():
            expected[n] = expected.get(n, 0) + p.grad
    expected = {n: g / 2 for n, g in expected.items()}
    model = copy.deepcopy(one)
    unit_class = learners("FSDPUnit")
    fsdp.fully_shard(model.head, group=group, unit_class=unit_class)
    fsdp.fully_shard(model, group=group, unit_class=unit_class)
    rows = {n: p.shape[0] for n, p in one.named_parameters()}
    model(padded_batch(RANK)).backward()
    errors, padding_zero, missing = {}, True, []
    for n, p in model.named_parameters():
        if p.grad is None:
            missing.append(n)
            continue
        want = full_grad_rows(expected[n], rows[n], RANK, 2)
        errors[n] = float((p.grad - want).abs().max())
        real = max(0, min(p.shape[0], rows[n] - RANK * p.shape[0]))
        padding_zero &= bool((p.grad[real:] == 0).all())
    full_grads_kept = [u.name for u in fsdp.find_units(model) for p in u.params if p.full.grad is not None]
    # a known symptom: every gradient exactly world_size times the mean (summed, not averaged)
    summed = all(
        float((p.grad - 2 * full_grad_rows(expected[n], rows[n], RANK, 2)).abs().max()) <= 1e-6
        for n, p in model.named_parameters()
        if p.grad is not None
    ) and any(errors.get(n, 0) > 1e-6 for n in errors)
    model(padded_batch(RANK)).backward()  # a second micro-batch, the same: the shards' grads double
    accumulated = max(
        float((p.grad - 2 * full_grad_rows(expected[n], rows[n], RANK, 2)).abs().max())
        for n, p in model.named_parameters()
        if p.grad is not None
    )
    torch.manual_seed(0)
    partly = Partly()
    fsdp.fully_shard(partly.frozen, group=group, unit_class=unit_class)
    fsdp.fully_shard(partly.pair, group=group, unit_class=unit_class)
    fsdp.fully_shard(partly, group=group, unit_class=unit_class)
    reductions = watch_reductions(partly)
    partly(torch.randint(0, 7, (4, 3), generator=torch.Generator().manual_seed(RANK))).backward()
    return {
        "reductions": reductions,
        "errors": errors,
        "padding_zero": padding_zero,
        "missing": missing,
        "full_grads_kept": full_grads_kept,
        "accumulated_error": accumulated,
        "summed_not_averaged": summed,
        "shard_rows": {n: list(p.shape) for n, p in model.named_parameters()},
    }


def norm_of_shards(group) -> dict:
    """Known gradients put straight into the shards (one parameter left without): the learner's
    global norm against the norm of the whole gradient computed here, in float64."""
    cfg = TrainConfig()
    model = shard_model(build_model(cfg), learners("FSDPUnit"), group)
    units = fsdp.find_units(model)
    sharded = {id(p.shard): (p, u) for u in units for p in u.params}
    whole = []
    for k, shard in enumerate(model.parameters()):
        if k == 3:
            continue  # a parameter that got no gradient in this step
        p, unit = sharded[id(shard)]
        full = torch.randn(p.shape, generator=torch.Generator().manual_seed(k))
        shard.grad = full_grad_rows(full, p.rows, RANK, 2)
        whole.append(full.double().flatten())
    expected = float(torch.linalg.vector_norm(torch.cat(whole)))
    all_reduces = []  # the number of elements of each all-reduce the learner's norm calls

    def counted(tensor, *args, **kwargs):
        all_reduces.append(tensor.numel())
        return all_reduce(tensor, *args, **kwargs)

    all_reduce, dist.all_reduce = dist.all_reduce, counted
    try:
        got = units[0].global_grad_norm(model)
    finally:
        dist.all_reduce = all_reduce
    return {
        "expected": expected,
        "got": float(got),
        "is_tensor": torch.is_tensor(got),
        "all_reduces": all_reduces,
        "with_gradient": len(whole),
    }


def norm_bits_on_minigpt(group) -> dict:
    """MiniGPT's real gradients (the reference's units, 4 batches): the learner's global norm against
    FSDP2's, bit for bit. FSDP2's norm is the reference's ``global_grad_norm``, which the lab's proofs
    hold to ``clip_grad_norm_`` on FSDP2's sharded gradients, bit for bit."""
    from minigpt.parallel.fsdp_by_hand.gradients import global_grad_norm as fsdp2s

    norm = learners("FSDPUnit").global_grad_norm  # the learner's function, as the scaffold calls it
    cfg = TrainConfig()
    model = shard_model(build_model(cfg), ReferenceUnit, group)
    steps = []
    for step in range(4):
        model(*batch(step, RANK, 2, cfg))[1].backward()
        with collectives() as calls:
            got = norm(model)
        all_reduces = [numels[0] for name, numels in calls if name == "all_reduce"]
        want = fsdp2s(model)
        steps.append(
            {
                "got": float(got),
                "want": float(want),
                "equal": bool(torch.equal(torch.as_tensor(got), want)),
                "all_reduces": all_reduces,
                "parameters": sum(1 for p in model.parameters() if p.grad is not None),
            }
        )
        model.zero_grad(set_to_none=True)
    return {"steps": steps}


# ----------------------------------------------------------------------------------------------
# Exercise 4.5


def prefetch_schedule(group) -> dict:
    cfg = TrainConfig()
    recorder = fsdp.Recorder()
    model = shard_model(build_model(cfg), learners("FSDPUnit"), group, recorder)
    for step in range(2):
        recorder.begin()
        model(*batch(step, RANK, 2, cfg))[1].backward()
        model.zero_grad(set_to_none=True)
    return {"schedule": recorder.steps[-1].schedule, "bytes_sent": recorder.steps[-1].bytes_sent()}


# ----------------------------------------------------------------------------------------------
# All of it: the learner's FSDP trains MiniGPT


def gathered_optimizer_state(model: nn.Module, opt: torch.optim.Optimizer, group) -> dict:
    """The sharded optimizer's state with every moment gathered whole (the reference's gather),
    to load into the same optimizer over the unsharded model (same parameter order)."""
    rows = {id(p.shard): p.rows for u in fsdp.find_units(model) for p in u.params}
    state = opt.state_dict()
    params = [p for g in opt.param_groups for p in g["params"]]
    whole = {}
    for index, entry in state["state"].items():
        shard = params[index]
        whole[index] = {
            # a copy of the step count too: AdamW adds to it in place, and two optimizers must not share it
            k: v.clone() if v.dim() == 0 else gather_rows(v, rows[id(shard)], group).clone()
            for k, v in entry.items()
        }
    return {"state": whole, "param_groups": copy.deepcopy(state["param_groups"])}


def train_minigpt(group) -> dict:
    from minigpt.parallel import equivalence

    cfg = TrainConfig(steps=3, warmup=1)
    baseline = build_model(cfg)
    base_opt = build_optimizer(baseline, cfg)
    recorder = fsdp.Recorder()
    model = shard_model(build_model(cfg), watched(learners("FSDPUnit")), group, recorder)
    opt = build_optimizer(model, cfg)
    opt.clip_grad_norm_ = lambda max_norm: fsdp.clip_grad_norm_(model, max_norm)  # train_step's hook
    # the gradients of one backward first: AdamW would hide a gradient twice too large
    x, y, mask = batch(0, RANK, 2, cfg)
    model(x, y, mask)[1].backward()
    baseline(*batch(0, 0, 1, cfg))[1].backward()
    full = dict(baseline.named_parameters())
    units = {id(p.shard): (p, u) for u in fsdp.find_units(model) for p in u.params}
    grad_error = 0.0
    for n, shard in model.named_parameters():
        p, _ = units[id(shard)]
        want = full_grad_rows(full[n].grad, p.rows, RANK, 2)
        grad_error = max(grad_error, float("inf") if shard.grad is None else float((shard.grad - want).abs().max()))
    model.zero_grad(set_to_none=True)
    baseline.zero_grad(set_to_none=True)
    probe = equivalence.Probe(build_model(cfg), rows=8)
    drifts, sent = [], []
    for step in range(cfg.steps):
        # step drift (Lab 01's criterion): one process starts each step from the sharded run's
        # state, gathered whole (weights and AdamW's moments), and takes the same step
        baseline.load_state_dict(fsdp.full_state_dict(model))
        base_opt.load_state_dict(gathered_optimizer_state(model, opt, group))
        train_step(baseline, base_opt, step, cfg)
        recorder.begin()
        train_step(model, opt, step, cfg, rank=RANK, world_size=2)
        sent.append(recorder.steps[-1].bytes_sent())
        drifts.append(probe.drift(baseline, fsdp.full_state_dict(model)))
    return {"grad_error": grad_error, "drifts": drifts, "bytes_sent": sent}


# ----------------------------------------------------------------------------------------------
# The course's own checks of the mechanism (tests/test_lab04_reference.py), on models it was not
# built for


class Odd(nn.Module):
    """A frozen layer, a layer unused in forward, a block called twice, a buffer."""

    def __init__(self, dtype=torch.float32):
        super().__init__()
        self.embed = nn.Embedding(13, 8)
        self.frozen = nn.Linear(8, 8)
        self.frozen.requires_grad_(False)
        self.twice = nn.Sequential(nn.Linear(8, 8), nn.Tanh())
        self.unused = nn.Linear(8, 8)
        self.out = nn.Linear(8, 5)
        self.register_buffer("scale", torch.tensor(0.5))
        self.to(dtype)

    def forward(self, idx):
        h = self.frozen(self.embed(idx))
        h = self.twice(self.twice(h))
        return (self.out(h) * self.scale).square().mean()


def odd_batch(step: int, rank: int) -> torch.Tensor:
    return torch.randint(0, 13, (6, 4), generator=torch.Generator().manual_seed(100 * step + rank))


def odd_model_against_one_process(group, dtype) -> dict:
    torch.manual_seed(0)
    one = Odd(dtype)
    model = copy.deepcopy(one)
    recorder = fsdp.Recorder()
    for sub in (model.frozen, model.twice, model.unused, model.out):
        fsdp.fully_shard(sub, group=group, recorder=recorder)
    fsdp.fully_shard(model, group=group, recorder=recorder)
    opts = [torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=0.1, momentum=0.9) for m in (one, model)]
    frozen_before = {k: v.clone() for k, v in one.frozen.state_dict().items()}
    grad_none, reduced_units = {}, []
    for step in range(2):
        for r in range(2):
            (one(odd_batch(step, r)) / 2).backward()
        recorder.begin()
        model(odd_batch(step, RANK)).backward()
        grad_none = {n: p.grad is None for n, p in model.named_parameters()}
        one_none = {n: p.grad is None for n, p in one.named_parameters()}
        reduced_units = [c["unit"] for c in recorder.steps[-1].collectives if c["kind"] == "reduce-scatter"]
        for opt in opts:
            opt.step()
            opt.zero_grad(set_to_none=True)
    state = fsdp.full_state_dict(model)
    diff = max(float((state[k] - v).abs().max()) for k, v in one.state_dict().items())
    frozen_same = all(torch.equal(state[f"frozen.{k}"], v) for k, v in frozen_before.items())
    return {
        "max_diff": diff,
        "grad_none": grad_none,
        "one_grad_none": one_none,
        "reduced_units": reduced_units,
        "frozen_unchanged": frozen_same,
        "buffer": float(state["scale"]),
    }


def tie_across_units(group) -> dict:
    model = build_model(TrainConfig(n_layer=1))
    fsdp.fully_shard(model.lm_head, group=group)
    try:
        fsdp.fully_shard(model, group=group)
    except ValueError as exc:
        return {"raised": True, "message": str(exc)}
    return {"raised": False}


def float64_minigpt(group) -> dict:
    cfg = TrainConfig(dtype="float64", n_layer=2)
    one = build_model(cfg)
    for r in range(2):
        (one(*batch(0, r, 2, cfg))[1] / 2).backward()
    model = shard_model(build_model(cfg), ReferenceUnit, group)
    model(*batch(0, RANK, 2, cfg))[1].backward()
    units = {id(p.shard): p for u in fsdp.find_units(model) for p in u.params}
    full = dict(one.named_parameters())
    worst = max(
        float((shard.grad - full_grad_rows(full[n].grad, units[id(shard)].rows, RANK, 2)).abs().max())
        for n, shard in model.named_parameters()
    )
    return {"max_diff": worst}


def ignored_norms(group) -> dict:
    """``fully_shard(..., ignored_params=...)``: every layer norm's weight and bias left whole. Three
    float64 AdamW steps (clipped) against one process on the whole batch; the ignored gradients
    after each backward, a digest per rank (they must be bit-identical across the ranks)."""
    import hashlib

    cfg = TrainConfig(dtype="float64", n_layer=2, steps=3, warmup=1)
    one = build_model(cfg)
    one_opt = build_optimizer(one, cfg)
    model = build_model(cfg)

    def norms(module: nn.Module) -> list[nn.Parameter]:
        return [p for m in module.modules() if isinstance(m, nn.LayerNorm) for p in m.parameters()]

    for block in model.blocks:
        fsdp.fully_shard(block, group=group, ignored_params=norms(block))
    fsdp.fully_shard(model, group=group, ignored_params=norms(model.ln_f))
    opt = build_optimizer(model, cfg)
    opt.clip_grad_norm_ = lambda max_norm: fsdp.clip_grad_norm_(model, max_norm)
    ignored = [p for u in fsdp.find_units(model) for _, p in u.whole]
    digests = []
    for step in range(cfg.steps):
        x, y, mask = batch(step, RANK, 2, cfg)
        model(x, y, mask)[1].backward()
        h = hashlib.sha1()
        for p in ignored:
            h.update(p.grad.detach().numpy().tobytes())
        digests.append(h.hexdigest())
        fsdp.clip_grad_norm_(model, cfg.grad_clip)
        for g in opt.param_groups:
            g["lr"] = cfg.lr
        opt.step()
        opt.zero_grad(set_to_none=True)
        train_step_one(one, one_opt, step, cfg)
    full = fsdp.full_state_dict(model)
    worst = max(float((full[n] - p).abs().max()) for n, p in one.state_dict().items())
    return {
        "ignored": len(ignored),
        "whole_on_every_rank": all(p.shape == q.shape for p, q in zip(ignored, norms(one))),
        "max_diff": worst,
        "grad_digests": digests,
    }


def train_step_one(model: nn.Module, optimizer, step: int, cfg: TrainConfig) -> None:
    """One process's step on the whole batch, clipped, at the same constant learning rate."""
    x, y, mask = batch(step, 0, 1, cfg)
    model(x, y, mask)[1].backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    for g in optimizer.param_groups:
        g["lr"] = cfg.lr
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def checkpoint_two_to_one(pair, alone, folder: str) -> dict:
    cfg = TrainConfig(n_layer=2)
    model = shard_model(build_model(cfg), ReferenceUnit, pair)
    with torch.no_grad():
        for p in model.parameters():  # weights no fresh model has
            p.add_(0.01 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    state = fsdp.full_state_dict(model)
    fsdp.save_sharded(model, folder, group=pair)
    dist.barrier(group=pair)
    if RANK != 0:
        return {}
    x = batch(0, 0, 1, cfg)[0][:4]
    expected = build_model(cfg)
    expected.load_state_dict(state)
    single = shard_model(build_model(cfg), ReferenceUnit, alone)
    saved_world = fsdp.load_sharded(single, folder)
    with torch.no_grad():
        diff = float((single(x)[0] - expected(x)[0]).abs().max())
    return {"saved_world": saved_world, "logit_diff": diff}


def main() -> None:
    launcher.join(limit(30))
    torch.set_num_threads(1)
    wanted = set(filter(None, os.environ.get("MINIGPT_SCENARIOS", "").split(","))) or None

    def group(timeout_s: float = 20.0):
        return dist.new_group([0, 1], timeout=datetime.timedelta(seconds=limit(timeout_s)))

    names = [
        "gather",
        "reduce",
        "norm",
        "norm_bits",
        "prefetch",
        "hooks",
        "hooks_prefetch",
        "hooks_twice",
        "train",
        "odd32",
        "odd64",
        "tie",
        "f64",
        "ckpt",
        "ignored",
    ]
    groups = {name: group() for name in names}
    alone = dist.new_group([0])  # a world of one, for the checkpoint loaded at 1 rank

    def run(name: str, tag: str, fn) -> None:
        if wanted is not None and tag not in wanted:
            return
        os.environ[impl.ONLY_ENV_VAR] = "all" if tag == "maintainer" else tag
        record(f"{name}@{tag}", fn)

    run("gather", "4.1", lambda: gather_round_trip(groups["gather"]))
    run("reduce", "4.4", lambda: reduce_scatter_padded(groups["reduce"]))
    run("norm", "4.4", lambda: norm_of_shards(groups["norm"]))
    run("norm_bits", "4.4", lambda: norm_bits_on_minigpt(groups["norm_bits"]))
    run("prefetch", "4.5", lambda: prefetch_schedule(groups["prefetch"]))
    run("odd32", "maintainer", lambda: odd_model_against_one_process(groups["odd32"], torch.float32))
    run("odd64", "maintainer", lambda: odd_model_against_one_process(groups["odd64"], torch.float64))
    run("tie", "maintainer", lambda: tie_across_units(groups["tie"]))
    run("f64", "maintainer", lambda: float64_minigpt(groups["f64"]))
    run("ignored", "maintainer", lambda: ignored_norms(groups["ignored"]))
    if wanted is None or "maintainer" in wanted:
        folder = [tempfile.mkdtemp(prefix="fsdp-ckpt-") + "/ckpt" if RANK == 0 else None]
        dist.broadcast_object_list(folder, src=0)
        run("ckpt", "maintainer", lambda: checkpoint_two_to_one(groups["ckpt"], alone, folder[0]))
    # the learner's hooks and the whole FSDP last: a hook that skips a gather crashes in backward
    run("hooks", "4.3", lambda: hooks_on_minigpt(groups["hooks"]))
    run("hooks_prefetch", "4.3", lambda: forward_prefetch_on_minigpt(groups["hooks_prefetch"]))
    run("hooks_twice", "4.3", lambda: unit_called_twice(groups["hooks_twice"]))
    run("train", "all", lambda: train_minigpt(groups["train"]))
    if RANK == 0 and (wanted is None or "maintainer" in wanted):
        shutil.rmtree(Path(folder[0]).parent, ignore_errors=True)  # the checkpoint drill's folder, read by now
    (OUT / f"rank{RANK}.json").write_text(json.dumps({**RESULTS, "finished": {"ok": True}}))
    os._exit(0)  # no polite tear-down: a peer stuck in a broken group must not hold us


if __name__ == "__main__":
    main()
