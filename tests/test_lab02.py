"""Lab 02 · the ZeRO simulator: the learner's memory formulas, ZeRO-2 step and communication
accounting, held against the ZeRO paper's own numbers and against the numpy simulation.

``make grade LAB=02`` runs them on ``lab/exercises/lab02_zero.py`` (one exercise: ``make grade EX=2.5``).
"""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest

from minigpt.zero import analytic as za, comm, memory, mlp, simulate
from tests import ranks
from tests.ranks import Launch
from tests.words import refuses, say

pytestmark = pytest.mark.lab("02")

# Rajbhandari et al., 2020, Table 1: per-device memory (GB) for P_os, P_os+g, P_os+g+p,
# typed from the paper. Rows: DP degree N; per model: the three stages.
PAPER_TABLE_1 = {
    7.5e9: {
        1: ("120", "120", "120"),
        4: ("52.5", "41.3", "30"),
        16: ("35.6", "21.6", "7.5"),
        64: ("31.4", "16.6", "1.88"),
        256: ("30.4", "15.4", "0.47"),
        1024: ("30.1", "15.1", "0.12"),
    },
    128e9: {
        1: ("2048", "2048", "2048"),
        4: ("896", "704", "512"),
        16: ("608", "368", "128"),
        64: ("536", "284", "32"),
        256: ("518", "263", "8"),
        1024: ("513", "257", "2"),
    },
    1e12: {
        1: ("16000", "16000", "16000"),
        4: ("7000", "5500", "4000"),
        16: ("4750", "2875", "1000"),
        64: ("4187", "2218", "250"),
        256: ("4046", "2054", "62.5"),
        1024: ("4011", "2013", "15.6"),
    },
}


def num(x: float) -> str:
    """A byte or parameter count, short: 7.5e9, 2.5e8, 11380."""
    return f"{x:g}".replace("e+0", "e").replace("e+", "e")


def nums(values) -> str:
    """A tuple or list of counts, short."""
    return "(" + ", ".join(num(v) for v in values) + ")"


def gb(cells: tuple) -> str:
    """Table 1's cells (strings, rounded as the paper rounds), without quotes: (52.5, 41.3, 30)."""
    return "(" + ", ".join(str(c) for c in cells) + ")"


def per_worker(values: list) -> str:
    """One worker's value when all agree, else the list."""
    return num(values[0]) if len(set(values)) == 1 else "[" + ", ".join(num(v) for v in values) + "]"


# --- Exercise 2.1: memory ----------------------------------------------------------------------


@pytest.mark.exercise("2.1")
@pytest.mark.points(2)
@pytest.mark.parametrize("psi", list(PAPER_TABLE_1))
def test_every_cell_of_the_zero_papers_table_1(lab02, psi):
    for n, cells in PAPER_TABLE_1[psi].items():
        ours = tuple(za.paper_round(lab02.device_memory(psi, n, stage).device / za.GB) for stage in (1, 2, 3))
        stage = next((k + 1 for k, (a, b) in enumerate(zip(ours, cells)) if a != b), 1)
        assert ours == cells, say(
            f"Ψ = {num(psi)} parameters on {n} device(s), mixed precision: at stages 1, 2, 3 your memory per device "
            f"is {gb(ours)} GB, the ZeRO paper's Table 1 says {gb(cells)} (first difference: stage {stage})",
            f"Ψ = {num(psi)} parámetros en {n} dispositivo(s), precisión mixta: en las etapas 1, 2, 3 tu memoria por "
            f"dispositivo es {gb(ours)} GB, la tabla 1 del artículo de ZeRO dice {gb(cells)} (primera diferencia: "
            "etapa "
            f"{stage})",
        )
    ddp = lab02.device_memory(psi, 8, 0).device
    assert ddp == 16 * psi, say(
        f"stage 0 (DDP), Ψ = {num(psi)} on 8 devices: {num(ddp)} bytes per device, expected 16Ψ = {num(16 * psi)}: "
        "nothing is sharded, 2 + 2 + 12 bytes per parameter",
        f"etapa 0 (DDP), Ψ = {num(psi)} en 8 dispositivos: {num(ddp)} bytes por dispositivo, se espera 16Ψ = "
        f"{num(16 * psi)}: nada se fragmenta, 2 + 2 + 12 bytes por parámetro",
    )


