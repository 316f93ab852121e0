"""One rank of the Lab 05 test launch: ``python tests/tp_scratch_worker.py OUTDIR`` under
RANK/WORLD_SIZE (started by tests/launcher.py through the ``tp_scratch`` fixture: 4 ranks when
Exercise 5.2 is graded, else 2).

The world is cut into tensor-parallel groups of ``TP`` = 2 consecutive ranks, {0, 1} and {2, 3}, and
every scenario runs on the rank's own group: a learner's f or g that talks on the default group
instead of the group it is given sums over the whole world, which the 4-rank launch shows (Exercise
5.2's scenarios give each group its own data). It runs the multi-process scenarios of
tests/test_lab05.py that ``MINIGPT_SCENARIOS`` asks for (an exercise or "all"; every one when
unset), each with only its exercise the learner's (``MINIGPT_EXERCISE``), and writes
``OUTDIR/rank<r>.json`` after every scenario. Every scenario gets its own process groups with a short
timeout, created up front in the same order on every rank, so a learner's f or g that skips a
collective costs only the tests that read that scenario. Every rank builds every group's inputs from
the same seeds, so the one-process reference is computed on every rank.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn import functional as F

from minigpt import impl
from minigpt.model import GPTConfig, MiniGPT
from minigpt.parallel.ring import ByteCounter
from minigpt.parallel.tensor_parallel import gather_logits, merge_sequence, ring_attention, split_sequence
from minigpt.parallel.tensor_parallel.kit import kit_for
from minigpt.parallel.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from tests import launcher
from tests.limits import limit
from tests.watch import collectives

OUT = Path(sys.argv[1]) if __name__ == "__main__" else None
RANK, WORLD = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
TP = 2  # the ranks of one tensor-parallel group: {0, 1}, and {2, 3} on 4 ranks
TP_RANK, GROUP_INDEX = RANK % TP, RANK // TP
MEMBERS = list(range(GROUP_INDEX * TP, (GROUP_INDEX + 1) * TP))  # this rank's group
RESULTS: dict[str, dict] = {}
VOCAB = 13  # the loss's vocabulary: 14 columns on 2 ranks, the last one padding
BATCH, SEQ = 2, 16


def record(name: str, fn) -> None:
    launcher.record(RESULTS, OUT, RANK, name, fn)


def learners(name: str):
    return impl.load("lab05_tensor_parallel", name)


def diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach().double() - b.detach().double()).abs().max())


# ----------------------------------------------------------------------------------------------
# Exercise 5.2: f and g, alone and around a column-then-row MLP


def f_and_g_inputs() -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """Every group's input of f (the same on the ranks of a group, another in each group), and every
    rank's incoming gradient and term of g, for the whole world."""
    g = torch.Generator().manual_seed(5)
    x = [torch.randn(3, 4, generator=g, dtype=torch.float64) for _ in range(WORLD // TP)]
    upstream = [torch.randn(3, 4, generator=g, dtype=torch.float64) for _ in range(WORLD)]
    partial = [torch.randn(3, 4, generator=g, dtype=torch.float64) for _ in range(WORLD)]
    return x, upstream, partial


def summed_over_the_world(got: torch.Tensor | None, total: torch.Tensor) -> bool:
    """Is ``got`` the sum over every rank of the world, ``total``, not only over this rank's group?"""
    return WORLD > TP and got is not None and got.shape == total.shape and diff(got, total) <= 1e-12


def f_alone(group) -> dict:
    """f: the identity forward (no bytes sent), the sum of its group's gradients backward."""
    copy_to_tp = learners("copy_to_tp")
    x, upstream, _ = f_and_g_inputs()
    xf = x[GROUP_INDEX].clone().requires_grad_()
    counter = ByteCounter()
    y = copy_to_tp(xf, group, counter)
    forward_bytes = counter.sent
    (y * upstream[RANK]).sum().backward()
    return {
        "group": MEMBERS,
        "world": WORLD,
        "forward": diff(y, x[GROUP_INDEX]) if y.shape == xf.shape else float("inf"),
        "forward_bytes": forward_bytes,
        "backward": None if xf.grad is None else diff(xf.grad, sum(upstream[r] for r in MEMBERS)),
        "backward_own": xf.grad is not None and diff(xf.grad, upstream[RANK]) == 0.0,
        "backward_world": summed_over_the_world(xf.grad, sum(upstream)),
    }


def g_alone(group) -> dict:
    """g: the sum of its group's terms forward, the identity backward."""
    reduce_from_tp = learners("reduce_from_tp")
    _, upstream, partial = f_and_g_inputs()
    p = partial[RANK].clone().requires_grad_()
    z = reduce_from_tp(p, group, ByteCounter())
    (z * upstream[RANK]).sum().backward()
    return {
        "group": MEMBERS,
        "world": WORLD,
        "forward": diff(z, sum(partial[r] for r in MEMBERS)) if z.shape == p.shape else float("inf"),
        "forward_world": summed_over_the_world(z, sum(partial)),
        "backward": None if p.grad is None else diff(p.grad, upstream[RANK]),
        "backward_summed": p.grad is not None and diff(p.grad, sum(upstream[r] for r in MEMBERS)) == 0.0,
    }


def mlp_against_one_process(group) -> dict:
    """A column-parallel Linear, GELU, a row-parallel Linear (biases away from zero), built with the
    learner's kit, against the same MLP in one process: output, the input's gradient, the weights'.
    Each tensor-parallel group runs it on its own input, so a sum over the whole world shows."""
    kit = kit_for()
    torch.manual_seed(0)
    fc, proj = torch.nn.Linear(8, 16, dtype=torch.float64), torch.nn.Linear(16, 8, dtype=torch.float64)
    inputs = [torch.randn(2, 5, 8, dtype=torch.float64) for _ in range(WORLD // TP)]
    w = torch.randn(2, 5, 8, dtype=torch.float64)
    x_grads = []
    for x in inputs:  # one process, on every group's input: a wrong f's sum over the world is theirs
        xa = x.clone().requires_grad_()
        (proj(F.gelu(fc(xa))) * w).sum().backward()
        x_grads.append(xa.grad)
    fc.zero_grad(), proj.zero_grad()
    x = inputs[GROUP_INDEX]
    xa = x.clone().requires_grad_()
    (proj(F.gelu(fc(xa))) * w).sum().backward()
    col = ColumnParallelLinear.from_linear(fc, group, kit=kit)
    row = RowParallelLinear.from_linear(proj, group, kit=kit)
    xb = x.clone().requires_grad_()
    out = row(F.gelu(col(xb)))
    (out * w).sum().backward()
    half = 16 // TP
    mine = slice(TP_RANK * half, (TP_RANK + 1) * half)
    return {
        "out": diff(out, proj(F.gelu(fc(x)))),
        "x_grad": None if xb.grad is None else diff(xb.grad, xa.grad),
        "fc_grad": diff(col.weight.grad, fc.weight.grad[mine]),
        "proj_grad": diff(row.weight.grad, proj.weight.grad[:, mine]),
        "proj_bias_grad": diff(row.bias.grad, proj.bias.grad),
        "group": MEMBERS,
        "world": WORLD,
        "x_grad_world": summed_over_the_world(xb.grad, sum(x_grads)),
    }


# ----------------------------------------------------------------------------------------------
# Exercise 5.3: the vocabulary-parallel cross-entropy


def padding_grad(grad: torch.Tensor | None, start: int, per_rank: int) -> float:
    """The largest gradient in this rank's padding columns (those at or past VOCAB), 0 if none."""
    first = max(VOCAB - start, 0)
    if grad is None or first >= per_rank:
        return 0.0
    return float(grad[..., first:].abs().max())


def cross_entropy(group) -> dict:
    loss_fn = learners("vocab_parallel_cross_entropy")
    g = torch.Generator().manual_seed(3)
    padded = -(-VOCAB // TP) * TP
    per_rank = padded // TP
    full = 3 * torch.randn(BATCH, SEQ, padded, generator=g, dtype=torch.float64)
    full[..., VOCAB:] = 50.0  # padding columns holding large values: they must count for nothing
    targets = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    targets[0, :4] = torch.tensor([VOCAB - 1, 0, per_rank - 1, per_rank])  # both edges of each slice
    weight = torch.rand(BATCH, SEQ, generator=g, dtype=torch.float64)
    truth = full[..., :VOCAB].clone().requires_grad_()
    expected = F.cross_entropy(truth.transpose(1, 2), targets, reduction="none")
    (expected * weight).sum().backward()

    start = TP_RANK * per_rank
    local = full[..., start : start + per_rank].clone().requires_grad_()
    counter = ByteCounter()
    loss = loss_fn(local, targets, start, VOCAB, group, counter)
    shape = list(loss.shape)
    gathered = [torch.empty_like(loss.detach()) for _ in range(TP)]
    dist.all_gather(gathered, loss.detach().contiguous(), group=group)
    sent = counter.sent
    with collectives() as backward_calls:
        (loss * weight).sum().backward()
    grad_padded = torch.cat([truth.grad, truth.grad.new_zeros(BATCH, SEQ, padded - VOCAB)], dim=-1)
    return {
        "shape": shape,
        "loss": diff(loss, expected) if shape == [BATCH, SEQ] else None,
        "ranks_agree": all(torch.equal(t, gathered[0]) for t in gathered),
        "grad": None if local.grad is None else diff(local.grad, grad_padded[..., start : start + per_rank]),
        "padding_grad": padding_grad(local.grad, start, per_rank),
        "bytes": sent,
        "logit_bytes": BATCH * SEQ * padded * 8,
        "backward_bytes": counter.sent - sent,
        "backward_calls": [name for name, _ in backward_calls],
        "large": large_logits(loss_fn, group, targets, start, per_rank),
    }


def large_logits(loss_fn, group, targets: torch.Tensor, start: int, per_rank: int) -> dict:
    """The learner's loss on logits in the thousands (exp() of them overflows even float64): is it
    finite, and how far from one process's cross-entropy (relative to the loss's size)?"""
    g = torch.Generator().manual_seed(4)
    full = 3000 * torch.randn(BATCH, SEQ, per_rank * TP, generator=g, dtype=torch.float64)
    expected = F.cross_entropy(full[..., :VOCAB].transpose(1, 2), targets, reduction="none")
    try:
        loss = loss_fn(full[..., start : start + per_rank].clone(), targets, start, VOCAB, group, ByteCounter())
    except Exception as exc:  # noqa: BLE001 - reported, not raised: the other checks of the scenario stand
        return {"error": f"{type(exc).__name__}: {str(exc)[:120]}"}
    finite = bool(torch.isfinite(loss).all())
    return {
        "finite": finite,
        "error_relative": diff(loss, expected) / float(expected.abs().max()) if finite else None,
    }


# ----------------------------------------------------------------------------------------------
# All together: the learner's kit in TPMiniGPT and in ring attention


def model_against_one_process(group) -> dict:
    from minigpt.parallel.tensor_parallel import TPMiniGPT

    torch.manual_seed(0)
    one = MiniGPT(GPTConfig(n_layer=2))
    with torch.no_grad():  # biases and norms away from their init, so a bias counted twice shows
        for name, p in one.named_parameters():
            if name.endswith("bias") or ".ln_" in name or name.startswith("ln_f"):
                p.add_(0.1 * torch.randn_like(p))
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, 609, (BATCH, SEQ), generator=g)
    targets = torch.randint(0, 609, (BATCH, SEQ), generator=g)
    targets[0, :3] = torch.tensor([608, 304, 305])
    mask = torch.rand(BATCH, SEQ, generator=g) < 0.7
    logits, loss = one(idx, targets, mask)
    loss.backward()
    grads = {n: p.grad for n, p in one.named_parameters()}
    tp = TPMiniGPT(one, group, kit=kit_for(), counter=ByteCounter())
    local, tp_loss = tp(idx, targets, mask)
    tp_loss.backward()
    tp_grads = tp.full_state_dict(grads=True)
    worst = max(grads, key=lambda n: diff(tp_grads[n], grads[n]))
    return {
        "logits": diff(gather_logits(local, 609, group), logits),
        "loss": abs(float(tp_loss) - float(loss)),
        "grads": diff(tp_grads[worst], grads[worst]),
        "worst": worst,
    }


def full_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    T = q.shape[2]
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    return F.softmax(scores, dim=-1) @ v


def ring_against_full(group) -> dict:
    kit = kit_for()
    cases = {}
    for balanced in (False, True):
        g = torch.Generator().manual_seed(8)
        q, k, v, w = (torch.randn(2, 2, SEQ, 4, generator=g, dtype=torch.float64) for _ in range(4))
        q = 3 * q  # sharp rows: a later block often raises a row's maximum
        full = [t.clone().requires_grad_() for t in (q, k, v)]
        ref = full_causal_attention(*full)
        (ref * w).sum().backward()
        mine = [split_sequence(t, TP, TP_RANK, balanced).requires_grad_() for t in (q, k, v)]
        out = ring_attention(*mine, group=group, counter=ByteCounter(), load_balanced=balanced, kit=kit)
        (out * split_sequence(w, TP, TP_RANK, balanced)).sum().backward()
        pieces = [torch.empty_like(out.detach()) for _ in range(TP)]
        dist.all_gather(pieces, out.detach().contiguous(), group=group)
        cases["load-balanced" if balanced else "contiguous"] = {
            "out": diff(merge_sequence(pieces, balanced), ref),
            "grads": max(diff(m.grad, split_sequence(f.grad, TP, TP_RANK, balanced)) for m, f in zip(mine, full)),
        }
    return {"cases": cases}


def main() -> None:
    launcher.join(limit(30))
    torch.set_num_threads(1)
    wanted = set(filter(None, os.environ.get("MINIGPT_SCENARIOS", "").split(","))) or None

    def group(timeout_s: float = 20.0):
        """Every tensor-parallel group of the world, created on every rank in the same order: this
        rank's own."""
        timeout = datetime.timedelta(seconds=limit(timeout_s))
        made = [dist.new_group(list(range(first, first + TP)), timeout=timeout) for first in range(0, WORLD, TP)]
        return made[GROUP_INDEX]

    names = ["f", "g", "mlp", "ce", "model", "ring"]
    groups = {name: group() for name in names}

    def run(name: str, tag: str, fn) -> None:
        if wanted is not None and tag not in wanted:
            return
        os.environ[impl.ONLY_ENV_VAR] = tag
        record(f"{name}@{tag}", fn)

    run("f", "5.2", lambda: f_alone(groups["f"]))
    run("g", "5.2", lambda: g_alone(groups["g"]))
    run("mlp", "5.2", lambda: mlp_against_one_process(groups["mlp"]))
    run("ce", "5.3", lambda: cross_entropy(groups["ce"]))
    run("model", "all", lambda: model_against_one_process(groups["model"]))
    run("ring", "all", lambda: ring_against_full(groups["ring"]))
    (OUT / f"rank{RANK}.json").write_text(json.dumps({**RESULTS, "finished": {"ok": True}}))
    os._exit(0)  # no polite tear-down: a peer stuck in a broken group must not hold us


if __name__ == "__main__":
    main()
