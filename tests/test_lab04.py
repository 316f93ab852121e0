"""Lab 04 · FSDP from scratch: the graded checks.

The pieces that need no process group (sharding one tensor, the parameters a unit owns, the
prefetch choice) are tested in this process. The rest runs once per session in one 2-rank launch
(the ``fsdp_scratch`` fixture of tests/ranks.py, tests/fsdp_scratch_worker.py); each test reads
the scenario run for its exercise (``hooks@4.3``: only Exercise 4.3 the learner's). The course's
own checks of the mechanism are in tests/test_lab04_reference.py.

    make grade EX=4.3          # or: .venv/bin/python -m minigpt.grader --exercise 4.3
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from minigpt.fsdp.variants import predict_event_order
from minigpt.train import TrainConfig, build_model
from tests.ranks import Launch, scenario
from tests.words import say, short

pytestmark = [pytest.mark.lab("04"), pytest.mark.timeout(180)]

BYTES_PER_STEP = 2_922_240  # MiniGPT on 2 ranks, the block policy: all-gathers and reduce-scatters sent per rank


def both(launch: Launch, name: str) -> list[dict]:
    return [scenario(launch, name, r) for r in range(2)]


def fsdp2_order() -> list[str]:
    """Lab 03's model of FSDP2's order for 4 blocks (checked there against real runs)."""
    return predict_event_order(4, "fsdp2-implicit")


def first_difference(got: list[str], expected: list[str]) -> str:
    i = next((k for k, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
    return say(
        f"at event {i}: expected {expected[i : i + 3] or 'the end'}, got {got[i : i + 3] or 'the end'} "
        f"({len(expected)} events expected, {len(got)} came)",
        f"en el evento {i}: se espera {expected[i : i + 3] or 'el final'}, llegó {got[i : i + 3] or 'el final'} "
        f"(se esperan {len(expected)} eventos, llegaron {len(got)})",
    )


# ----------------------------------------------------------------------------------------------
# Exercise 4.1: one parameter, sharded and gathered back


@pytest.mark.exercise("4.1")
@pytest.mark.points(2)
def test_shard_rows_pads_and_cuts_equal_shards(lab04):
    for rows in (1, 3, 7, 609):
        full = torch.randn(rows, 5, generator=torch.Generator().manual_seed(rows))
        for world in (1, 2, 3, 4):
            per = -(-rows // world)
            padded = torch.cat([full, full.new_zeros(per * world - rows, 5)])
            shards = [lab04.shard_rows(full, r, world) for r in range(world)]
            where = say(f"{rows} rows, world size {world}", f"{rows} filas, tamaño del mundo {world}")
            shapes = [tuple(s.shape) for s in shards]
            assert shapes == [(per, 5)] * world, say(
                f"{where}: shard shapes {shapes}, expected {world} x {(per, 5)} (the rows padded with zero rows to "
                f"{per * world}, then cut in {world} equal shards)",
                f"{where}: formas de los fragmentos {shapes}, se esperan {world} x {(per, 5)} (las filas rellenadas "
                f"con filas de ceros hasta {per * world} y cortadas en {world} fragmentos iguales)",
            )
            glued = torch.cat(shards)
            assert torch.equal(glued, padded), say(
                f"{where}: the shards put back in rank order differ from the tensor followed by "
                f"{per * world - rows} zero rows (largest difference {float((glued - padded).abs().max()):.3g})",
                f"{where}: los fragmentos unidos por orden de rank difieren del tensor seguido de "
                f"{per * world - rows} filas de ceros (mayor diferencia {float((glued - padded).abs().max()):.3g})",
            )
            shards[0].fill_(7.0)
            assert not bool((full == 7.0).any()), say(
                f"{where}: writing into rank 0's shard changed the full tensor: a shard must be a new tensor, not a view",
                f"{where}: escribir en el fragmento del rank 0 cambió el tensor completo: un fragmento debe ser un "
                "tensor nuevo, no una vista",
            )


@pytest.mark.exercise("4.1")
@pytest.mark.points(1)
def test_gather_rows_gives_back_the_whole_tensor(fsdp_scratch):
    """Your gather_rows on 2 ranks, from the reference's shards: a wrong shard_rows costs the test
    above, not this one."""
    for rank, result in enumerate(both(fsdp_scratch, "gather@4.1")):
        for case in result["cases"]:
            assert case["equal"], say(
                f"rank {rank}: a {case['shape']} tensor sharded on 2 ranks and gathered back came out {case['got']}, "
                "not equal to it: expected the same tensor, padding rows dropped",
                f"rank {rank}: un tensor {case['shape']} fragmentado en 2 ranks y vuelto a reunir salió {case['got']}, "
                "distinto de él: se espera el mismo tensor, sin las filas de relleno",
            )
            assert case["collectives"] in (["all_gather_single"], ["all_gather_into_tensor"]), say(
                f"rank {rank}: gather_rows of a {case['shape']} tensor called {case['collectives'] or 'no collective'}"
                ": expected one collective, an all-gather into one tensor (dist.all_gather_single)",
                f"rank {rank}: gather_rows de un tensor {case['shape']} llamó a "
                f"{case['collectives'] or 'ninguna colectiva'}: se espera una sola colectiva, un all-gather en un "
                "solo tensor (dist.all_gather_single)",
            )


# ----------------------------------------------------------------------------------------------
# Exercise 4.2: the parameters a unit owns


@pytest.fixture
def minigpt():
    return build_model(TrainConfig(n_layer=2, n_embd=32, n_head=2))


def owned(lab04, unit: nn.Module, nested: list[nn.Module]) -> list[tuple[nn.Parameter, list]]:
    return lab04.unit_parameters(unit, nested)


@pytest.mark.exercise("4.2")
@pytest.mark.points(2)
def test_unit_parameters_tied_weight_once_nested_blocks_skipped(lab04, minigpt):
    params = owned(lab04, minigpt, list(minigpt.blocks))
    in_blocks = {id(p) for p in minigpt.blocks.parameters()}
    expected = [p for n, p in minigpt.named_parameters() if id(p) not in in_blocks]  # named_parameters: once each
    got_ids = [id(p) for p, _ in params]
    assert not in_blocks & set(got_ids), say(
        "unit_parameters(model, blocks) returned parameters of the nested blocks: expected them skipped (a block "
        "that is a unit owns its own)",
        "unit_parameters(model, bloques) devolvió parámetros de los bloques anidados: se espera que se salten (un "
        "bloque que es una unidad posee los suyos)",
    )
    assert len(got_ids) == len(set(got_ids)) == len(expected), say(
        f"unit_parameters(model, blocks) returned {len(got_ids)} entries ({len(set(got_ids))} distinct "
        f"parameters), expected {len(expected)}: each parameter once (the tied wte/lm_head matrix is one)",
        f"unit_parameters(model, bloques) devolvió {len(got_ids)} entradas ({len(set(got_ids))} parámetros "
        f"distintos), se esperan {len(expected)}: cada parámetro una vez (la matriz atada wte/lm_head es una)",
    )
    tied = next(slots for p, slots in params if p is minigpt.wte.weight)
    places = sorted((name, attr, module is getattr(minigpt, name.split(".")[0])) for module, attr, name in tied)
    assert places == [("lm_head.weight", "weight", True), ("wte.weight", "weight", True)], say(
        f"the tied matrix's slots are {short(places)}, expected two: (model.wte, 'weight', 'wte.weight') and "
        "(model.lm_head, 'weight', 'lm_head.weight')",
        f"los huecos de la matriz atada son {short(places)}, se esperan dos: (model.wte, 'weight', 'wte.weight') y "
        "(model.lm_head, 'weight', 'lm_head.weight')",
    )


class SharedModule(nn.Module):
    """One Linear held under two names (``first`` and ``again``): one module, met twice by the walk."""

    def __init__(self):
        super().__init__()
        self.first = nn.Linear(3, 3)
        self.again = self.first
        self.last = nn.Linear(3, 2)


@pytest.mark.exercise("4.2")
@pytest.mark.points(1)
def test_unit_parameters_frozen_owned_and_every_slot_named(lab04, minigpt):
    """Frozen parameters owned, every slot named (module, attribute, qualified name), and a module
    met twice under two names still one slot: the unit puts the gathered tensor there once."""
    shared = SharedModule()
    for _, slots in owned(lab04, shared, []):
        places = [(id(module), attr) for module, attr, _ in slots]
        assert len(places) == len(set(places)), say(
            f"a module held under two names (first and again) gave its parameter {len(places)} slots "
            f"{short([name for _, _, name in slots])}: expected one slot per (module, attribute), the module met "
            "twice counted once (compare modules with `is`)",
            f"un módulo guardado con dos nombres (first y again) dio a su parámetro {len(places)} huecos "
            f"{short([name for _, _, name in slots])}: se espera un hueco por (módulo, atributo), el módulo "
            "encontrado dos veces contado una sola vez (compara módulos con `is`)",
        )
    minigpt.blocks[0].attn.requires_grad_(False)
    params = owned(lab04, minigpt, [])
    distinct = list(minigpt.parameters())
    assert [id(p) for p, _ in params] == [id(p) for p in distinct], say(
        f"unit_parameters(model, []) listed {len(params)} parameters, expected all {len(distinct)} of the model, "
        "each once, in the order they are met (frozen ones included: they are sharded too)",
        f"unit_parameters(model, []) listó {len(params)} parámetros, se esperan los {len(distinct)} del modelo, "
        "cada uno una vez, en el orden en que aparecen (también los congelados: también se fragmentan)",
    )
    names = dict(minigpt.named_modules())
    for p, slots in params:
        for module, attr, name in slots:
            prefix, _, last = name.rpartition(".")
            assert last == attr and names[prefix] is module and module._parameters[attr] is p, say(
                f"slot {short((type(module).__name__, attr, name))}: expected (the module that holds it, its "
                "attribute name, its qualified name in the unit)",
                f"hueco {short((type(module).__name__, attr, name))}: se espera (el módulo que lo tiene, el nombre "
                "de su atributo, su nombre completo en la unidad)",
            )


# ----------------------------------------------------------------------------------------------
# Exercise 4.3: the four moves (the scaffold's hooks run them)


@pytest.mark.exercise("4.3")
@pytest.mark.points(2)
def test_hooks_gradients_equal_the_reference_fsdp(fsdp_scratch):
    for rank, result in enumerate(both(fsdp_scratch, "hooks@4.3")):
        for step, numbers in enumerate(result["steps"]):
            assert not numbers["differ"], say(
                f"rank {rank}, step {step}: with your unit the shards' gradients of {short(numbers['differ'])} differ "
                "from the reference FSDP's on the same batch (expected: the same bits)",
                f"rank {rank}, paso {step}: con tu unidad los gradientes de los fragmentos de "
                f"{short(numbers['differ'])} difieren de los del FSDP de referencia con el mismo lote (se esperan los "
                "mismos bits)",
            )
    for rank, result in enumerate(both(fsdp_scratch, "hooks_twice@4.3")):
        for step, numbers in enumerate(result["steps"]):
            times = numbers["reduce_scatters"].get("twice", 0)
            assert times == 1, say(
                f"rank {rank}, step {step}: the unit 'twice', called twice in one forward, reduce-scattered its "
                f"gradients {times} time(s) in one backward: expected once, in after_backward (which the scaffold "
                "calls once, after the backward of the unit's last use); no other move reduces",
                f"rank {rank}, paso {step}: la unidad 'twice', llamada dos veces en una pasada hacia delante, hizo "
                f"reduce-scatter de sus gradientes {times} vez/veces en una pasada hacia atrás: se espera una, en "
                "after_backward (que el andamiaje llama una sola vez, tras la pasada hacia atrás del último uso de la "
                "unidad); ningún otro movimiento reduce",
            )
            gathers, expected = numbers["all_gathers"].get("twice", 0), numbers["reference_all_gathers"].get("twice")
            assert gathers == expected, say(
                f"rank {rank}, step {step}: the unit 'twice', called twice in one forward, was all-gathered {gathers} "
                f"time(s) in one step, the reference FSDP {expected}: "
                + (
                    "a unit is gathered in before_forward and before_backward only where it was freed: one freed "
                    "where it must stay whole (between before_backward and after_backward) is gathered once more"
                    if gathers > expected
                    else "a unit is freed after each forward (after_forward) and gathered again for its backward "
                    "(before_backward)"
                ),
                f"rank {rank}, paso {step}: la unidad 'twice', llamada dos veces en una pasada hacia delante, se reunió "
                f"(all-gather) {gathers} vez/veces en un paso, el FSDP de referencia {expected}: "
                + (
                    "una unidad se reúne en before_forward y before_backward solo donde se liberó: una liberada donde "
                    "debe seguir entera (entre before_backward y after_backward) se reúne una vez más"
                    if gathers > expected
                    else "una unidad se libera tras cada pasada hacia delante (after_forward) y se vuelve a reunir para "
                    "su pasada hacia atrás (before_backward)"
                ),
            )
            assert not numbers["differ"], say(
                f"rank {rank}, step {step}: on a model whose unit 'twice' runs twice in one forward, the shards' "
                f"gradients of {short(numbers['differ'])} differ from the reference FSDP's (expected: the same bits)",
                f"rank {rank}, paso {step}: en un modelo cuya unidad 'twice' corre dos veces en una pasada hacia "
                f"delante, los gradientes de los fragmentos de {short(numbers['differ'])} difieren de los del FSDP de "
                "referencia (se esperan los mismos bits)",
            )


@pytest.mark.exercise("4.3")
@pytest.mark.points(2)
def test_hooks_free_blocks_after_forward_and_gather_them_for_backward(fsdp_scratch):
    for rank, result in enumerate(both(fsdp_scratch, "hooks@4.3")):
        for step, numbers in enumerate(result["steps"]):
            held = {unit: n for unit, n in numbers["after_forward"].items() if n}
            assert not held, say(
                f"rank {rank}, step {step}: after the forward the blocks still hold gathered parameters "
                f"{short(held)} (bytes): expected 0 (each block freed after its forward)",
                f"rank {rank}, paso {step}: tras la pasada hacia delante los bloques aún tienen parámetros reunidos "
                f"{short(held)} (bytes): se espera 0 (cada bloque liberado tras su pasada)",
            )
            assert numbers["root_after_forward"] > 0, say(
                f"rank {rank}, step {step}: the root freed its parameters after its forward: expected it to keep them "
                "(backward starts with it)",
                f"rank {rank}, paso {step}: la raíz liberó sus parámetros tras su pasada hacia delante: se espera que "
                "los conserve (la pasada hacia atrás empieza por ella)",
            )
            assert numbers["after_step"] == 0, say(
                f"rank {rank}, step {step}: after backward {numbers['after_step']} bytes of gathered parameters are "
                "still held: expected 0",
                f"rank {rank}, paso {step}: tras la pasada hacia atrás siguen reunidos {numbers['after_step']} bytes "
                "de parámetros: se espera 0",
            )
        empty = sorted(k for k, sizes in result["held_in_backward"].items() if not all(sizes))
        assert result["held_in_backward"] and not empty, say(
            f"rank {rank}: when their gradients were computed, {short(empty)} had 0 bytes: expected each block "
            "gathered again before its backward",
            f"rank {rank}: cuando se calcularon sus gradientes, {short(empty)} tenían 0 bytes: se espera cada bloque "
            "reunido de nuevo antes de su pasada hacia atrás",
        )


@pytest.mark.exercise("4.3")
@pytest.mark.points(1)
def test_hooks_follow_fsdp2_order(fsdp_scratch):
    for rank, result in enumerate(both(fsdp_scratch, "hooks@4.3")):
        ours = [e for e in result["schedule"] if not e.startswith("free ")]
        assert ours == fsdp2_order(), say(
            f"rank {rank}: your unit's schedule differs from FSDP2's ",
            f"rank {rank}: el orden de tu unidad difiere del de FSDP2 ",
        ) + first_difference(ours, fsdp2_order())
    for rank, result in enumerate(both(fsdp_scratch, "hooks_prefetch@4.3")):
        assert result["checked"] > 0 and not result["late"], say(
            f"rank {rank}: with an explicit forward prefetch (each block's forward_prefetch is the next block), "
            f"before_forward returned with these gathers not in flight: {short(result['late'])} ({result['checked']} "
            "checked): each unit of self.forward_prefetch must have its all-gather issued and not waited for (it "
            "travels while this unit computes)",
            f"rank {rank}: con una precarga explícita en la pasada hacia delante (el forward_prefetch de cada bloque es "
            f"el bloque siguiente), before_forward terminó sin estos all-gather en curso: {short(result['late'])} "
            f"({result['checked']} comprobados): cada unidad de self.forward_prefetch debe tener su all-gather lanzado "
            "y sin esperar (viaja mientras esta unidad calcula)",
        )
        assert not result["order"], say(
            f"rank {rank}: before_forward issued a prefetch's all-gather before its own unit's: "
            f"{short(result['order'])}: gathers on one group finish in the order they were issued, so this forward "
            "waits for the prefetch too; issue the unit's own all-gather first",
            f"rank {rank}: before_forward lanzó el all-gather de una precarga antes que el de su propia unidad: "
            f"{short(result['order'])}: los all-gather de un grupo terminan en el orden en que se lanzan, así que esta "
            "pasada hacia delante espera también a la precarga; lanza primero el all-gather de la unidad",
        )


def backward_peak_problem(rank: int, step: int, numbers: dict) -> str:
    """Why backward held more than the reference FSDP: the first unit found still whole where it need
    not be, named with the unit whose backward was starting."""
    head = say(
        f"rank {rank}, step {step}: backward held up to {numbers['backward_peak']:,} bytes of parameters and "
        f"gradients, the reference FSDP {numbers['reference_backward_peak']:,} on the same batch: ",
        f"rank {rank}, paso {step}: la pasada hacia atrás llegó a tener {numbers['backward_peak']:,} bytes de "
        f"parámetros y gradientes, el FSDP de referencia {numbers['reference_backward_peak']:,} con el mismo lote: ",
    )
    if numbers["kept"]:
        unit, starting = numbers["kept"][0]
        return head + say(
            f"{unit} still held its gathered parameters when {starting}'s backward started (after_backward of {unit} "
            "returned without freeing them): free a unit after its last backward, nothing reads its parameters again "
            "in this step",
            f"{unit} aún tenía sus parámetros reunidos cuando empezó la pasada hacia atrás de {starting} "
            f"(after_backward de {unit} terminó sin liberarlos): libera una unidad tras su última pasada hacia atrás, "
            "nadie vuelve a leer sus parámetros en este paso",
        )
    if numbers["reduced_whole"]:
        unit = numbers["reduced_whole"][0]
        return head + say(
            f"{unit} began its reduce-scatter with its gathered parameters still held, and freed them after the "
            "reduce-scatter: free first, then reduce-scatter, so that the reduce-scatter's buffer takes the "
            "parameters' place instead of joining them",
            f"{unit} empezó su reduce-scatter con sus parámetros reunidos aún en memoria y los liberó después del "
            "reduce-scatter: libera primero y haz luego el reduce-scatter, para que el búfer del reduce-scatter ocupe "
            "el lugar de los parámetros en vez de sumarse a ellos",
        )
    if numbers["from_forward"]:
        unit, starting = numbers["from_forward"][0]
        return head + say(
            f"{unit} was still whole from its forward when {starting}'s backward started: free a unit after its "
            "forward (after_forward), not only after its backward",
            f"{unit} seguía entera desde su pasada hacia delante cuando empezó la pasada hacia atrás de {starting}: "
            "libera una unidad tras su pasada hacia delante (after_forward), no solo tras la de atrás",
        )
    return head + say(
        "more units were whole at once than FSDP needs (a unit is whole only from before_forward to after_forward "
        "and from before_backward to after_backward)",
        "hubo más unidades enteras a la vez de las que FSDP necesita (una unidad solo está entera desde "
        "before_forward hasta after_forward y desde before_backward hasta after_backward)",
    )


@pytest.mark.exercise("4.3")
@pytest.mark.points(2)
def test_hooks_hold_no_more_in_backward_than_the_reference_fsdp(fsdp_scratch):
    """Backward's peak of bytes held (parameters and gradients, every unit counted from its storages,
    a reduce-scatter's buffer while it runs), with your unit and with the reference's on the same
    model and batch: yours is at most the reference's. A unit kept whole after its last backward, or
    freed only after its reduce-scatter, holds one unit's parameters more. (A unit that prefetches
    nothing in backward holds less: the order test charges that.)"""
    for rank, result in enumerate(both(fsdp_scratch, "hooks@4.3")):
        for step, numbers in enumerate(result["steps"]):
            assert numbers["backward_peak"] <= numbers["reference_backward_peak"], backward_peak_problem(
                rank, step, numbers
            )


# ----------------------------------------------------------------------------------------------
# Exercise 4.4: the reduce-scatter and the global norm


@pytest.mark.exercise("4.4")
@pytest.mark.points(2)
def test_reduce_gradients_is_the_mean_over_ranks_with_padding(fsdp_scratch):
    for rank, result in enumerate(both(fsdp_scratch, "reduce@4.4")):
        assert not result["missing"], say(
            f"rank {rank}: the shards of {result['missing']} got no gradient",
            f"rank {rank}: los fragmentos de {result['missing']} no recibieron gradiente",
        )
        wrong = {n: e for n, e in result["errors"].items() if not e <= 1e-6}
        symptom = (
            say(
                "; every gradient is exactly twice the mean: summed, not averaged (divide the reduce-scatter's sum "
                "by the world size)",
                "; cada gradiente es exactamente el doble de la media: sumado, no promediado (divide la suma del "
                "reduce-scatter entre el tamaño del mundo)",
            )
            if result["summed_not_averaged"]
            else ""
        )
        assert not wrong, (
            say(
                f"rank {rank}: the shards' gradients differ from the rows of the mean over the ranks of the full "
                f"gradients computed in one process by {short(wrong)} (expected <= 1e-6; the embedding has 609 "
                "rows, 610 with padding)",
                f"rank {rank}: los gradientes de los fragmentos difieren de las filas de la media sobre los ranks de "
                f"los gradientes completos calculados en un proceso en {short(wrong)} (se espera <= 1e-6; el "
                "embedding tiene 609 filas, 610 con relleno)",
            )
            + symptom
        )
        assert result["padding_zero"], say(
            f"rank {rank}: a padding row of a shard got a nonzero gradient: expected 0",
            f"rank {rank}: una fila de relleno de un fragmento recibió un gradiente distinto de cero: se espera 0",
        )
        assert not result["full_grads_kept"], say(
            f"rank {rank}: units {result['full_grads_kept']} kept their full gradients: expected them dropped "
            "(p.full.grad = None)",
            f"rank {rank}: las unidades {result['full_grads_kept']} conservaron sus gradientes completos: se espera "
            "que se descarten (p.full.grad = None)",
        )
        assert result["accumulated_error"] <= 1e-6, say(
            f"rank {rank}: after a second backward without zeroing, the shards' gradients differ from twice the mean "
            f"by {result['accumulated_error']:.2e} (expected <= 1e-6: added to the .grad already there)",
            f"rank {rank}: tras una segunda pasada hacia atrás sin poner a cero, los gradientes difieren del doble de "
            f"la media en {result['accumulated_error']:.2e} (se espera <= 1e-6: sumados al .grad que ya había)",
        )
        for reduction in result["reductions"]:
            assert reduction_is_right(reduction), reduction_problem(rank, reduction)


def reduction_is_right(reduction: dict) -> bool:
    """One reduce_gradients: nothing at all when no parameter had a gradient, else one reduce-scatter
    of the expected buffer."""
    n, calls = reduction["expected"], [(name, numels) for name, numels in reduction["calls"]]
    if n == 0:
        return calls == []
    return (
        len(calls) == 1 and calls[0][0] in ("reduce_scatter_single", "reduce_scatter_tensor") and calls[0][1][-1] == n
    )


def reduction_problem(rank: int, reduction: dict) -> str:
    unit, n = reduction["unit"], reduction["expected"]
    calls = short([f"{name} {numels}" for name, numels in reduction["calls"]]) if reduction["calls"] else "nothing"
    if n == 0:
        return say(
            f"rank {rank}: reduce_gradients of unit {unit}, none of whose parameters has a gradient (frozen), called "
            f"{calls}: expected no collective at all (the same on every rank)",
            f"rank {rank}: reduce_gradients de la unidad {unit}, ninguno de cuyos parámetros tiene gradiente "
            f"(congelados), llamó a {calls}: no se espera ninguna colectiva (lo mismo en cada rank)",
        )
    return say(
        f"rank {rank}: reduce_gradients of unit {unit} called {calls}: expected one reduce-scatter "
        f"(dist.reduce_scatter_single or reduce_scatter_tensor) of one buffer of {n} elements (only the parameters whose full.grad is not None, each padded as its shard; a "
        "layer unused in forward takes no part)",
        f"rank {rank}: reduce_gradients de la unidad {unit} llamó a {calls}: se espera un solo "
        f"reduce-scatter (dist.reduce_scatter_single o reduce_scatter_tensor) de un búfer de {n} elementos (solo los parámetros cuyo full.grad no es None, "
        "cada uno rellenado como su fragmento; una capa no usada en la pasada hacia delante no participa)",
    )


@pytest.mark.exercise("4.4")
@pytest.mark.points(2)
def test_global_grad_norm_is_the_norm_of_the_whole_gradient(fsdp_scratch):
    for rank, result in enumerate(both(fsdp_scratch, "norm@4.4")):
        expected, got = result["expected"], result["got"]
        assert result["is_tensor"] and abs(got - expected) <= 1e-5 * expected, say(
            f"rank {rank}: global_grad_norm returned {got:.6g}, expected {expected:.6g}, the norm of the whole "
            "gradient (the same on every rank: the local norms' squares summed over the ranks), as a tensor",
            f"rank {rank}: global_grad_norm devolvió {got:.6g}, se espera {expected:.6g}, la norma del gradiente "
            "entero (la misma en cada rank: los cuadrados de las normas locales sumados entre los ranks), como tensor",
        )
        calls, pieces = result["all_reduces"], result["with_gradient"]
        assert calls == [pieces], say(
            f"rank {rank}: global_grad_norm called dist.all_reduce on {short(calls)} elements, expected one all-reduce "
            f"of {pieces}: the squared norm of each parameter's piece, summed over the ranks parameter by parameter "
            "(one number per rank sums in another order: equal on paper, no longer FSDP2's norm to the bit)",
            f"rank {rank}: global_grad_norm llamó a dist.all_reduce con {short(calls)} elementos, se espera un solo "
            f"all-reduce de {pieces}: el cuadrado de la norma del trozo de cada parámetro, sumado entre los ranks "
            "parámetro a parámetro (un número por rank suma en otro orden: igual sobre el papel, pero ya no es la "
            "norma de FSDP2 bit a bit)",
        )


def norm_bits_problem(rank: int, step: int, numbers: dict) -> str:
    """Why the learner's norm is not FSDP2's to the bit: no all-reduce, another all-reduce, or the
    right all-reduce combined in another order."""
    got, want, n, calls = numbers["got"], numbers["want"], numbers["parameters"], numbers["all_reduces"]
    where = say(
        f"rank {rank}: on MiniGPT's gradients of batch {step} global_grad_norm returned {got!r}, FSDP2's norm is "
        f"{want!r}: ",
        f"rank {rank}: con los gradientes de MiniGPT del lote {step} global_grad_norm devolvió {got!r}, la norma de "
        f"FSDP2 es {want!r}: ",
    )
    if not calls:
        return where + say(
            f"it called no dist.all_reduce: the norm of this rank's pieces only, not of the whole gradient (expected "
            f"one all-reduce of {n}, one squared piece norm per parameter, summed over the ranks)",
            f"no llamó a dist.all_reduce: la norma solo de los trozos de este rank, no la del gradiente entero (se "
            f"espera un solo all-reduce de {n}, el cuadrado de la norma de un trozo por parámetro, sumado entre los "
            "ranks)",
        )
    if calls != [n]:
        return where + say(
            f"it called dist.all_reduce on {short(calls)} elements, expected one all-reduce of {n}, one squared piece "
            "norm per parameter (one number per rank sums in another order: equal on paper, no longer FSDP2's norm "
            "to the bit)",
            f"llamó a dist.all_reduce con {short(calls)} elementos, se espera un solo all-reduce de {n}, el cuadrado "
            "de la norma de un trozo por parámetro (un número por rank suma en otro orden: igual sobre el papel, pero "
            "ya no es la norma de FSDP2 bit a bit)",
        )
    return where + say(
        "the same norm on paper, another rounding: combine per parameter first, as FSDP2 does (each parameter's norm "
        "is the square root of its squares summed over the ranks; the whole norm is the norm of those norms, not the "
        "square root of all the squares' sum), with the parameters in the model's order (model.parameters()), not "
        "unit by unit: the same numbers summed in another order round differently",
        "la misma norma sobre el papel, otro redondeo: combina primero por parámetro, como hace FSDP2 (la norma de "
        "cada parámetro es la raíz de sus cuadrados sumados entre los ranks; la norma entera es la norma de esas "
        "normas, no la raíz de la suma de todos los cuadrados), con los parámetros en el orden del modelo "
        "(model.parameters()), no unidad a unidad: los mismos números sumados en otro orden redondean distinto",
    )


@pytest.mark.exercise("4.4")
@pytest.mark.points(1)
def test_global_grad_norm_is_fsdp2s_to_the_bit(fsdp_scratch):
    """The combination order of the stub's contract, where it matters: on MiniGPT's real gradients (4
    batches, 2 ranks) your norm has FSDP2's bits (the reference's norm, which the lab's proofs hold to
    ``clip_grad_norm_`` on FSDP2's sharded gradients, bit for bit)."""
    for rank, result in enumerate(both(fsdp_scratch, "norm_bits@4.4")):
        for step, numbers in enumerate(result["steps"]):
            assert numbers["equal"], norm_bits_problem(rank, step, numbers)