@pytest.mark.exercise("2.1")
@pytest.mark.points(2)
def test_recipes_and_working_buffer(lab02):
    psi, n, layer = 1e9, 8, 1e7
    fp32 = lab02.device_memory(psi, 1, 0, "fp32").device
    assert fp32 == 16e9, say(
        f"device_memory(1e9, 1, 0, 'fp32').device is {num(fp32)} bytes, expected 1.6e10: fp32 with Adam holds 4 "
        "(weights) + 4 (gradients) + 8 (Adam's m and v) bytes per parameter",
        f"device_memory(1e9, 1, 0, 'fp32').device da {num(fp32)} bytes, se espera 1.6e10: fp32 con Adam guarda 4 "
        "(pesos) + 4 (gradientes) + 8 (m y v de Adam) bytes por parámetro",
    )
    extra = lab02.device_memory(psi, n, 1, "mixed-fp32-grads").device - lab02.device_memory(psi, n, 1).device
    assert extra == 4e9, say(
        f"stage 1, Ψ = 1e9 on 8 devices: 'mixed-fp32-grads' holds {num(extra)} bytes more than 'mixed', expected 4e9: "
        "its fp32 gradient-accumulation buffer (4 bytes per parameter) is whole at stage 1, where gradients are not "
        "sharded",
        f"etapa 1, Ψ = 1e9 en 8 dispositivos: 'mixed-fp32-grads' ocupa {num(extra)} bytes más que 'mixed', se "
        "esperan 4e9: su búfer fp32 de acumulación de gradientes (4 bytes por parámetro) está entero en la etapa 1, "
        "que no fragmenta los gradientes",
    )
    grads = lab02.device_memory(psi, n, 2, "mixed-fp32-grads").grads
    assert grads == 6e9 / n, say(
        f"stage 2, 'mixed-fp32-grads', Ψ = 1e9 on 8 devices: .grads is {num(grads)} bytes, expected 6e9 / 8 = "
        f"{num(6e9 / n)}: from stage 2 the gradients (2 + 4 bytes per parameter) are sharded over the 8 devices",
        f"etapa 2, 'mixed-fp32-grads', Ψ = 1e9 en 8 dispositivos: .grads da {num(grads)} bytes, se espera 6e9 / 8 = "
        f"{num(6e9 / n)}: desde la etapa 2 los gradientes (2 + 4 bytes por parámetro) se fragmentan entre los 8",
    )
    m2 = lab02.device_memory(psi, n, 2, largest_layer=layer)
    assert m2.working == 2 * layer and m2.device == 2 * psi + 14 * psi / n + 2 * layer, say(
        f"stage 2, Ψ = 1e9 on 8 devices, largest layer 1e7: working {num(m2.working)}, device {num(m2.device)} bytes; "
        f"expected working 2e7 (the largest layer's 2-byte gradient, whole until its reduce-scatter) and device "
        f"2Ψ + 14Ψ/N + working = {num(2 * psi + 14 * psi / n + 2 * layer)}",
        f"etapa 2, Ψ = 1e9 en 8 dispositivos, capa mayor de 1e7: working {num(m2.working)}, device {num(m2.device)} "
        f"bytes; se espera working 2e7 (el gradiente de 2 bytes de la capa mayor, entero hasta su reduce-scatter) y "
        f"device 2Ψ + 14Ψ/N + working = {num(2 * psi + 14 * psi / n + 2 * layer)}",
    )
    working = lab02.device_memory(psi, n, 3, largest_layer=layer).working
    assert working == 4 * layer, say(
        f"stage 3, largest layer 1e7: working buffer {num(working)} bytes, expected 4e7: the largest layer's "
        "gathered 2-byte weights and its whole 2-byte gradient",
        f"etapa 3, capa mayor de 1e7: búfer de trabajo de {num(working)} bytes, se esperan 4e7: los pesos reunidos "
        "de 2 bytes de la capa mayor y su gradiente entero de 2 bytes",
    )


@pytest.mark.exercise("2.1")
@pytest.mark.points(2)
def test_offload(lab02):
    psi, n, layer = 1e9, 8, 1e7
    off = lab02.device_memory(psi, n, 3, largest_layer=layer, offload_optimizer=True, offload_params=True)
    assert (off.device, off.host) == (4 * layer, 16 * psi / n), offload_message(
        3,
        (off.device, off.host),
        (4 * layer, 16 * psi / n),
        "with both offloads and a largest layer of 1e7, only the working buffer stays on the device, all 16Ψ/N "
        "bytes of the shards go to the host",
        "con las dos descargas y una capa mayor de 1e7, solo el búfer de trabajo se queda en el dispositivo, los "
        "16Ψ/N bytes de los fragmentos van al host",
    )
    off2 = lab02.device_memory(psi, n, 2, offload_optimizer=True)
    assert (off2.device, off2.host) == (2 * psi, 14 * psi / n), offload_message(
        2,
        (off2.device, off2.host),
        (2 * psi, 14 * psi / n),
        "offload_optimizer: the 2-byte weights stay whole on the device, the optimizer shard (12Ψ/N) and, from "
        "stage 2, the gradient shard (2Ψ/N) go to the host",
        "offload_optimizer: los pesos de 2 bytes se quedan enteros en el dispositivo, el fragmento del optimizador "
        "(12Ψ/N) y, desde la etapa 2, el del gradiente (2Ψ/N) van al host",
    )
    off1 = lab02.device_memory(psi, n, 1, offload_optimizer=True)
    assert (off1.device, off1.host) == (4 * psi, 12 * psi / n), offload_message(
        1,
        (off1.device, off1.host),
        (4 * psi, 12 * psi / n),
        "offload_optimizer: the weights and the whole gradient stay on the device (2 + 2 bytes per parameter), only "
        "the optimizer shard (12Ψ/N) goes to the host",
        "offload_optimizer: los pesos y el gradiente entero se quedan en el dispositivo (2 + 2 bytes por parámetro), "
        "solo el fragmento del optimizador (12Ψ/N) va al host",
    )


