"""Lab 00 · MiniGPT and the baseline: the graded checks of lab/exercises/lab00_baseline.py.

Run against your own code with ``make grade LAB=00`` (one exercise: ``make grade EX=0.2``).
Expected values are computed here independently (loops, closed forms), never taken from the
reference implementation.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn import functional as F

from minigpt.model import GPTConfig, MiniGPT
from tests.words import refuses, say

pytestmark = [pytest.mark.lab("00"), pytest.mark.timeout(30)]  # a looping exercise fails, never hangs


# Exercise 0.1 · the causal mask ---------------------------------------------------------------


@pytest.mark.exercise("0.1")
@pytest.mark.points(2)
def test_causal_mask_values(lab00):
    mask = lab00.causal_mask(5)
    assert isinstance(mask, torch.Tensor) and mask.dtype == torch.bool, say(
        f"causal_mask(5) must return a torch.bool tensor (True: may attend), got {kind_of(mask)}",
        f"causal_mask(5) debe devolver un tensor torch.bool (True: puede atender), devolvió {kind_of(mask)}",
    )
    assert mask.shape == (5, 5), say(
        f"causal_mask(5) must have shape (5, 5), one row per query and one column per key; got {tuple(mask.shape)}",
        f"causal_mask(5) debe tener forma (5, 5), una fila por consulta y una columna por clave; tiene "
        f"{tuple(mask.shape)}",
    )
    for i in range(5):
        for j in range(5):
            assert bool(mask[i, j]) == (j <= i), say(
                f"causal_mask(5)[{i}, {j}] is {bool(mask[i, j])}, expected {j <= i}: {sight(i, j)}",
                f"causal_mask(5)[{i}, {j}] vale {bool(mask[i, j])}, se espera {j <= i}: {sight(i, j)}",
            )


def sight(query: int, key: int) -> str:
    """What the causal mask lets ``query`` see of ``key``, in words."""
    if key < query:
        return say(f"query {query} sees key {key}, in its past", f"la consulta {query} ve la clave {key}, de su pasado")
    if key == query:
        return say(f"query {query} sees itself", f"la consulta {query} se ve a sí misma")
    return say(
        f"query {query} must not see key {key}, in its future",
        f"la consulta {query} no debe ver la clave {key}, de su futuro",
    )


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
    assert torch.equal(a[:, :7], b[:, :7]), say(
        f"MiniGPT with your mask: changing token 7 changed the logits at positions {changed_positions(a, b, 0, 7)} "
        "(expected none of 0..6): the mask lets a query see keys in its future",
        f"MiniGPT con tu máscara: cambiar el token 7 cambió los logits en las posiciones "
        f"{changed_positions(a, b, 0, 7)} (no debe cambiar ninguna de 0..6): la máscara deja que una consulta vea "
        "claves de su futuro",
    )
    assert not torch.equal(a[:, 7:], b[:, 7:]), say(
        "MiniGPT with your mask: changing token 7 changed no logit at positions 7..11 (expected: they change, "
        "they see token 7): the mask hides a query's own position or its past",
        "MiniGPT con tu máscara: cambiar el token 7 no cambió ningún logit en las posiciones 7..11 (deben cambiar: "
        "ven el token 7): la máscara oculta a una consulta su propia posición o su pasado",
    )


def kind_of(value) -> str:
    """What a function returned, for a message: a tensor's dtype, else the type's name."""
    if isinstance(value, torch.Tensor):
        return say(f"a {value.dtype} tensor", f"un tensor {value.dtype}")
    return type(value).__name__


def changed_positions(a: torch.Tensor, b: torch.Tensor, start: int, stop: int) -> list[int]:
    """The positions in start..stop-1 whose logits differ between a and b (batch, position, vocab)."""
    changed = (a[:, start:stop] != b[:, start:stop]).any(dim=-1).any(dim=0)
    return [start + int(i) for i in changed.nonzero().flatten()]


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
    assert got.shape == (), say(
        f"masked_loss must return a scalar (shape ()), got shape {tuple(got.shape)}",
        f"masked_loss debe devolver un escalar (forma ()), devolvió forma {tuple(got.shape)}",
    )
    expected = _loop_loss(logits, targets, mask)
    assert abs(float(got) - float(expected)) < 1e-5, say(
        f"masked_loss on 6 sentences of 9 tokens: got {float(got):.6f}, expected {float(expected):.6f}: the mean over "
        "sentences of each sentence's mean loss over its counted tokens (a sentence with none counts 0)",
        f"masked_loss sobre 6 oraciones de 9 tokens: da {float(got):.6f}, se espera {float(expected):.6f}: la media "
        "sobre las oraciones de la pérdida media de cada oración en sus tokens contados (una oración sin ninguno "
        "cuenta 0)",
    )


@pytest.mark.exercise("0.2")
@pytest.mark.points(1)
def test_masked_loss_ignores_unmasked_positions_and_has_gradients(lab00):
    logits, targets, mask = _loss_inputs(seed=1)
    logits.requires_grad_(True)
    loss = lab00.masked_loss(logits, targets, mask)
    loss.backward()
    assert logits.grad is not None, say(
        "after masked_loss(...).backward() the logits have no gradient (logits.grad is None): compute the loss from "
        "the logits with torch operations, without .item(), .detach() or numpy",
        "tras masked_loss(...).backward() los logits no tienen gradiente (logits.grad es None): calcula la pérdida a "
        "partir de los logits con operaciones de torch, sin .item(), .detach() ni numpy",
    )
    leaked = logits.grad[~mask].abs()
    assert torch.all(logits.grad[~mask] == 0), say(
        f"{int((leaked != 0).sum())} logits at positions where the mask is False got a gradient (up to "
        f"{float(leaked.max()):.2e}, expected 0): those positions must not count in the loss",
        f"{int((leaked != 0).sum())} logits en posiciones donde la máscara es False recibieron gradiente (hasta "
        f"{float(leaked.max()):.2e}, se espera 0): esas posiciones no deben contar en la pérdida",
    )
    noisy = logits.detach().clone()
    noisy[~mask] += 100.0
    moved = lab00.masked_loss(noisy, targets, mask)
    assert torch.allclose(moved, loss.detach()), say(
        f"adding 100 to the logits where the mask is False changed the loss from {float(loss):.6f} to "
        f"{float(moved):.6f} (expected: unchanged): those positions must not count",
        f"sumar 100 a los logits donde la máscara es False cambió la pérdida de {float(loss):.6f} a "
        f"{float(moved):.6f} (se espera: igual): esas posiciones no deben contar",
    )


@pytest.mark.exercise("0.2")
@pytest.mark.points(1)
def test_masked_loss_is_the_mean_of_equal_slices(lab00):
    """What data parallelism relies on: the batch loss is the mean of its slices' losses."""
    logits, targets, mask = _loss_inputs(seed=2, B=8)
    whole = lab00.masked_loss(logits, targets, mask)
    halves = [lab00.masked_loss(logits[s], targets[s], mask[s]) for s in (slice(0, 4), slice(4, 8))]
    mean = float(sum(halves) / 2)
    assert abs(float(whole) - mean) < 1e-6, say(
        f"the loss of 8 sentences is {float(whole):.6f}, the mean of its two halves' losses {mean:.6f} (expected "
        "equal, within 1e-6): average per sentence, not over all the batch's tokens, so that two ranks' losses "
        "average to the whole batch's",
        f"la pérdida de 8 oraciones es {float(whole):.6f} y la media de las pérdidas de sus dos mitades {mean:.6f} (se "
        "esperan iguales, a menos de 1e-6): promedia por oración, no sobre todos los tokens del lote, para que la "
        "media de las pérdidas de dos ranks sea la del lote entero",
    )


