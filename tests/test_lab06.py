"""Lab 06 · Pipelines and meshes: the graded checks.

The 1F1B lists (Exercise 6.1) need no process group: they are checked in this process, against the
deadlock check of Lab 02's simulator and its own 1F1B. The steps (Exercise 6.2) run once per session
in one 3-rank launch (the ``pipeline_scratch`` fixture of tests/ranks.py, tests/pipeline_worker.py:
three stages, so one sits in the middle); each test reads the scenario run for its exercise
(``1f1b@6.2``: only Exercise 6.2 the learner's, the reference's 1F1B around it). The course's own
checks of the mechanism are in tests/test_lab06_reference.py. The mesh's two exercises, HSDP's degrees
(6.3) and its bytes per mesh dimension (6.4), are plain functions checked in this process; 6.4 is
also held against the bytes FSDP2 really sent on the 2 x 2 mesh of lab/results/06-mesh-cpu.json.

    make grade EX=6.1          # or: .venv/bin/python -m minigpt.grader --exercise 6.1
"""

from __future__ import annotations

import json
from fractions import Fraction

import pytest

from minigpt.model import GPTConfig, MiniGPT
from minigpt.parallel.pipeline.schedule import check_schedule, format_order, peak_held
from minigpt.zero.pipeline import stage_order
from tests.launcher import ROOT
from tests.ranks import Launch, scenario
from tests.words import say

pytestmark = [pytest.mark.lab("06"), pytest.mark.timeout(180)]

TOLERANCE = 1e-12  # float64 throughout
STAGES = 3  # the launch's ranks, one stage each
SHAPES = [(p, m) for p in range(1, 7) for m in range(1, 10)]  # m < p included: fewer micro-batches than stages


def every_stage(launch: Launch, name: str) -> list[dict]:
    """Each stage's result of scenario ``name``; when stages failed, the error of the one that
    failed first in the chain (a stage's own error rather than its neighbour's timeout waiting
    for it), with the likely cause when it is a known one."""
    results, failures = [], []
    for r in range(STAGES):
        try:
            results.append(scenario(launch, name, r))
        except AssertionError as exc:
            failures.append(str(exc))
    if failures:
        # a stage's own error first, then a timeout waiting for a neighbour (the pipeline's, which says
        # who waited for what, before gloo's), then a connection that a neighbour's timeout closed
        def rank(failure: str) -> int:
            if "Connection closed" in failure:
                return 3
            if "PipelineTimeout" in failure:
                return 1
            return 2 if "Timed out" in failure or "timeout" in failure.lower() else 0

        first = min(failures, key=rank)
        hint = ""
        if "'NoneType' object has no attribute 'contiguous'" in first:
            hint = say(
                "the input's gradient is None: did forward_step call requires_grad_() on the received activations? ",
                "el gradiente de la entrada es None: ¿llamó forward_step a requires_grad_() sobre las activaciones "
                "recibidas? ",
            )
        elif "PipelineTimeout" in first and "for the gradient" in first:
            hint = say(
                "a stage waited for a gradient that never came: does backward_step send the input's gradient back? ",
                "una etapa esperó un gradiente que nunca llegó: ¿devuelve backward_step el gradiente de la entrada? ",
            )
        raise AssertionError(hint + first)
    return results


def orders_of(lab06, stages: int, micro_batches: int) -> list[list[tuple[str, int]]]:
    return [[tuple(op) for op in lab06.one_f_one_b(s, stages, micro_batches)] for s in range(stages)]


# ----------------------------------------------------------------------------------------------
# Exercise 6.1: the 1F1B lists


@pytest.mark.exercise("6.1")
@pytest.mark.points(3)
def test_one_f_one_b_runs_every_micro_batch_once_and_never_deadlocks(lab06):
    for p, m in SHAPES:
        orders = orders_of(lab06, p, m)
        try:
            check_schedule(orders, m)
        except ValueError as exc:
            shown = "; ".join(f"stage {s}: {format_order(o)}" for s, o in enumerate(orders))
            raise AssertionError(
                say(
                    f"{p} stages, {m} micro-batches: check_schedule refuses your lists ({exc}); they are {shown}",
                    f"{p} etapas, {m} microlotes: check_schedule rechaza tus listas ({exc}); son {shown}",
                )
            ) from None