def offload_message(stage: int, got: tuple, expected: tuple, why: str, why_es: str) -> str:
    return say(
        f"stage {stage}, Ψ = 1e9 on 8 devices: (device, host) = {nums(got)} bytes, expected {nums(expected)}: {why}",
        f"etapa {stage}, Ψ = 1e9 en 8 dispositivos: (device, host) = {nums(got)} bytes, se espera {nums(expected)}: "
        f"{why_es}",
    )


@pytest.mark.exercise("2.1")
@pytest.mark.points(1)
def test_memory_rejects_bad_input(lab02):
    for args, kwargs, why, why_es in [
        ((0, 8, 2), {}, "a model of 0 parameters", "un modelo de 0 parámetros"),
        ((-1e9, 8, 2), {}, "a negative parameter count", "un número de parámetros negativo"),
        ((1e9, 0, 2), {}, "0 devices", "0 dispositivos"),
        (
            (1e9, 2.5, 2),
            {},
            "n_devices must be an int: 2.5 devices do not exist",
            "n_devices debe ser un int: no existen 2,5 dispositivos",
        ),
        ((1e9, 8, 4), {}, "there is no stage 4: the stages are 0 to 3", "no hay etapa 4: las etapas van de 0 a 3"),
        ((1e9, 8, 2), {"recipe_name": "fp8"}, "there is no recipe 'fp8'", "no existe la receta 'fp8'"),
        (
            (1e9, 8, 2),
            {"offload_params": True},
            "offload_params needs stage 3, the only one that shards the weights",
            "offload_params requiere la etapa 3, la única que fragmenta los pesos",
        ),
    ]:
        call = f"device_memory({', '.join([*map(num, args), *(f'{k}={v!r}' for k, v in kwargs.items())])})"
        refuses(call, partial(lab02.device_memory, *args, **kwargs), why, why_es)


# --- Exercise 2.2: the ZeRO-2 step in the simulator --------------------------------------------

SPEC = mlp.MLPSpec((12, 24, 20, 6))  # units of 312, 500, 126 elements: padding at N = 3 and 4


@pytest.fixture(scope="module")
def stage0():
    return {
        (n, r): simulate.simulate(0, n, SPEC, steps=4, recipe_name=r, rows=24)
        for n in (2, 3, 4)
        for r in ("fp32", "mixed")
    }


@pytest.mark.exercise("2.2")
@pytest.mark.points(3)
@pytest.mark.parametrize("recipe_name", ["fp32", "mixed"])
def test_zero2_ends_with_ddps_weights_bit_for_bit(lab02, stage0, recipe_name):
    for n in (2, 3, 4):
        ours = simulate.simulate(2, n, SPEC, steps=4, recipe_name=recipe_name, rows=24, step_fn=lab02.zero2_step)
        assert ours.workers_agree, say(
            f"ZeRO-2 on {n} workers ({recipe_name}): after 4 steps the workers hold different weights: all-gather "
            "every unit's updated chunks, so that every worker holds all the weights",
            f"ZeRO-2 en {n} procesos de trabajo ({recipe_name}): tras 4 pasos los procesos tienen pesos distintos: haz "
            "all-gather de los trozos actualizados de cada unidad, para que cada proceso tenga todos los pesos",
        )
        for u, (a, b) in enumerate(zip(stage0[(n, recipe_name)].weights, ours.weights)):
            assert np.array_equal(a, b), say(
                f"ZeRO-2 on {n} workers ({recipe_name}), unit {u}: after 4 steps the weights differ from DDP's "
                f"({difference(a, b)}); expected the same bits: ZeRO-2 moves the state, not the arithmetic",
                f"ZeRO-2 en {n} procesos de trabajo ({recipe_name}), unidad {u}: tras 4 pasos los pesos difieren de "
                "los de "
                f"DDP ({difference(a, b, 'es')}); se esperan los mismos bits: ZeRO-2 cambia dónde vive el estado, "
                "no la aritmética",
            )


def difference(a: np.ndarray, b: np.ndarray, lang: str = "en") -> str:
    """How two arrays differ, in a few words."""
    if a.shape != b.shape:
        return f"shape {b.shape} vs {a.shape}" if lang == "en" else f"forma {b.shape} frente a {a.shape}"
    return f"max |diff| {np.abs(a - b).max():.3g}" if lang == "en" else f"máx. |dif| {np.abs(a - b).max():.3g}"


