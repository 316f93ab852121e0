"""Lab 03 · FSDP prefetch: the learner's prediction of FSDP's order of events (held against the
logs of real runs), the global gradient norm from shards, and the choice of wrap units.

``make grade LAB=03`` runs them on ``lab/exercises/lab03_fsdp.py``. No process is
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
from tests.words import refuses, say

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
                yours, run = predicted[first : first + 3], recorded[first : first + 3]
                raise AssertionError(
                    say(
                        f"{variant}, {n_blocks} blocks, rank {rank}: your predicted order and the real run's differ "
                        f"at event {first}: yours {yours or 'ends there'}, the run {run or 'ends there'} (yours has "
                        f"{len(predicted)} events, the run {len(recorded)})",
                        f"{variant}, {n_blocks} bloques, rank {rank}: tu orden predicho y el de la ejecución real "
                        f"difieren en el evento {first}: el tuyo {yours or 'acaba ahí'}, el real {run or 'acaba ahí'} "
                        f"(el tuyo tiene {len(predicted)} eventos, el real {len(recorded)})",
                    )
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
    refuses(
        "predict_event_order(4, 'fsdp3-magic')",
        lambda: lab03.predict_event_order(4, "fsdp3-magic"),
        "there is no variant 'fsdp3-magic'",
        "no existe la variante 'fsdp3-magic'",
    )
    refuses(
        "predict_event_order(0, 'fsdp2-implicit')",
        lambda: lab03.predict_event_order(0, "fsdp2-implicit"),
        "a model of 0 blocks: it needs at least one",
        "un modelo de 0 bloques: necesita al menos uno",
    )


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
        ours = lab03.global_grad_norm_from_shards(terms, norm_type)
        assert ours == pytest.approx(whole, rel=1e-12), say(
            f"norm_type={norm_type:g}, three gradients cut into shards for {n} rank(s): your global norm is "
            f"{ours!r}, the whole gradient's is {whole!r} (expected within 1e-12, relative): "
            f"{say(*NORM_RULE[norm_type])}",
            f"norm_type={norm_type:g}, tres gradientes en fragmentos para {n} rank(s): tu norma global es {ours!r}, "
            f"la del gradiente entero {whole!r} (se espera a menos de 1e-12, relativo): {say(*NORM_RULE[norm_type])}",
        )
    empty = lab03.local_norm_term([], norm_type)
    assert empty == 0, say(
        f"local_norm_term([], {norm_type:g}) is {empty!r}, expected 0: a rank with no shard adds nothing",
        f"local_norm_term([], {norm_type:g}) da {empty!r}, se espera 0: un rank sin fragmento no suma nada",
    )


NORM_RULE = {  # how the ranks' terms make the global norm, in both languages
    2.0: (
        "each rank's term is its sum of squares; the global norm is the square root of their sum",
        "el término de cada rank es su suma de cuadrados; la norma global es la raíz cuadrada de su suma",
    ),
    1.0: (
        "each rank's term is its sum of absolute values; the global norm is their sum",
        "el término de cada rank es su suma de valores absolutos; la norma global es su suma",
    ),
    math.inf: (
        "each rank's term is its largest absolute value; the global norm is the largest of them",
        "el término de cada rank es su mayor valor absoluto; la norma global es el mayor de ellos",
    ),
}


@pytest.mark.exercise("3.2")
@pytest.mark.points(1)
def test_the_real_runs_norms(lab03):
    clip = PRACTICE["clipping"]
    terms = [x**2 for x in clip["local_norms"]]  # what each rank measured of its own shard
    ours = lab03.global_grad_norm_from_shards(terms)
    local = ", ".join(f"{x:.6g}" for x in clip["local_norms"])
    assert ours == pytest.approx(clip["single_process_norm"], rel=1e-6), say(  # one process, whole gradient
        f"the real run's {len(terms)} ranks measured the L2 norms {local} of their shards: from their squares your "
        f"global norm is {ours:.9g}, one process measured {clip['single_process_norm']:.9g} on the whole gradient "
        "(expected within 1e-6, relative): the square root of the sum of the squares",
        f"los {len(terms)} ranks de la ejecución real midieron las normas L2 {local} de sus fragmentos: con sus "
        f"cuadrados tu norma global da {ours:.9g}, un proceso midió {clip['single_process_norm']:.9g} con el "
        "gradiente entero (se espera a menos de 1e-6, relativo): la raíz cuadrada de la suma de los cuadrados",
    )
    assert all(local < ours for local in clip["local_norms"]), say(
        f"your global norm {ours:.9g} is not above every rank's local norm ({local}): each shard is part of the "
        "gradient, so the whole gradient's norm is larger than any shard's",
        f"tu norma global {ours:.9g} no supera la norma local de cada rank ({local}): cada fragmento es parte del "
        "gradiente, así que la norma del gradiente entero es mayor que la de cualquier fragmento",
    )
    # the real run's gradients are FSDP2's DTensors: each counts by this rank's shard, t.to_local()
    term, calls = dtensor_term(lab03)
    assert calls and term == 34.0, say(
        f"local_norm_term([a tensor [1, 1, 1, 1], a DTensor whose local shard is [[3, -4], [1, 2]]]) is {term!r} and "
        f"called to_local() {len(calls)} time(s); expected 4 + 30 = 34.0 from to_local(): a DTensor (FSDP2's "
        "gradient) counts by this rank's shard, t.to_local(), not as the whole tensor it stands for",
        f"local_norm_term([un tensor [1, 1, 1, 1], un DTensor cuyo fragmento local es [[3, -4], [1, 2]]]) da "
        f"{term!r} y llamó a to_local() {len(calls)} vez/veces; se espera 4 + 30 = 34.0 a partir de to_local(): un "
        "DTensor (el gradiente de FSDP2) cuenta por el fragmento de este rank, t.to_local(), no como el tensor "
        "entero que representa",
    )


def dtensor_term(lab03) -> tuple[object, list[int]]:
    """The learner's local_norm_term (p = 2) of a plain tensor and a DTensor sharded over a pretend
    world of 2 ranks (this process is rank 0, tests/fake_world.py), and the calls of its to_local()."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    from tests.fake_world import fake_world

    calls: list[int] = []
    with fake_world(0, 2):
        mesh = init_device_mesh("cpu", (2,))
        grad = DTensor.from_local(torch.tensor([[3.0, -4.0], [1.0, 2.0]]), mesh, [Shard(0)], run_check=False)
        to_local = grad.to_local
        grad.to_local = lambda *args, **kwargs: calls.append(1) or to_local(*args, **kwargs)
        try:
            term = lab03.local_norm_term([torch.ones(4), grad], 2.0)
        except Exception as exc:  # noqa: BLE001 - a DTensor mixed with tensors fails inside torch
            term = f"{type(exc).__name__}: {str(exc)[:80]}"
    return term, calls


