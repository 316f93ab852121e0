"""Lab 00 · MiniGPT and the baseline: the graded checks of lab/exercises/lab00_baseline.py.

Run against your own code with ``pytest tests/test_lab00.py --impl=exercises``.
Expected values are computed here independently (loops, closed forms), never taken from the
reference implementation.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn import functional as F

from minigpt.model import GPTConfig, MiniGPT
from tests.words import say

pytestmark = [pytest.mark.lab("00"), pytest.mark.timeout(30)]  # a looping exercise fails, never hangs


# Exercise 0.1 · the causal mask ---------------------------------------------------------------


@pytest.mark.exercise("0.1")
@pytest.mark.points(2)
def test_causal_mask_values(lab00):
    mask = lab00.causal_mask(5)
    assert isinstance(mask, torch.Tensor) and mask.dtype == torch.bool, "return a bool tensor"
    assert mask.shape == (5, 5)
    for i in range(5):
        for j in range(5):
            assert bool(mask[i, j]) == (j <= i), f"mask[{i}, {j}] should be {j <= i} (query {i}, key {j})"


@pytest.mark.exercise("0.1")
@pytest.mark.points(2)
def test_causal_mask_hides_the_future_in_the_model(lab00):
    """Plugged into MiniGPT: changing token t must not change any logit before t."""
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=50, block_size=12, n_layer=2, n_head=2, n_embd=16)
    model = MiniGPT(config).eval()
    for block in model.blocks:
        block.attn.mask = lab00.causal_mask(config.block_size)
    idx = torch.randint(0, 50, (2, 12))
    changed = idx.clone()
    changed[:, 7] = (changed[:, 7] + 1) % 50
    with torch.no_grad():
        a, _ = model(idx)
        b, _ = model(changed)
    assert torch.equal(a[:, :7], b[:, :7]), "positions 0..6 saw token 7: the mask lets the future in"
    assert not torch.equal(a[:, 7:], b[:, 7:]), "positions >= 7 must see token 7"


# Exercise 0.2 · the masked loss -------------------------------------------------------------


def _loop_loss(logits, targets, mask):
    rows = []
    for b in range(logits.shape[0]):
        keep = mask[b].nonzero().flatten()
        if len(keep) == 0:
            rows.append(torch.tensor(0.0))
            continue
        rows.append(sum(F.cross_entropy(logits[b, t][None], targets[b, t][None]) for t in keep) / len(keep))
    return torch.stack(rows).mean()


def _loss_inputs(seed=0, B=6, T=9, V=13):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, T, V, generator=g)
    targets = torch.randint(0, V, (B, T), generator=g)
    mask = torch.rand(B, T, generator=g) < 0.5
    mask[0] = False  # a row with nothing to count
    mask[1, 3] = True
    return logits, targets, mask


@pytest.mark.exercise("0.2")
@pytest.mark.points(2)
def test_masked_loss_value(lab00):
    logits, targets, mask = _loss_inputs()
    got = lab00.masked_loss(logits, targets, mask)
    assert got.shape == (), "return a scalar"
    expected = _loop_loss(logits, targets, mask)
    assert abs(float(got) - float(expected)) < 1e-5, f"got {float(got):.6f}, expected {float(expected):.6f}"


@pytest.mark.exercise("0.2")
@pytest.mark.points(1)
def test_masked_loss_ignores_unmasked_positions_and_has_gradients(lab00):
    logits, targets, mask = _loss_inputs(seed=1)
    logits.requires_grad_(True)
    loss = lab00.masked_loss(logits, targets, mask)
    loss.backward()
    assert logits.grad is not None, "the loss must be differentiable"
    assert torch.all(logits.grad[~mask] == 0), "unmasked positions must not get a gradient"
    noisy = logits.detach().clone()
    noisy[~mask] += 100.0
    assert torch.allclose(lab00.masked_loss(noisy, targets, mask), loss.detach())


@pytest.mark.exercise("0.2")
@pytest.mark.points(1)
def test_masked_loss_is_the_mean_of_equal_slices(lab00):
    """What data parallelism relies on: the batch loss is the mean of its slices' losses."""
    logits, targets, mask = _loss_inputs(seed=2, B=8)
    whole = lab00.masked_loss(logits, targets, mask)
    halves = [lab00.masked_loss(logits[s], targets[s], mask[s]) for s in (slice(0, 4), slice(4, 8))]
    assert abs(float(whole) - float(sum(halves) / 2)) < 1e-6


# Exercise 0.3 · the per-rank batch slice ----------------------------------------------------