@pytest.mark.exercise("2.2")
@pytest.mark.points(2)
def test_zero2_holds_what_the_model_predicts(lab02):
    for n in (2, 3, 4):
        res = simulate.simulate(2, n, SPEC, steps=2, rows=24, step_fn=lab02.zero2_step)
        padded = [comm.padded(u, n) for u in SPEC.unit_sizes]
        expected = memory.device_memory(sum(padded), n, 2, "fp32", largest_layer=max(padded)).device
        peak = res.peak_model_state
        assert peak == [expected] * n, say(
            f"ZeRO-2 on {n} workers (fp32): model state peaks at {per_worker(peak)} bytes per worker, expected "
            f"{num(expected)} on every worker: the weights whole, the gradient and Adam shards, and one unit's whole "
            "gradient (dropped after its reduce-scatter)",
            f"ZeRO-2 en {n} procesos de trabajo (fp32): los estados del modelo llegan a {per_worker(peak)} bytes por "
            f"proceso, se esperan {num(expected)} en cada uno: los pesos enteros, los fragmentos del gradiente y "
            "de Adam, y el gradiente entero de una unidad (que se suelta tras su reduce-scatter)",
        )


@pytest.mark.exercise("2.2")
@pytest.mark.points(1)
def test_zero2_sends_what_the_model_predicts(lab02):
    for n in (2, 3, 4):
        res = simulate.simulate(2, n, SPEC, steps=2, rows=24, step_fn=lab02.zero2_step)
        expected = sum(c.bytes_sent for c in comm.unit_collectives(SPEC.unit_sizes, 2, n, 4, 4))
        sent = res.bytes_sent_per_step
        assert sent == [expected] * n, say(
            f"ZeRO-2 on {n} workers (fp32): {per_worker(sent)} bytes sent per worker per step, expected "
            f"{num(expected)}: per unit, one reduce-scatter of the gradient and one all-gather of the weights, each "
            "(N-1)/N of the padded unit",
            f"ZeRO-2 en {n} procesos de trabajo (fp32): {per_worker(sent)} bytes enviados por proceso y paso, se "
            "esperan "
            f"{num(expected)}: por unidad, un reduce-scatter del gradiente y un all-gather de los pesos, cada uno "
            "(N-1)/N de la unidad con relleno",
        )


# --- Exercise 2.3: communication ---------------------------------------------------------------


@pytest.mark.exercise("2.3")
@pytest.mark.points(2)
def test_communication_per_stage(lab02):
    psi, n = 7.5e9, 64
    one = (n - 1) / n
    for stage, passes, what, what_es in (
        (0, 2, "one all-reduce of the gradients (2 passes)", "un all-reduce de los gradientes (2 pasadas)"),
        (
            1,
            2,
            "a reduce-scatter of the gradients, an all-gather of the weights",
            "un reduce-scatter de los gradientes y un all-gather de los pesos",
        ),
        (
            2,
            2,
            "a reduce-scatter of the gradients, an all-gather of the weights",
            "un reduce-scatter de los gradientes y un all-gather de los pesos",
        ),
        (
            3,
            3,
            "a reduce-scatter, and an all-gather before forward and again before backward",
            "un reduce-scatter, y un all-gather antes de la pasada hacia delante y otro antes de la hacia atrás",
        ),
    ):
        got = comm.traffic(lab02.step_collectives(psi, stage, n)).total
        assert got == pytest.approx(passes * one * psi * 2), traffic_message(
            f"step_collectives(7.5e9, {stage}, 64)",
            got,
            passes * one * psi * 2,
            f"{passes} x (N-1)/N x Ψ x 2 bytes",
            what,
            what_es,
        )
    got = comm.traffic(lab02.step_collectives(psi, 3, n, reshard_after_forward=False)).total
    assert got == pytest.approx(2 * one * psi * 2), traffic_message(
        "step_collectives(7.5e9, 3, 64, reshard_after_forward=False)",
        got,
        2 * one * psi * 2,
        "2 x (N-1)/N x Ψ x 2 bytes",
        "the weights stay gathered from forward to backward: one all-gather (count=1)",
        "los pesos siguen reunidos de la pasada hacia delante a la hacia atrás: un solo all-gather (count=1)",
    )
    got = comm.traffic(lab02.step_collectives(psi, 0, n, recipe_name="fp32")).total
    assert got == pytest.approx(2 * one * psi * 4), traffic_message(
        "step_collectives(7.5e9, 0, 64, recipe_name='fp32')",
        got,
        2 * one * psi * 4,
        "2 x (N-1)/N x Ψ x 4 bytes",
        "fp32 gradients travel at 4 bytes each (recipe.reduce_bytes)",
        "los gradientes fp32 viajan a 4 bytes cada uno (recipe.reduce_bytes)",
    )
    # the paper's volumes (Section 7): 2Ψ, 2Ψ, 2Ψ, 3Ψ elements, ring factor taken as 1
    for stage, volume in zip(za.STAGES, (2, 2, 2, 3)):
        elements = sum(c.count * za.RING_PASSES[c.op] * c.elements for c in lab02.step_collectives(psi, stage, n))
        assert elements == volume * psi, say(
            f"stage {stage}: your collectives move {num(elements)} elements per step (count x passes x elements, "
            f"ring factor taken as 1), the ZeRO paper's Section 7 says {volume}Ψ = {num(volume * psi)}",
            f"etapa {stage}: tus colectivas mueven {num(elements)} elementos por paso (count x pasadas x elementos, "
            f"con factor del anillo 1), la sección 7 del artículo de ZeRO dice {volume}Ψ = {num(volume * psi)}",
        )