@pytest.mark.exercise("3.2")
@pytest.mark.points(1)
def test_global_norm_rejects_bad_input(lab03):
    refuses(
        "global_grad_norm_from_shards([])",
        lambda: lab03.global_grad_norm_from_shards([]),
        "no rank's term: there is no norm to make",
        "sin el término de ningún rank no hay norma que calcular",
    )
    refuses(
        "global_grad_norm_from_shards([1.0, 2.0], norm_type=0)",
        lambda: lab03.global_grad_norm_from_shards([1.0, 2.0], norm_type=0),
        "norm_type must be positive: 0 gives no norm",
        "norm_type debe ser positivo: 0 no da ninguna norma",
    )


# --- Exercise 3.3: the wrap units --------------------------------------------------------------


@pytest.fixture(scope="module")
def model():
    return MiniGPT(GPTConfig())


@pytest.mark.exercise("3.3")
@pytest.mark.points(2)
def test_units_of_each_policy(lab03, model):
    whole = lab03.units_of_policy(model, "whole")
    assert whole == [], say(
        f"units_of_policy(model, 'whole') returned {len(whole)} unit(s) {module_names(model, whole)}, expected []: "
        "the whole model is one unit, the root, which is not listed",
        f"units_of_policy(model, 'whole') devolvió {len(whole)} unidad(es) {module_names(model, whole)}, se espera "
        "[]: el modelo entero es una sola unidad, la raíz, que no se lista",
    )
    blocks = lab03.units_of_policy(model, "block")
    assert len(blocks) == len(model.blocks) and all(a is b for a, b in zip(blocks, model.blocks)), say(
        f"units_of_policy(model, 'block') returned {module_names(model, blocks)}, expected the "
        f"{len(model.blocks)} blocks themselves, in order: {module_names(model, model.blocks)}",
        f"units_of_policy(model, 'block') devolvió {module_names(model, blocks)}, se esperan los "
        f"{len(model.blocks)} bloques propios del modelo, en orden: {module_names(model, model.blocks)}",
    )
    linears = lab03.units_of_policy(model, "linear")
    in_blocks = [m for b in model.blocks for m in b.modules() if isinstance(m, nn.Linear)]
    assert len(linears) == len(in_blocks) and {id(m) for m in linears} == {id(m) for m in in_blocks}, say(
        f"units_of_policy(model, 'linear') returned {len(linears)} units, expected the {len(in_blocks)} nn.Linear "
        f"inside the blocks; {unit_difference(model, linears, in_blocks)}",
        f"units_of_policy(model, 'linear') devolvió {len(linears)} unidades, se esperan las {len(in_blocks)} "
        f"nn.Linear de dentro de los bloques; {unit_difference(model, linears, in_blocks)}",
    )