# Exercise 0.3 · the per-rank batch slice ----------------------------------------------------


@pytest.mark.exercise("0.3")
@pytest.mark.points(2)
def test_rank_slices_are_disjoint_and_cover_the_batch(lab00):
    for batch, world in [(64, 1), (64, 2), (64, 4), (12, 3), (8, 8)]:
        rows = []
        for rank in range(world):
            s = lab00.rank_slice(batch, rank, world)
            call = f"rank_slice({batch}, {rank}, {world})"
            assert isinstance(s, slice), say(
                f"{call} must return a slice, got {type(s).__name__}",
                f"{call} debe devolver un slice, devolvió {type(s).__name__}",
            )
            start, stop = rank * batch // world, (rank + 1) * batch // world
            assert s.start == start and s.stop == stop, say(
                f"{call}: expected rows {start}..{stop - 1}, slice({start}, {stop}), got {s}: each of the {world} "
                f"ranks takes {batch // world} consecutive rows of the {batch}, in rank order",
                f"{call}: se esperan las filas {start}..{stop - 1}, slice({start}, {stop}), devolvió {s}: cada uno de "
                f"los {world} ranks toma {batch // world} filas consecutivas de las {batch}, por orden de rank",
            )
            rows += list(range(batch))[s]
        assert rows == list(range(batch)), say(
            f"batch {batch} over {world} ranks: together the slices give {len(rows)} rows ({len(set(rows))} "
            f"distinct), expected each of the rows 0..{batch - 1} once, in order",
            f"lote de {batch} entre {world} ranks: juntos, los slices dan {len(rows)} filas ({len(set(rows))} "
            f"distintas); se espera cada fila 0..{batch - 1} una vez, en orden",
        )