@pytest.mark.exercise("6.1")
@pytest.mark.points(2)
def test_one_f_one_b_holds_at_most_p_minus_s_and_is_the_simulators_1f1b(lab06):
    for p, m in SHAPES:
        for s, order in enumerate(orders_of(lab06, p, m)):
            where = say(f"{p} stages, {m} micro-batches, stage {s}", f"{p} etapas, {m} microlotes, etapa {s}")
            held = peak_held(order)
            assert held <= p - s, say(
                f"{where}: {format_order(order)} holds up to {held} micro-batches at once, over p - s = {p - s} "
                f"(the warm-up is {min(p - 1 - s, m)} forwards)",
                f"{where}: {format_order(order)} guarda hasta {held} microlotes a la vez, más que p - s = {p - s} "
                f"(el calentamiento son {min(p - 1 - s, m)} pasadas hacia delante)",
            )
            expected = stage_order("1f1b", s, p, m)
            assert order == expected, say(
                f"{where}: your list is {format_order(order)}, expected 1F1B's {format_order(expected)} (Lab 02's "
                "simulator: the warm-up, then one F and the oldest B in turn, then the B left)",
                f"{where}: tu lista es {format_order(order)}, se espera la de 1F1B, {format_order(expected)} (el "
                "simulador del laboratorio 02: el calentamiento, luego una F y la B más antigua por turnos, y las B "
                "que quedan)",
            )


# ----------------------------------------------------------------------------------------------
# Exercise 6.2: the steps, on 3 ranks (the reference's GPipe and 1F1B around them)

STEP_SCENARIOS = {"gpipe@6.2": "GPipe, m=4", "1f1b@6.2": "1F1B, m=4", "1f1b-m2@6.2": "1F1B, m=2 < 3 stages"}


def check_gradients(launch: Launch, name: str, what: str) -> None:
    for r, got in enumerate(every_stage(launch, name)):
        where = say(f"{what}, stage {r}", f"{what}, etapa {r}")
        assert not got["missing"], say(
            f"{where}: no gradient reached {got['missing']} (did backward run on every micro-batch?)",
            f"{where}: no llegó gradiente a {got['missing']} (¿corrió la pasada hacia atrás de cada microlote?)",
        )
        assert got["grad_diff"] <= TOLERANCE, say(
            f"{where}: the gradient of {got['worst']} is {got['grad_diff']:.2e} from one process's on the whole "
            f"batch (float64, expected <= {TOLERANCE:g}); is each micro-batch's loss scaled by 1/m, and the "
            "gradient that comes back the one of this stage's output?",
            f"{where}: el gradiente de {got['worst']} está a {got['grad_diff']:.2e} del de un proceso con el lote "
            f"entero (float64, se espera <= {TOLERANCE:g}); ¿se escala la pérdida de cada microlote por 1/m, y el "
            "gradiente que vuelve es el de la salida de esta etapa?",
        )
        assert got["loss_diff"] <= TOLERANCE, say(
            f"{where}: the step's loss is {got['loss_diff']:.2e} from one process's: return each micro-batch's "
            "loss unscaled",
            f"{where}: la pérdida del paso está a {got['loss_diff']:.2e} de la de un proceso: devuelve la pérdida "
            "de cada microlote sin escalar",
        )


def still_held(where: str, kept: list[int]) -> str:
    return say(
        f"{where}: B ran for micro-batches {kept}, but each was still in held afterwards: the stage kept its "
        "activations and graph until the end of the step (backward_step must take micro-batch i out of held, "
        "held.pop(i), not only read it)",
        f"{where}: B se ejecutó para los microlotes {kept}, pero cada uno seguía en held después: la etapa "
        "conservó sus activaciones y su grafo hasta el final del paso (backward_step debe sacar el microlote i de "
        "held, held.pop(i), no solo leerlo)",
    )


@pytest.mark.exercise("6.2")
@pytest.mark.points(3)
def test_your_steps_give_one_processs_gradients_with_gpipe_and_1f1b(pipeline_scratch):
    for name, what in STEP_SCENARIOS.items():
        check_gradients(pipeline_scratch, name, what)


