"""One rank of the ZeRO-1 test launch: ``python tests/zero1_worker.py OUTDIR`` under RANK/WORLD_SIZE
(started by tests/launcher.py with 3 ranks). Runs the ZeRO-1 scenarios of tests/test_lab02.py that
``MINIGPT_SCENARIOS`` asks for (tests/ranks.py), on groups of 2 and 3 ranks, with the
implementation ``MINIGPT_IMPL`` selects and only the scenario's exercise the learner's, and writes
``OUTDIR/rank<r>.json`` after each: ``{scenario: {"ok": bool, "error": str, ...}}``.

The model, :class:`Toy`, has what real models have and MiniGPT does not: a frozen parameter, tied
weights, a layer used only in some steps (``extra``) and a parameter used only on rank 0, only in
odd steps (``lonely``). Every scenario holds the ZeRO-1 optimizer against a plain ``torch.optim``
optimizer in one process that accumulates the same micro-batches (each rank's loss divided by
the world size): on 2 ranks both compute a/2 + b/2, so they must agree bit for bit.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from minigpt import impl
from minigpt.parallel import ring
from tests import launcher
from tests.limits import limit

OUT = Path(sys.argv[1]) if __name__ == "__main__" else None
RANK, WORLD = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
RESULTS: dict[str, dict] = {}
STEPS = 10
OPTIMIZERS = {
    "adamw": (torch.optim.AdamW, {"lr": 0.05, "weight_decay": 0.1}),
    "sgd": (torch.optim.SGD, {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.1}),
}


def record(name: str, fn) -> None:
    launcher.record(RESULTS, OUT, RANK, name, fn)


class Toy(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(12, 6)
        self.hidden = nn.Linear(6, 6)
        self.frozen = nn.Parameter(torch.full((2,), 2.0), requires_grad=False)
        self.extra = nn.Linear(6, 6)
        self.lonely = nn.Parameter(torch.ones(3))
        self.head = nn.Linear(6, 12, bias=False)
        self.head.weight = self.embed.weight  # tied

    def forward(self, tokens: torch.Tensor, use_extra: bool, use_lonely: bool) -> torch.Tensor:
        h = torch.tanh(self.hidden(self.embed(tokens))) * self.frozen[0]
        if use_extra:
            h = self.extra(h)
        loss = self.head(h).logsumexp(-1).mean()
        return loss + self.lonely.square().sum() if use_lonely else loss


def batch(step: int, rank: int) -> torch.Tensor:
    return torch.randint(0, 12, (4, 5), generator=torch.Generator().manual_seed(1000 * step + rank))


def usage(step: int, rank: int, mode: str) -> tuple[bool, bool]:
    """(use extra, use lonely) of ``rank`` at ``step``: all used ("all"), or some not ("some")."""
    if mode == "all":
        return True, True
    return step % 3 == 0, rank == 0 and step % 2 == 1


def flat_params(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def run(group, size: int, optimizer: str, mode: str) -> dict:
    """STEPS steps of ZeRO-1 (the implementation under test) against one process."""
    ZeroOne = impl.load("lab02_zero", "ZeroOneOptimizer")
    cls, settings = OPTIMIZERS[optimizer]
    model, reference = Toy(), Toy()
    zero = ZeroOne(model.parameters(), cls, process_group=group, **settings)
    plain = cls(reference.parameters(), **settings)
    rank = dist.get_rank(group)
    untouched, touched_while_unused = [], []
    sent, closure_problems, settings_problems, reduced_left = [], [], [], []
    for step in range(STEPS):
        lr = settings["lr"] * (1 - step / (2 * STEPS))  # a schedule: the settings change every step
        for g in (*zero.param_groups, *plain.param_groups):
            g["lr"] = lr
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        zero.zero_grad()
        model(batch(step, rank), *usage(step, rank, mode)).backward()
        zero.counter.reset()
        calls, loss = [], torch.tensor(float(step))  # a closure on odd steps: it notes the grad mode
        closure = partial(probe, calls, loss)
        returned = zero.step(closure) if step % 2 else zero.step()
        if (step % 2 and (calls != [True] or returned is not loss)) or (not step % 2 and returned is not None):
            closure_problems.append(
                {
                    "step": step,
                    "closure": bool(step % 2),
                    "grad_enabled": calls,
                    "returned": returned_what(returned, loss),
                }
            )
        inner = [g["lr"] for g in zero.local.param_groups]
        if inner != [lr] * len(inner):
            settings_problems.append({"step": step, "lr": lr, "inner_lr": inner})
        if zero._reduced:
            reduced_left.append(step)
        sent.append(zero.counter.sent)
        plain.zero_grad(set_to_none=True)
        for r in range(size):
            (reference(batch(step, r), *usage(step, r, mode)) / size).backward()
        plain.step()
        # a parameter no rank used this step must not move
        used_anywhere = {
            "extra": any(usage(step, r, mode)[0] for r in range(size)),
            "lonely": any(usage(step, r, mode)[1] for r in range(size)),
        }
        for name, p in model.named_parameters():
            key = name.split(".")[0]
            if key in used_anywhere and not used_anywhere[key]:
                untouched.append(name)
                if not torch.equal(p.detach(), before[name]):
                    touched_while_unused.append(f"{name} at step {step}")
    diff = float((flat_params(model) - flat_params(reference)).abs().max())
    state = zero.full_state()
    trainable = [p for p in reference.parameters() if p.requires_grad]
    twin = {id(p): q for p, q in zip(model.parameters(), reference.parameters())}  # same order, same names
    state_diff = 0.0
    for p, s in zip(zero.groups[0].params, state[0]):
        ref = plain.state.get(twin[id(p)])
        if (s is None) != (not ref):
            state_diff = float("inf")
            continue
        for key, value in (s or {}).items():
            state_diff = max(state_diff, float((value.float() - ref[key].float()).abs().max()))
    flat_numel = sum(g.flat.numel() for g in zero.groups if g is not None)
    return {
        "max_param_diff": diff,
        "bit_identical": diff == 0.0,
        "max_state_diff": state_diff,
        "frozen": model.frozen.tolist(),
        "frozen_in_flat": any(
            g is not None
            and model.frozen.data_ptr() >= g.flat.data_ptr()
            and model.frozen.data_ptr() < g.flat.data_ptr() + g.flat.numel() * g.flat.element_size()
            for g in zero.groups
        ),
        "flat_numel": flat_numel,
        "trainable_numel": sum(p.numel() for p in trainable),
        "untouched_checked": len(untouched),
        "touched_while_unused": touched_while_unused,
        "sent": sent,
        "expected_sent": expected_bytes(zero, size, rank),
        "closure_problems": closure_problems,
        "settings_problems": settings_problems,
        "reduced_left_true": reduced_left,
    }


def probe(calls: list[bool], loss: torch.Tensor) -> torch.Tensor:
    """A closure that notes whether gradients were enabled when it was called, and returns ``loss``."""
    calls.append(torch.is_grad_enabled())
    return loss


def returned_what(returned, loss: torch.Tensor) -> str:
    """What ``step()`` returned, in a word the test can print: "loss" (the closure's), "None", or its type."""
    if returned is loss:
        return "loss"
    return "None" if returned is None else type(returned).__name__


def expected_bytes(zero, size: int, rank: int) -> int:
    """What one step sends on Lab 01's ring: the usage marks (one byte per trainable parameter)
    all-reduced; each group's gradient reduce-scattered (every chunk but our own) and its weights
    all-gathered (every chunk but our right neighbour's)."""

    def ring_bytes(numel: int, element: int, skip: list[int]) -> int:
        bounds = ring.chunk_bounds(numel, size)
        return element * (numel - sum(bounds[k][1] - bounds[k][0] for k in skip))

    marks = len(zero._index)
    total = ring_bytes(marks, 1, [rank]) + ring_bytes(marks, 1, [(rank + 1) % size])
    for g in zero.groups:
        if g is not None:
            total += ring_bytes(g.flat.numel(), g.flat.element_size(), [rank])
            total += ring_bytes(g.flat.numel(), g.flat.element_size(), [(rank + 1) % size])
    return total


# which exercise's tests read each mode: "all" mode (every step uses every parameter but the frozen
# one) for the frozen parameter's cost (2.4) and the equality with torch.optim (2.5), "some" mode
# for the parameters without gradient and the bytes (2.5); the end-to-end test reads "some" with
# all of the learner's code
RUNS = (("all", "2.4"), ("all", "2.5"), ("some", "2.5"), ("some", "all"))


def main() -> None:
    launcher.join(limit(30))
    torch.set_num_threads(1)
    wanted = set(filter(None, os.environ.get("MINIGPT_SCENARIOS", "").split(","))) or None  # None: all
    for size in (2, 3):
        group = dist.new_group(list(range(size)), timeout=datetime.timedelta(seconds=limit(20)))
        for optimizer in OPTIMIZERS:
            for mode, exercise in RUNS:
                if wanted is not None and exercise not in wanted:
                    continue
                if exercise == "all" and (size, optimizer) != (3, "adamw"):
                    continue  # the end-to-end test: one run on 3 ranks
                name = f"zero1_{size}_{optimizer}_{mode}@{exercise}"
                os.environ[impl.ONLY_ENV_VAR] = exercise
                if RANK < size:
                    record(name, partial(run, group, size, optimizer, mode))
                else:
                    RESULTS[name] = {"ok": True, "idle": True}
        dist.barrier()
    (OUT / f"rank{RANK}.json").write_text(json.dumps(RESULTS))
    sys.stdout.flush()
    os._exit(0)  # no polite tear-down: a peer stuck in a broken group must not hold us


if __name__ == "__main__":
    main()