@pytest.mark.exercise("0.3")
@pytest.mark.points(1)
def test_rank_slice_rejects_what_cannot_work(lab00):
    refuses(
        "rank_slice(10, 0, 3)",
        lambda: lab00.rank_slice(10, 0, 3),
        "10 rows cannot be split evenly over 3 ranks: dropping a row would change the loss",
        "10 filas no se reparten por igual entre 3 ranks: quitar una fila cambiaría la pérdida",
        match="10",
    )
    refuses(
        "rank_slice(10, 0, 3)",
        lambda: lab00.rank_slice(10, 0, 3),
        "the world size, beside the batch size 10: a message that names both numbers says what to fix",
        "el tamaño del mundo, junto al tamaño del lote 10: un mensaje que nombra los dos números dice qué arreglar",
        match="3",
    )
    refuses(
        "rank_slice(8, 2, 2)",
        lambda: lab00.rank_slice(8, 2, 2),
        "a world of 2 ranks has ranks 0 and 1, no rank 2",
        "un mundo de 2 ranks tiene los ranks 0 y 1, no el 2",
    )
    refuses(
        "rank_slice(8, 0, 0)",
        lambda: lab00.rank_slice(8, 0, 0),
        "a world size of 0 has no rank to give rows to",
        "un tamaño del mundo de 0 no tiene ningún rank al que dar filas",
    )


# Exercise 0.4 · the learning-rate schedule --------------------------------------------------


@pytest.mark.exercise("0.4")
@pytest.mark.points(2)
def test_lr_schedule(lab00):
    max_lr, min_lr, warmup, total = 1e-3, 1e-4, 10, 110
    lr = [lab00.lr_at(s, max_lr, min_lr, warmup, total) for s in range(total + 5)]
    odd = next((s for s, x in enumerate(lr) if not isinstance(x, float)), None)
    assert odd is None, say(
        f"lr_at({odd}, max_lr=0.001, min_lr=0.0001, warmup=10, total=110) returned {kind_of(lr[odd])}: return a "
        "Python float (the optimizer's param_groups hold plain numbers)",
        f"lr_at({odd}, max_lr=0.001, min_lr=0.0001, warmup=10, total=110) devolvió {kind_of(lr[odd])}: devuelve un "
        "float de Python (los param_groups del optimizador guardan números simples)",
    )
    assert math.isclose(lr[0], max_lr / warmup), lr_message(
        lr,
        [0],
        max_lr / warmup,
        "warm-up step 0 already trains: (0 + 1) / warmup x max_lr",
        "el paso 0 del calentamiento ya entrena: (0 + 1) / warmup x max_lr",
    )
    assert math.isclose(lr[4], 5 * max_lr / warmup), lr_message(
        lr,
        [4],
        5 * max_lr / warmup,
        "warm-up rises linearly: step s gives (s + 1) / warmup x max_lr",
        "el calentamiento sube en línea recta: el paso s da (s + 1) / warmup x max_lr",
    )
    assert math.isclose(lr[9], max_lr) and math.isclose(lr[10], max_lr), lr_message(
        lr,
        [9, 10],
        max_lr,
        "the last warm-up step reaches max_lr, and the decay starts from it",
        "el último paso del calentamiento llega a max_lr, y el descenso empieza desde ahí",
    )
    assert math.isclose(lr[60], (max_lr + min_lr) / 2), lr_message(
        lr,
        [60],
        (max_lr + min_lr) / 2,
        "half-way through the cosine decay (steps 10..110): the mean of max_lr and min_lr",
        "a mitad del descenso en coseno (pasos 10..110): la media de max_lr y min_lr",
    )
    assert math.isclose(lr[110], min_lr) and math.isclose(lr[114], min_lr), lr_message(
        lr, [110, 114], min_lr, "from step total = 110 on: min_lr", "desde el paso total = 110: min_lr"
    )
    rise = next((s for s in range(10, total + 4) if not lr[s] >= lr[s + 1]), None)
    assert all(a >= b for a, b in zip(lr[10:], lr[11:])), say(
        f"the learning rate rises from step {rise} ({lr[rise]:.6g}) to step {rise + 1} ({lr[rise + 1]:.6g}): "
        "after the warm-up it must never go up",
        f"la tasa de aprendizaje sube del paso {rise} ({lr[rise]:.6g}) al paso {rise + 1} ({lr[rise + 1]:.6g}): "
        "tras el calentamiento nunca debe subir",
    )


def lr_message(lr: list[float], steps: list[int], expected: float, why: str, why_es: str) -> str:
    """The first of ``steps`` whose learning rate is off: what came, what was expected, why."""
    step = next((s for s in steps if not math.isclose(lr[s], expected)), steps[0])
    call = f"lr_at({step}, max_lr=0.001, min_lr=0.0001, warmup=10, total=110)"
    return say(
        f"{call} is {lr[step]:.6g}, expected {expected:.6g}: {why}",
        f"{call} da {lr[step]:.6g}, se espera {expected:.6g}: {why_es}",
    )


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