@pytest.mark.exercise("6.2")
@pytest.mark.points(2)
def test_your_steps_send_the_modelled_bytes_and_hold_what_the_schedule_says(pipeline_scratch):
    for name, what in STEP_SCENARIOS.items():
        for r, got in enumerate(every_stage(pipeline_scratch, name)):
            where = say(f"{what}, stage {r}", f"{what}, etapa {r}")
            assert not got["kept"], still_held(where, got["kept"])
            assert got["bytes"] == got["bytes_model"], say(
                f"{where}: sent {got['bytes']} bytes in the step, expected step_bytes_model's {got['bytes_model']} "
                "(each micro-batch's activations once down, their gradient once up, and the tied matrix's gradient)",
                f"{where}: envió {got['bytes']} bytes en el paso, se esperan los {got['bytes_model']} de "
                "step_bytes_model (las activaciones de cada microlote una vez hacia abajo, su gradiente una vez "
                "hacia arriba y el gradiente de la matriz atada)",
            )
            assert got["peak"] == got["peak_expected"], say(
                f"{where}: held up to {got['peak']} micro-batches at once, expected {got['peak_expected']}: keep "
                "held[i] from F i until B i, and pop it in B i",
                f"{where}: guardó hasta {got['peak']} microlotes a la vez, se esperan {got['peak_expected']}: "
                "guarda held[i] desde F i hasta B i y sácalo en B i",
            )


# ----------------------------------------------------------------------------------------------
# All together: your 1F1B and your steps


@pytest.mark.exercise("all")
@pytest.mark.points(2)
def test_all_together_your_1f1b_pipeline_equals_one_process(pipeline_scratch):
    for name, what in {"all@all": "your 1F1B, m=4", "all-m2@all": "your 1F1B, m=2 < 3 stages"}.items():
        check_gradients(pipeline_scratch, name, what)
        for r, got in enumerate(every_stage(pipeline_scratch, name)):
            assert not got["kept"], still_held(say(f"{what}, stage {r}", f"{what}, etapa {r}"), got["kept"])
            assert (got["bytes"], got["peak"]) == (got["bytes_model"], got["peak_expected"]), say(
                f"{what}, stage {r}: {got['bytes']} bytes sent and {got['peak']} micro-batches held at most, "
                f"expected {got['bytes_model']} and {got['peak_expected']}",
                f"{what}, etapa {r}: {got['bytes']} bytes enviados y {got['peak']} microlotes guardados como mucho, "
                f"se esperan {got['bytes_model']} y {got['peak_expected']}",
            )


# ----------------------------------------------------------------------------------------------
# Exercise 6.3: the degrees of an HSDP mesh


@pytest.mark.exercise("6.3")
@pytest.mark.points(2)
def test_resolve_hsdp_shards_inside_a_node_and_infers_the_missing_degree(lab06_mesh):
    cases = [
        # (world, ranks per node, shard, replicate) -> (replicate, shard)
        ((4, 2, None, None), (2, 2)),  # two nodes of two
        ((8, 4, None, None), (2, 4)),  # two nodes of four: shard over a node, not across
        ((16, 8, None, None), (2, 8)),
        ((4, 4, None, None), (1, 4)),  # one node: plain FSDP, one replica
        ((8, 4, 2, None), (4, 2)),  # a shard degree given: the replicas are the rest
        ((8, 4, None, 8), (8, 1)),  # eight replicas of one: plain DDP
        ((8, 4, 8, 1), (1, 8)),  # both given, consistent
    ]
    for args, expected in cases:
        got = lab06_mesh.resolve_hsdp(*args)
        assert tuple(got) == expected, f"resolve_hsdp{args} returned {got}, expected (replicate, shard) = {expected}"