@pytest.mark.exercise("0.3")
@pytest.mark.points(2)
def test_rank_slices_are_disjoint_and_cover_the_batch(lab00):
    for batch, world in [(64, 1), (64, 2), (64, 4), (12, 3), (8, 8)]:
        rows = []
        for rank in range(world):
            s = lab00.rank_slice(batch, rank, world)
            assert isinstance(s, slice), "return a slice"
            assert s.start == rank * batch // world and s.stop == (rank + 1) * batch // world, (
                f"rank {rank} of {world} with batch {batch}: expected rows {rank * batch // world}.."
                f"{(rank + 1) * batch // world - 1}, got {s}"
            )
            rows += list(range(batch))[s]
        assert rows == list(range(batch)), f"batch {batch}, world {world}: slices must tile the batch"


@pytest.mark.exercise("0.3")
@pytest.mark.points(1)
def test_rank_slice_rejects_what_cannot_work(lab00):
    with pytest.raises(ValueError, match="10"):
        lab00.rank_slice(10, 0, 3)  # 10 rows cannot be split evenly over 3 ranks
    with pytest.raises(ValueError):
        lab00.rank_slice(8, 2, 2)  # ranks are 0 and 1
    with pytest.raises(ValueError):
        lab00.rank_slice(8, 0, 0)


# Exercise 0.4 · the learning-rate schedule --------------------------------------------------


@pytest.mark.exercise("0.4")
@pytest.mark.points(2)
def test_lr_schedule(lab00):
    max_lr, min_lr, warmup, total = 1e-3, 1e-4, 10, 110
    lr = [lab00.lr_at(s, max_lr, min_lr, warmup, total) for s in range(total + 5)]
    assert math.isclose(lr[0], max_lr / warmup), "step 0 of warm-up is max_lr / warmup"
    assert math.isclose(lr[4], 5 * max_lr / warmup)
    assert math.isclose(lr[9], max_lr) and math.isclose(lr[10], max_lr)
    assert math.isclose(lr[60], (max_lr + min_lr) / 2), "half-way through the decay: the mean"
    assert math.isclose(lr[110], min_lr) and math.isclose(lr[114], min_lr), "after total: min_lr"
    assert all(a >= b for a, b in zip(lr[10:], lr[11:])), "the decay never goes up"


# All together · your four pieces train MiniGPT as data parallelism would ----------------------


@pytest.mark.exercise("all")
@pytest.mark.points(2)
def test_all_together_two_simulated_ranks_train_like_the_reference(lab00):
    """All of your Lab 00 code at once: MiniGPT with your causal mask (0.1), trained 3 SGD steps at
    your learning rates (0.4) by two simulated ranks, each on its slice of the batch (0.3) with your
    loss (0.2), their gradients averaged, ends where the reference pieces in one process end."""
    from minigpt import grammar, impl

    def train(causal_mask, masked_loss, rank_slice, lr_at, world: int) -> list[torch.Tensor]:
        torch.manual_seed(0)
        config = GPTConfig(vocab_size=grammar.VOCAB_SIZE, block_size=32, n_layer=1, n_head=2, n_embd=16)
        model = MiniGPT(config)
        for block in model.blocks:
            block.attn.mask = causal_mask(config.block_size)
        for step in range(3):
            x, y, mask = grammar.get_batch("train", step, 8)
            total = [torch.zeros_like(p) for p in model.parameters()]
            for rank in range(world):
                rows = rank_slice(8, rank, world)
                model.zero_grad(set_to_none=True)
                masked_loss(model(x[rows])[0], y[rows], mask[rows]).backward()
                total = [t + p.grad / world for t, p in zip(total, model.parameters())]
            with torch.no_grad():
                for p, g in zip(model.parameters(), total):
                    p -= lr_at(step, 0.5, 0.05, 1, 3) * g
        return [p.detach() for p in model.parameters()]

    names = ("causal_mask", "masked_loss", "rank_slice", "lr_at")
    yours = train(*(getattr(lab00, n) for n in names), world=2)
    reference = train(*(impl.reference("lab00_baseline", n) for n in names), world=1)
    worst = max(float((a - b).abs().max()) for a, b in zip(yours, reference))
    assert worst <= 1e-5, say(
        f"after 3 steps on two simulated ranks your weights are {worst:.2e} from the reference's in one "
        "process (expected <= 1e-5)",
        f"tras 3 pasos en dos ranks simulados tus pesos están a {worst:.2e} de los de la referencia en un "
        "proceso (se espera <= 1e-5)",
    )