def traffic_message(call: str, got: float, expected: float, formula: str, why: str, why_es: str) -> str:
    return say(
        f"{call}: {num(got)} bytes sent per device per step, expected {formula} = {num(expected)}: {why}",
        f"{call}: {num(got)} bytes enviados por dispositivo y paso, se espera {formula} = {num(expected)}: {why_es}",
    )


@pytest.mark.exercise("2.3")
@pytest.mark.points(2)
def test_hsdp_traffic_inside_and_across(lab02):
    psi, s, r = 1e9, 8, 4
    t = comm.traffic(lab02.step_collectives(psi, 3, s, r))
    where = say(
        "HSDP, stage 3, Ψ = 1e9, shard groups of S = 8 devices, R = 4 replicas",
        "HSDP, etapa 3, Ψ = 1e9, grupos de fragmentación de S = 8 dispositivos, R = 4 réplicas",
    )
    assert t.inside == pytest.approx(7 / 8 * psi * (2 + 2 * 2)), say(
        f"{where}: {num(t.inside)} bytes sent inside the shard group, expected (S-1)/S x Ψ x (2 + 2 x 2) = "
        f"{num(7 / 8 * psi * 6)}: a reduce-scatter of the gradients and two all-gathers of the weights, in the shard "
        "group (group 'shard', of S devices)",
        f"{where}: {num(t.inside)} bytes enviados dentro del grupo de fragmentación, se espera (S-1)/S x Ψ x "
        f"(2 + 2 x 2) = {num(7 / 8 * psi * 6)}: un reduce-scatter de los gradientes y dos all-gather de los pesos, "
        "en el grupo 'shard', de S dispositivos",
    )
    assert t.across == pytest.approx(2 * 3 / 4 * psi / 8 * 2), say(
        f"{where}: {num(t.across)} bytes sent across replicas, expected 2(R-1)/R x Ψ/S x 2 = "
        f"{num(2 * 3 / 4 * psi / 8 * 2)}: each rank all-reduces only its gradient shard (Ψ/S elements) with the R "
        "replicas that hold the same shard (group 'replica')",
        f"{where}: {num(t.across)} bytes enviados entre réplicas, se espera 2(R-1)/R x Ψ/S x 2 = "
        f"{num(2 * 3 / 4 * psi / 8 * 2)}: cada rank hace all-reduce solo de su fragmento del gradiente (Ψ/S "
        "elementos) con las R réplicas que tienen el mismo fragmento (grupo 'replica')",
    )
    groups = sorted({c.group for c in lab02.step_collectives(psi, 3, s, r)})
    assert groups == ["replica", "shard"], say(
        f"{where}: your collectives' groups are {groups}, expected ['replica', 'shard']: with replicas the weights "
        "and the gradient shards travel in the shard group ('shard', S devices), the shards' all-reduce across the "
        "replicas ('replica'); 'data' is the group of every device, which HSDP never joins whole",
        f"{where}: los grupos de tus colectivas son {groups}, se espera ['replica', 'shard']: con réplicas los pesos "
        "y los fragmentos del gradiente viajan en el grupo de fragmentación ('shard', S dispositivos), y el "
        "all-reduce de los fragmentos entre las réplicas ('replica'); 'data' es el grupo de todos los "
        "dispositivos, que HSDP nunca forma entero",
    )
    plain = sorted({c.group for c in lab02.step_collectives(psi, 3, 32)})
    assert plain == ["data"], say(
        f"step_collectives(1e9, 3, 32), plain ZeRO-3: your groups are {plain}, expected ['data']: with one replica "
        "the shard group is every device",
        f"step_collectives(1e9, 3, 32), ZeRO-3 sin réplicas: tus grupos son {plain}, se espera ['data']: con una "
        "sola réplica el grupo de fragmentación son todos los dispositivos",
    )
    across = comm.traffic(lab02.step_collectives(psi, 3, 32)).across
    assert across == 0, say(
        f"step_collectives(1e9, 3, 32), plain ZeRO-3 with replicas=1: {num(across)} bytes sent across replicas, "
        "expected 0: with one replica there is no 'replica' group",
        f"step_collectives(1e9, 3, 32), ZeRO-3 sin réplicas (replicas=1): {num(across)} bytes enviados entre "
        "réplicas, se espera 0: con una sola réplica no hay grupo 'replica'",
    )
    refuses(
        "step_collectives(1e9, 0, 8, 4)",
        lambda: lab02.step_collectives(psi, 0, s, r),
        "stage 0 (DDP) does not shard, so it cannot have replicas: replicas must be 1",
        "la etapa 0 (DDP) no fragmenta, así que no puede tener réplicas: replicas debe ser 1",
    )
    for args, why, why_es in [
        ((0, 3, 8), "a model of 0 parameters", "un modelo de 0 parámetros"),
        ((-1e9, 3, 8), "a negative parameter count", "un número de parámetros negativo"),
        ((1e9, 4, 8), "there is no stage 4: the stages are 0 to 3", "no hay etapa 4: las etapas van de 0 a 3"),
        ((1e9, 3, 0), "a shard group of 0 devices", "un grupo de fragmentación de 0 dispositivos"),
        (
            (1e9, 3, 2.5),
            "2.5 devices do not exist: a degree is an int",
            "no existen 2,5 dispositivos: un grado es un int",
        ),
        ((1e9, 3, 8, 0), "0 replicas", "0 réplicas"),
    ]:
        call = f"step_collectives({', '.join(map(num, args))})"
        refuses(
            call,
            partial(lab02.step_collectives, *args),
            f"bad values are refused: {why}",
            f"los valores imposibles se rechazan: {why_es}",
        )