# ----------------------------------------------------------------------------------------------
# Exercise 4.5: the prefetch choice in backward

ORDER = ["blocks.0", "blocks.1", "blocks.2", "blocks.3", "root"]
PREFETCH_CASES = [
    (ORDER, "root", 1, ["blocks.3"]),
    (ORDER, "blocks.3", 1, ["blocks.2"]),
    (ORDER, "blocks.1", 1, ["blocks.0"]),
    (ORDER, "blocks.0", 1, []),
    (ORDER, "blocks.3", 2, ["blocks.2", "blocks.1"]),
    (ORDER, "blocks.1", 2, ["blocks.0"]),
    (ORDER, "blocks.7", 1, []),
    (["a", "b", "a", "root"], "root", 1, ["a"]),
    (["a", "b", "a", "root"], "a", 1, ["b"]),
    (["a", "b", "a", "root"], "b", 1, []),
    (ORDER, "root", 0, []),  # depth < 1: no prefetch
    (ORDER, "blocks.3", -1, []),
]


@pytest.mark.exercise("4.5")
@pytest.mark.points(2)
def test_backward_prefetch_targets(lab04):
    for order, current, depth, expected in PREFETCH_CASES:
        got = lab04.backward_prefetch_targets(list(order), current, depth)
        assert list(got) == expected, say(
            f"backward_prefetch_targets({order}, {current!r}, {depth}) returned {short(got)}, expected {expected} "
            "(the units whose backward comes right after this one's, none for depth < 1; a unit that ran twice counts "
            "at its last finish)",
            f"backward_prefetch_targets({order}, {current!r}, {depth}) devolvió {short(got)}, se espera {expected} "
            "(las unidades cuya pasada hacia atrás viene justo después de esta, ninguna con depth < 1; una unidad que "
            "corrió dos veces cuenta en su último final)",
        )