def unit_difference(model: nn.Module, got: list, expected: list) -> str:
    """The units that should not be there and those missing, by name."""
    extra = [m for m in got if id(m) not in {id(x) for x in expected}]
    missing = [m for m in expected if id(m) not in {id(x) for x in got}]
    text = say(
        f"not expected: {module_names(model, extra)}, missing: {module_names(model, missing)}",
        f"sobran: {module_names(model, extra)}, faltan: {module_names(model, missing)}",
    )
    twice = [m for i, m in enumerate(got) if any(m is x for x in got[:i])]
    if twice:
        text += say(f", listed twice: {module_names(model, twice)}", f", repetidas: {module_names(model, twice)}")
    if any(m is model.lm_head for m in extra):
        text += say(
            " (lm_head, the output layer, is tied to the embedding: it stays in the root)",
            " (lm_head, la capa de salida, está atada al embedding: se queda en la raíz)",
        )
    return text


def module_names(model: nn.Module, modules) -> str:
    """The names of ``modules`` in ``model``, on one line, cut after a few."""
    names = {id(m): name or "model" for name, m in model.named_modules()}  # the root's name is ""
    listed = [names.get(id(m), type(m).__name__) for m in modules]
    return "[" + ", ".join(listed[:6]) + (f", ... ({len(listed)} in all)" if len(listed) > 6 else "") + "]"


@pytest.mark.exercise("3.3")
@pytest.mark.points(2)
def test_no_parameter_in_two_units(lab03, model):
    for policy in ("block", "linear"):
        seen: dict[int, int] = {}
        for unit in lab03.units_of_policy(model, policy):
            for p in unit.parameters():
                seen[id(p)] = seen.get(id(p), 0) + 1
        names = {id(p): name for name, p in model.named_parameters()}
        twice = [f"{names.get(i, '?')} ({n}x)" for i, n in seen.items() if n != 1]
        assert all(n == 1 for n in seen.values()), say(
            f"policy '{policy}': {len(twice)} parameter(s) in more than one unit, e.g. {', '.join(twice[:3])}: "
            "each parameter must belong to one unit only (a unit nested in another counts its parameters again)",
            f"política '{policy}': {len(twice)} parámetro(s) en más de una unidad, p. ej. {', '.join(twice[:3])}: "
            "cada parámetro debe pertenecer a una sola unidad (una unidad dentro de otra vuelve a contar sus "
            "parámetros)",
        )
        assert id(model.wte.weight) not in seen, say(
            f"policy '{policy}': the tied embedding wte.weight (shared with the output layer lm_head) is in a unit; "
            "expected in no unit: it must stay in the root, as the embedding and the output layer use it at both "
            "ends of the model",
            f"política '{policy}': el embedding atado wte.weight (compartido con la capa de salida lm_head) está "
            "en una unidad; no debe estar en ninguna: se queda en la raíz, pues lo usan el embedding y la capa "
            "de salida, en los dos extremos del modelo",
        )


@pytest.mark.exercise("3.3")
@pytest.mark.points(1)
def test_units_reject_an_unknown_policy(lab03, model):
    refuses(
        "units_of_policy(model, 'every-other-block')",
        lambda: lab03.units_of_policy(model, "every-other-block"),
        "the policies are 'whole', 'block' and 'linear'",
        "las políticas son 'whole', 'block' y 'linear'",
    )


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