# --- Exercises 2.4 and 2.5: a real ZeRO-1 optimizer that follows torch.optim's rules ---------------
# tests/zero1_worker.py runs every scenario on groups of 2 and 3 gloo ranks (one launch): ZeRO-1 on
# a model with a frozen parameter, tied weights, a layer used only in some steps and a parameter
# used on one rank only, against the same plain optimizer (AdamW, SGD with momentum) in one process
# that accumulates the same micro-batches.
ZERO1_TOLERANCE = 1e-5  # 3 ranks: the 3-way sum is grouped differently on the ring than in one
#                         process; measured <= 4.8e-7 after 10 steps (a few float32 steps of a
#                         weight near 1, 1.2e-7 each); 2 ranks must agree bit for bit.


def scenario(zero1: Launch, size: int, optimizer: str, mode: str, exercise: str) -> list[dict]:
    """Every working rank's result of one scenario (run for ``exercise``'s tests)."""
    return [ranks.scenario(zero1, f"zero1_{size}_{optimizer}_{mode}@{exercise}", rank) for rank in range(size)]


def agrees(result: dict, size: int) -> bool:
    if size == 2:
        return result["bit_identical"] and result["max_state_diff"] == 0.0
    return result["max_param_diff"] <= ZERO1_TOLERANCE and result["max_state_diff"] <= ZERO1_TOLERANCE


@pytest.mark.exercise("2.4")
@pytest.mark.points(1)
def test_trainable_parameters_leave_out_frozen_and_repeat_none(lab02):
    from tests.zero1_worker import Toy

    model = Toy()
    got = lab02.trainable_parameters(list(model.parameters()) + [model.head.weight, model.hidden.bias])
    expected = [p for p in model.parameters() if p.requires_grad]
    assert [id(p) for p in got] == [id(p) for p in expected], say(
        "trainable_parameters(model.parameters() + [head.weight, hidden.bias]) returned "
        f"{parameter_names(model, got)}, expected {parameter_names(model, expected)}: the parameters that train, "
        "each once (compare with id()), in the order given; no frozen one",
        "trainable_parameters(model.parameters() + [head.weight, hidden.bias]) devolvió "
        f"{parameter_names(model, got)}, se espera {parameter_names(model, expected)}: los parámetros que "
        "entrenan, cada uno una vez (compara con id()), en el orden dado; ninguno congelado",
    )


def parameter_names(model, params) -> str:
    """The names of ``params`` in ``model`` (tied weights by their first name), on one line."""
    names = {id(p): name for name, p in reversed(list(model.named_parameters(remove_duplicate=False)))}
    return "[" + ", ".join(names.get(id(p), type(p).__name__) for p in params) + "]"


@pytest.mark.exercise("2.4")
@pytest.mark.points(1)
def test_zero1_frozen_parameters_cost_nothing_and_never_move(zero1):
    for size in (2, 3):
        for optimizer in ("adamw", "sgd"):
            for rank, r in enumerate(scenario(zero1, size, optimizer, "all", "2.4")):
                assert r["frozen"] == [2.0, 2.0], say(
                    f"{size} ranks, {optimizer}, rank {rank}: the frozen parameter (requires_grad=False) moved from "
                    f"[2.0, 2.0] to {r['frozen']} in 10 steps; expected it unchanged: keep it out of the optimizer",
                    f"{size} ranks, {optimizer}, rank {rank}: el parámetro congelado (requires_grad=False) pasó de "
                    f"[2.0, 2.0] a {r['frozen']} en 10 pasos; se espera que no cambie: déjalo fuera del optimizador",
                )
                assert not r["frozen_in_flat"] and r["flat_numel"] == r["trainable_numel"], say(
                    f"{size} ranks, {optimizer}, rank {rank}: the flat buffers hold {r['flat_numel']} numbers, the "
                    f"trainable parameters {r['trainable_numel']}"
                    + (" (the frozen parameter is in them)" if r["frozen_in_flat"] else "")
                    + ": leave frozen parameters out, there they cost gradient memory",
                    f"{size} ranks, {optimizer}, rank {rank}: los búferes planos tienen {r['flat_numel']} números, los "
                    f"parámetros entrenables {r['trainable_numel']}"
                    + (" (el parámetro congelado está en ellos)" if r["frozen_in_flat"] else "")
                    + ": deja fuera los parámetros congelados, ahí cuestan memoria de gradientes",
                )


