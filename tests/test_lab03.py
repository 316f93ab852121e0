"""Lab 03 · FSDP prefetch: the learner's prediction of FSDP's order of events (held against the
logs of real runs), the global gradient norm from shards, and the choice of wrap units.

``--impl=exercises`` runs the same tests on ``lab/exercises/lab03_fsdp.py``. No process is
started: the real runs' logs are the committed ``lab/results/03-prefetch-cpu.json`` (written by
``lab/03_fsdp_prefetch.py``; ``tests/test_lab03_run.py`` checks a fresh run against the same
rules) and ``lab/results/03-practice-cpu.json``.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

from minigpt.model import GPTConfig, MiniGPT
from tests.launcher import ROOT
from tests.words import say

pytestmark = pytest.mark.lab("03")

PREFETCH = json.loads((ROOT / "lab" / "results" / "03-prefetch-cpu.json").read_text())
PRACTICE = json.loads((ROOT / "lab" / "results" / "03-practice-cpu.json").read_text())


def check_against_the_real_run(lab03, variants: list[str]) -> None:
    n_blocks = PREFETCH["n_layer"]
    for variant in variants:
        predicted = lab03.predict_event_order(n_blocks, variant)
        for rank, recorded in enumerate(PREFETCH["variants"][variant]["schedule"]):
            if predicted != recorded:
                first = next(
                    (i for i, (a, b) in enumerate(zip(predicted, recorded)) if a != b),
                    min(len(predicted), len(recorded)),
                )
                pytest.fail(
                    f"{variant}, rank {rank}: yours and the real run differ at event {first}: "
                    f"yours {predicted[first : first + 3]}, the run {recorded[first : first + 3]}"
                )


# --- Exercise 3.1: predict the order -----------------------------------------------------------


@pytest.mark.exercise("3.1")
@pytest.mark.points(2)
def test_event_order_fsdp2_defaults(lab03):
    check_against_the_real_run(lab03, ["fsdp2-implicit", "fsdp2-no-reshard", "fsdp2-async-unshard"])


@pytest.mark.exercise("3.1")
@pytest.mark.points(2)
def test_event_order_fsdp2_explicit_prefetch(lab03):
    check_against_the_real_run(lab03, ["fsdp2-explicit-forward", "fsdp2-explicit-backward", "fsdp2-async-explicit"])


@pytest.mark.exercise("3.1")
@pytest.mark.points(2)
def test_event_order_fsdp1_backward_prefetch(lab03):
    check_against_the_real_run(lab03, ["fsdp1-no-prefetch", "fsdp1-backward-pre", "fsdp1-backward-post"])


@pytest.mark.exercise("3.1")
@pytest.mark.points(1)
def test_event_order_fsdp1_forward_prefetch(lab03):
    check_against_the_real_run(lab03, ["fsdp1-forward-prefetch"])


@pytest.mark.exercise("3.1")
@pytest.mark.points(1)
def test_event_order_rejects_bad_input(lab03):
    with pytest.raises(ValueError):
        lab03.predict_event_order(4, "fsdp3-magic")
    with pytest.raises(ValueError):
        lab03.predict_event_order(0, "fsdp2-implicit")


# --- Exercise 3.2: the global gradient norm ----------------------------------------------------


def shards_of(full: torch.Tensor, n: int) -> list[torch.Tensor]:
    """``full`` cut into n equal shards, the last padded with zeros, as FSDP pads."""
    size = -(-full.numel() // n)
    padded = torch.cat([full.flatten(), torch.zeros(size * n - full.numel(), dtype=full.dtype)])
    return list(padded.split(size))


@pytest.mark.exercise("3.2")
@pytest.mark.points(2)
@pytest.mark.parametrize("norm_type", [2.0, 1.0, math.inf])
def test_global_norm_from_shards_is_the_norm_of_the_whole(lab03, norm_type):
    torch.manual_seed(0)
    grads = [torch.randn(37, 5), torch.randn(101), torch.randn(3, 3, 3)]
    whole = float(torch.linalg.vector_norm(torch.cat([g.flatten() for g in grads]).double(), norm_type))
    for n in (1, 2, 3):
        terms = [lab03.local_norm_term([shards_of(g, n)[r] for g in grads], norm_type) for r in range(n)]
        assert lab03.global_grad_norm_from_shards(terms, norm_type) == pytest.approx(whole, rel=1e-12), f"N={n}"
    assert lab03.local_norm_term([], norm_type) == 0


@pytest.mark.exercise("3.2")
@pytest.mark.points(1)
def test_the_real_runs_norms(lab03):
    clip = PRACTICE["clipping"]
    terms = [x**2 for x in clip["local_norms"]]  # what each rank measured of its own shard
    ours = lab03.global_grad_norm_from_shards(terms)
    assert ours == pytest.approx(clip["single_process_norm"], rel=1e-6)  # one process, whole gradient
    assert all(local < ours for local in clip["local_norms"])


@pytest.mark.exercise("3.2")
@pytest.mark.points(1)
def test_global_norm_rejects_bad_input(lab03):
    with pytest.raises(ValueError):
        lab03.global_grad_norm_from_shards([])
    with pytest.raises(ValueError):
        lab03.global_grad_norm_from_shards([1.0, 2.0], norm_type=0)


# --- Exercise 3.3: the wrap units --------------------------------------------------------------


@pytest.fixture(scope="module")
def model():
    return MiniGPT(GPTConfig())


@pytest.mark.exercise("3.3")
@pytest.mark.points(2)
def test_units_of_each_policy(lab03, model):
    assert lab03.units_of_policy(model, "whole") == []
    blocks = lab03.units_of_policy(model, "block")
    assert len(blocks) == len(model.blocks) and all(a is b for a, b in zip(blocks, model.blocks))
    linears = lab03.units_of_policy(model, "linear")
    in_blocks = [m for b in model.blocks for m in b.modules() if isinstance(m, nn.Linear)]
    assert len(linears) == len(in_blocks) and {id(m) for m in linears} == {id(m) for m in in_blocks}


@pytest.mark.exercise("3.3")
@pytest.mark.points(2)
def test_no_parameter_in_two_units(lab03, model):
    for policy in ("block", "linear"):
        seen: dict[int, int] = {}
        for unit in lab03.units_of_policy(model, policy):
            for p in unit.parameters():
                seen[id(p)] = seen.get(id(p), 0) + 1
        assert all(n == 1 for n in seen.values()), policy
        assert id(model.wte.weight) not in seen, f"{policy}: the tied embedding must stay in the root"


@pytest.mark.exercise("3.3")
@pytest.mark.points(1)
def test_units_reject_an_unknown_policy(lab03, model):
    with pytest.raises(ValueError):
        lab03.units_of_policy(model, "every-other-block")


# --- All together: your units, your predicted order and your norm, on one model -----------------


@pytest.mark.exercise("all")
@pytest.mark.points(2)
def test_all_together_your_units_your_order_and_your_norm(lab03):
    """All of your Lab 03 code on one MiniGPT wrapped per block: the units your policy makes (3.3)
    are the units your prediction gathers (3.1), and the norm of the model's gradient, cut into two
    ranks' shards unit by unit as FSDP cuts it, comes back whole through your two functions (3.2)."""
    from minigpt import grammar

    torch.manual_seed(0)
    model = MiniGPT(GPTConfig(n_layer=3))
    names = {id(module): name for name, module in model.named_modules()}
    units = [names[id(m)] for m in lab03.units_of_policy(model, "block")]
    gathered = [
        e.split(" ", 1)[1] for e in lab03.predict_event_order(3, "fsdp2-implicit") if e.startswith("all-gather")
    ]
    assert sorted(set(gathered) - {"root"}) == sorted(units), say(
        f"your 'block' units are {units}, your predicted order all-gathers {sorted(set(gathered))}",
        f"tus unidades de 'block' son {units}, tu orden predicho hace all-gather de {sorted(set(gathered))}",
    )
    x, y, mask = grammar.get_batch("train", 0, 8)
    model(x, y, mask)[1].backward()
    grads = [p.grad for p in model.parameters()]
    whole = float(torch.linalg.vector_norm(torch.cat([g.flatten() for g in grads]).double()))
    terms = [lab03.local_norm_term([shards_of(g, 2)[r] for g in grads]) for r in range(2)]
    ours = lab03.global_grad_norm_from_shards(terms)
    assert ours == pytest.approx(whole, rel=1e-12), say(
        f"MiniGPT's gradient norm from two ranks' shards: yours {ours!r}, the whole gradient's {whole!r}",
        f"norma del gradiente de MiniGPT desde los fragmentos de dos ranks: la tuya {ours!r}, "
        f"la del gradiente entero {whole!r}",
    )