@pytest.mark.exercise("6.3")
@pytest.mark.points(2)
def test_resolve_hsdp_refuses_what_cannot_work_naming_the_numbers(lab06_mesh):
    cases = [
        ((4, 2, 2, 3), ("3", "2", "4")),  # product 6, world 4
        ((4, 2, 3, None), ("3", "4")),  # 3 does not divide 4
        ((8, 4, None, 3), ("3", "8")),
        ((6, 4, None, None), ("6", "4")),  # not a whole number of nodes
        ((4, 2, 0, None), ("0",)),
    ]
    for args, numbers in cases:
        with pytest.raises(ValueError) as caught:
            lab06_mesh.resolve_hsdp(*args)
        message = str(caught.value)
        missing = [n for n in numbers if n not in message]
        assert not missing, f"resolve_hsdp{args}: the message {message!r} does not name {missing}"
    # a degree that is not an integer, though the arithmetic would go through (5 / 2.5 = 2)
    try:
        got = lab06_mesh.resolve_hsdp(5, 5, 2.5)
    except ValueError as exc:
        missing = [n for n in ("2.5", "5") if n not in str(exc)]
        assert not missing, say(
            f"resolve_hsdp(5, 5, shard=2.5) raised ValueError({str(exc)!r}): right, but the message must name "
            f"{missing} (the degree and the world size)",
            f"resolve_hsdp(5, 5, shard=2.5) lanzó ValueError({str(exc)!r}): bien, pero el mensaje debe nombrar "
            f"{missing} (el grado y el tamaño del mundo)",
        )
    else:
        raise AssertionError(
            say(
                f"resolve_hsdp(5, 5, shard=2.5) returned {got}: a degree that is not a positive integer must raise "
                "ValueError (no mesh has 2.5 ranks in a row), even where 5 / 2.5 divides",
                f"resolve_hsdp(5, 5, shard=2.5) devolvió {got}: un grado que no es un entero positivo debe lanzar "
                "ValueError (ninguna malla tiene 2,5 ranks por fila), aunque 5 / 2,5 sea exacto",
            )
        )


# ----------------------------------------------------------------------------------------------
# Exercise 6.4: the bytes of one HSDP step, per mesh dimension


def by_hand(sizes: list[int], shard: int, replicate: int, pb: int, gb: int, reshard: list[bool]) -> dict[str, int]:
    """The rule of the exercise, unit by unit, in exact fractions."""
    inside = across = Fraction(0)
    for size, again in zip(sizes, reshard):
        inside += Fraction(shard - 1, shard) * size * ((2 if again else 1) * pb + gb)
        across += Fraction(2 * (replicate - 1), replicate) * Fraction(size, shard) * gb
    return {"shard": round(inside), "replicate": round(across)}


@pytest.mark.exercise("6.4")
@pytest.mark.points(2)
def test_hsdp_bytes_per_dim_adds_each_units_collectives(lab06_mesh):
    # a hand-worked case: units of 8 and 12 elements, shard 2, replicate 2, 4-byte weights and
    # gradients, the first unit (the root) kept gathered between forward and backward
    got = lab06_mesh.hsdp_bytes_per_dim([8, 12], 2, 2, 4, 4, [False, True])
    assert got == {"shard": 104, "replicate": 40}, f"units [8, 12], shard 2, replicate 2: {got}"
    for sizes, shard, replicate, pb, gb in (([12, 24, 36], 4, 2, 2, 4), ([6, 6], 3, 3, 4, 4), ([10], 2, 1, 4, 4)):
        reshard = [True] * len(sizes)
        got = lab06_mesh.hsdp_bytes_per_dim(sizes, shard, replicate, pb, gb)
        want = by_hand(sizes, shard, replicate, pb, gb, reshard)
        assert got == want, (
            f"units {sizes}, shard {shard}, replicate {replicate}, bytes {pb}/{gb}: {got}, expected {want}"
        )


@pytest.mark.exercise("6.4")
@pytest.mark.points(2)
def test_hsdp_bytes_per_dim_equals_what_fsdp2_sent(lab06_mesh):
    """MiniGPT's FSDP2 units (the root, then each block), each parameter's rows padded to a multiple
    of the shard degree: the formula must give the bytes FSDP2 really sent on the 2 x 2 mesh."""
    report = json.loads((ROOT / "lab" / "results" / "06-mesh-cpu.json").read_text())
    replicate, shard = report["mesh"]["hsdp"]["replicate"], report["mesh"]["hsdp"]["shard"]
    model = MiniGPT(GPTConfig())

    def padded(params) -> int:
        return sum(-(-p.shape[0] // shard) * shard * (p.numel() // p.shape[0]) for p in params)

    in_blocks = {id(p) for b in model.blocks for p in b.parameters()}
    sizes = [padded([p for p in model.parameters() if id(p) not in in_blocks])]
    sizes += [padded(list(b.parameters())) for b in model.blocks]
    got = lab06_mesh.hsdp_bytes_per_dim(sizes, shard, replicate, 4, 4, [False] + [True] * len(model.blocks))
    assert got == report["bytes_per_dim"], (
        f"{got}, but FSDP2 sent {report['bytes_per_dim']} (lab/results/06-mesh-cpu.json)"
    )