@pytest.mark.exercise("2.5")
@pytest.mark.points(2)
def test_zero1_equals_plain_optimizers(zero1):
    for size in (2, 3):
        for optimizer in ("adamw", "sgd"):
            for rank, r in enumerate(scenario(zero1, size, optimizer, "all", "2.5")):
                where = f"{size} ranks, {optimizer}, rank {rank}"
                assert not r["closure_problems"], closure_problem(where, r["closure_problems"][0])
                assert not r["settings_problems"], say(
                    f"{where}: at step {r['settings_problems'][0]['step']} the learning rate was "
                    f"{r['settings_problems'][0]['lr']:.6g} in self.param_groups and {r['settings_problems'][0]['inner_lr']}"
                    " in the inner optimizer's groups: give each inner group every setting of its param_groups twin "
                    "but 'params', at every step (a learning-rate schedule changes them)",
                    f"{where}: en el paso {r['settings_problems'][0]['step']} la tasa de aprendizaje era "
                    f"{r['settings_problems'][0]['lr']:.6g} en self.param_groups y {r['settings_problems'][0]['inner_lr']}"
                    " en los grupos del optimizador interno: da a cada grupo interno todos los ajustes de su gemelo de "
                    "param_groups salvo 'params', en cada paso (una programación de la tasa de aprendizaje los cambia)",
                )
                assert agrees(r, size), say(
                    f"{size} ranks, {optimizer}, rank {rank}: after 10 steps the weights differ from the plain "
                    f"optimizer's in one process by {r['max_param_diff']:.2e} and the optimizer state by "
                    f"{r['max_state_diff']:.2e} ({expected_agreement(size)})",
                    f"{size} ranks, {optimizer}, rank {rank}: tras 10 pasos los pesos difieren de los del optimizador "
                    f"normal en un proceso en {r['max_param_diff']:.2e} y el estado del optimizador en "
                    f"{r['max_state_diff']:.2e} ({expected_agreement(size)})",
                )


def closure_problem(where: str, problem: dict) -> str:
    """What step() did with (or without) a closure at one step, against torch.optim's rule."""
    step, enabled, returned = problem["step"], problem["grad_enabled"], problem["returned"]
    if not problem["closure"]:
        return say(
            f"{where}: step() without a closure returned {returned} at step {step}: expected None",
            f"{where}: step() sin closure devolvió {returned} en el paso {step}: se espera None",
        )
    called = say(
        "never called" if not enabled else f"called {len(enabled)} time(s), grad mode {enabled}",
        "nunca llamada" if not enabled else f"llamada {len(enabled)} vez/veces, modo de gradiente {enabled}",
    )
    return say(
        f"{where}: step(closure) at step {step}: the closure was {called} and step returned {returned}; expected "
        "the closure called once under torch.enable_grad() (step runs under no_grad) and its loss returned",
        f"{where}: step(closure) en el paso {step}: la closure fue {called} y step devolvió {returned}; se espera "
        "la closure llamada una vez bajo torch.enable_grad() (step corre bajo no_grad) y su pérdida devuelta",
    )


def expected_agreement(size: int) -> str:
    if size == 2:
        return say("expected: the same bits", "se esperan los mismos bits")
    return say(f"expected <= {ZERO1_TOLERANCE:g}", f"se espera <= {ZERO1_TOLERANCE:g}")


@pytest.mark.exercise("2.5")
@pytest.mark.points(2)
def test_zero1_leaves_gradientless_parameters_alone(zero1):
    for size in (2, 3):
        for optimizer in ("adamw", "sgd"):
            for rank, r in enumerate(scenario(zero1, size, optimizer, "some", "2.5")):
                assert r["untouched_checked"] > 0, say(
                    f"{size} ranks, {optimizer}, rank {rank}: the scenario checked no parameter left without gradient "
                    "on every rank, so this test proved nothing (a fault of tests/zero1_worker.py, not of your code)",
                    f"{size} ranks, {optimizer}, rank {rank}: el escenario no comprobó ningún parámetro sin gradiente "
                    "en todos los ranks, así que esta prueba no demostró nada (un fallo de tests/zero1_worker.py, no "
                    "de tu código)",
                )
                assert not r["touched_while_unused"], say(
                    f"{size} ranks, {optimizer}, rank {rank}: parameters that no rank gave a gradient moved: "
                    f"{', '.join(r['touched_while_unused'][:3])}; expected them unchanged, as torch.optim skips a "
                    "parameter whose .grad is None (skip the pieces whose usage mark is 0)",
                    f"{size} ranks, {optimizer}, rank {rank}: se movieron parámetros a los que ningún rank dio "
                    "gradiente: "
                    f"{', '.join(t.replace(' at step ', ' en el paso ') for t in r['touched_while_unused'][:3])}; "
                    "se espera que no cambien, como torch.optim "
                    "se salta un parámetro cuyo .grad es None (sáltate las piezas cuya marca de uso es 0)",
                )
                assert agrees(r, size), say(
                    f"{size} ranks, {optimizer}, rank {rank}: after 10 steps, some without gradient for some "
                    f"parameters, the weights differ from one process by {r['max_param_diff']:.2e} and the optimizer "
                    f"state by {r['max_state_diff']:.2e} ({expected_agreement(size)})",
                    f"{size} ranks, {optimizer}, rank {rank}: tras 10 pasos, algunos sin gradiente para algunos "
                    f"parámetros, los pesos difieren de un proceso en {r['max_param_diff']:.2e} y el estado del "
                    f"optimizador en {r['max_state_diff']:.2e} ({expected_agreement(size)})",
                )