@pytest.mark.exercise("4.5")
@pytest.mark.points(1)
def test_prefetch_on_two_ranks_follows_fsdp2_order(fsdp_scratch):
    for rank, result in enumerate(both(fsdp_scratch, "prefetch@4.5")):
        ours = [e for e in result["schedule"] if not e.startswith("free ")]
        assert ours == fsdp2_order(), say(
            f"rank {rank}: with your prefetch choice the schedule differs from FSDP2's ",
            f"rank {rank}: con tu elección de precarga el orden difiere del de FSDP2 ",
        ) + first_difference(ours, fsdp2_order())


# ----------------------------------------------------------------------------------------------
# All together


@pytest.mark.exercise("all")
@pytest.mark.points(2)
def test_all_together_your_fsdp_trains_minigpt_like_one_process(fsdp_scratch):
    """All of your Lab 04 code: MiniGPT sharded per block on 2 ranks, 3 AdamW steps with clipping
    by the global norm. The gradients of one backward first (AdamW would hide a factor of 2),
    then each step against one process that starts from the same state (Lab 01's step drift,
    logits in float64), and the bytes each rank sends per step."""
    for rank, result in enumerate(both(fsdp_scratch, "train@all")):
        assert result["grad_error"] <= 1e-6, say(
            f"rank {rank}: after one backward the shards' gradients differ from one process's by "
            f"{result['grad_error']:.2e} (expected <= 1e-6)",
            f"rank {rank}: tras una pasada hacia atrás los gradientes de los fragmentos difieren de los de un proceso "
            f"en {result['grad_error']:.2e} (se espera <= 1e-6)",
        )
        drift = max(result["drifts"])
        assert drift <= 1e-5, say(
            f"rank {rank}: a step differs from one process's by {drift:.2e} in the logits (steps: "
            f"{short([f'{d:.1e}' for d in result['drifts']])}; expected <= 1e-5)",
            f"rank {rank}: un paso difiere del de un proceso en {drift:.2e} en los logits (pasos: "
            f"{short([f'{d:.1e}' for d in result['drifts']])}; se espera <= 1e-5)",
        )
        assert result["bytes_sent"] == [BYTES_PER_STEP] * len(result["bytes_sent"]), say(
            f"rank {rank}: bytes sent per step {result['bytes_sent']}, expected {BYTES_PER_STEP:,} each (each block "
            "all-gathered in forward and again in backward, the root once, every unit's gradients reduce-scattered "
            "once)",
            f"rank {rank}: bytes enviados por paso {result['bytes_sent']}, se esperan {BYTES_PER_STEP:,} en cada uno "
            "(cada bloque reunido en la pasada hacia delante y otra vez en la de atrás, la raíz una vez, y los "
            "gradientes de cada unidad con un solo reduce-scatter)",
        )