@pytest.mark.exercise("2.5")
@pytest.mark.points(1)
def test_zero1_sends_the_ring_bytes(zero1):
    for size in (2, 3):
        for rank, r in enumerate(scenario(zero1, size, "adamw", "some", "2.5")):
            assert not r["reduced_left_true"], say(
                f"{size} ranks, rank {rank}: self._reduced was still True after step() at steps "
                f"{r['reduced_left_true']}: set it back to False, so that the next step reduces its own gradients",
                f"{size} ranks, rank {rank}: self._reduced seguía en True tras step() en los pasos "
                f"{r['reduced_left_true']}: vuelve a ponerlo en False, para que el paso siguiente reduzca sus propios "
                "gradientes",
            )
            assert set(r["sent"]) == {r["expected_sent"]}, say(
                f"{size} ranks, rank {rank}: sent {per_worker(sorted(set(r['sent'])))} bytes per step, expected "
                f"{r['expected_sent']}: the usage marks all-reduced, each flat gradient reduce-scattered, the weights "
                "all-gathered, all on Lab 01's ring",
                f"{size} ranks, rank {rank}: envió {per_worker(sorted(set(r['sent'])))} bytes por paso, se esperan "
                f"{r['expected_sent']}: all-reduce de las marcas de uso, reduce-scatter de cada gradiente plano y "
                "all-gather de los pesos, todo en el anillo del laboratorio 01",
            )


# --- All together: your simulator held to your formulas, and your ZeRO-1 on the hard model ------


@pytest.mark.exercise("all")
@pytest.mark.points(2)
def test_all_together_your_zero2_obeys_your_formulas_and_your_zero1_trains(lab02, zero1):
    """All of your Lab 02 code at once: the ZeRO-2 step you simulate (2.2) holds exactly the memory
    your device_memory (2.1) predicts and sends exactly the bytes your step_collectives (2.3)
    lists; your ZeRO-1 (2.4 and 2.5) on 3 ranks matches one process."""
    for n in (2, 3, 4):
        res = simulate.simulate(2, n, SPEC, steps=2, rows=24, step_fn=lab02.zero2_step)
        padded = [comm.padded(u, n) for u in SPEC.unit_sizes]
        memory_now = lab02.device_memory(sum(padded), n, 2, "fp32", largest_layer=max(padded)).device
        sent = sum(c.bytes_sent for c in lab02.step_collectives(sum(padded), 2, n, recipe_name="fp32"))
        assert res.peak_model_state == [memory_now] * n, say(
            f"ZeRO-2 on {n} workers (fp32): your zero2_step's model state peaks at {per_worker(res.peak_model_state)} "
            f"bytes per worker, your device_memory(Ψ, {n}, 2, 'fp32', largest_layer) says {num(memory_now)}: one of "
            "them is wrong (make grade EX=2.1 and EX=2.2 tell which)",
            f"ZeRO-2 en {n} procesos de trabajo (fp32): los estados del modelo de tu zero2_step llegan a "
            f"{per_worker(res.peak_model_state)} bytes por proceso, tu device_memory(Ψ, {n}, 2, 'fp32', "
            f"largest_layer) dice {num(memory_now)}: uno de los dos falla (make grade EX=2.1 y EX=2.2 dicen cuál)",
        )
        assert res.bytes_sent_per_step == [sent] * n, say(
            f"ZeRO-2 on {n} workers (fp32): your zero2_step sends {per_worker(res.bytes_sent_per_step)} bytes per "
            f"worker per step, your step_collectives(Ψ, 2, {n}, recipe_name='fp32') add up to {num(sent)}: one of "
            "them is wrong (make grade EX=2.2 and EX=2.3 tell which)",
            f"ZeRO-2 en {n} procesos de trabajo (fp32): tu zero2_step envía {per_worker(res.bytes_sent_per_step)} "
            f"bytes por proceso y paso, tus step_collectives(Ψ, 2, {n}, recipe_name='fp32') suman {num(sent)}: uno "
            "de los dos falla (make grade EX=2.2 y EX=2.3 dicen cuál)",
        )
    for r in scenario(zero1, 3, "adamw", "some", "all"):
        assert agrees(r, 3), say(
            f"3 ranks, AdamW: your ZeRO-1 ends {r['max_param_diff']:.2e} from one process (weights), "
            f"{r['max_state_diff']:.2e} (optimizer state); expected <= {ZERO1_TOLERANCE:g}",
            f"3 ranks, AdamW: tu ZeRO-1 acaba a {r['max_param_diff']:.2e} de un proceso (pesos), "
            f"{r['max_state_diff']:.2e} (estado del optimizador); se espera <= {ZERO1_TOLERANCE:g}",
        )
