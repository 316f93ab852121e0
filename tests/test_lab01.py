"""Lab 01 · DDP from scratch: the graded checks.

The multi-process scenarios run once per session in a single launch (the ``ranks`` fixture of
tests/ranks.py, tests/dist_worker.py): 4 ranks for the ring, 2 for the DDP; each test below reads
what the ranks measured, in the scenario run for its exercise (``ddp_toy@1.3``: only Exercise 1.3
the learner's). The bucket assignment is a plain function and is tested in this process. The
course's own checks of the reference are in tests/test_lab01_reference.py.

    make grade EX=1.3          # or: .venv/bin/python -m minigpt.grader --exercise 1.3
"""

from __future__ import annotations

import pytest
from torch import nn

from minigpt import impl
from tests.limits import limit
from tests.ranks import Launch, scenario
from tests.words import say

pytestmark = [pytest.mark.lab("01"), pytest.mark.timeout(180)]


def both(ranks: Launch, name: str) -> list[dict]:
    return [scenario(ranks, name, r) for r in range(2)]


# ----------------------------------------------------------------------------------------------
# Exercise 1.1: the ring all-reduce


def ring_cases(ranks, size):
    return [(r, c) for r in range(size) for c in scenario(ranks, f"ring_{size}", r)["cases"]]


@pytest.mark.exercise("1.1")
@pytest.mark.points(1)
@pytest.mark.parametrize("size", [2, 3, 4])
def test_ring_sum_matches_torch(ranks, size):
    for rank, case in ring_cases(ranks, size):
        if case["op"] != "sum":
            continue
        where = f"{say('world size', 'tamaño del mundo')} {size}, rank {rank}, {case['length']} floats"
        assert case["returned_input"], say(
            f"{where}: ring_all_reduce returned another tensor; expected the tensor it was given, reduced in place",
            f"{where}: ring_all_reduce devolvió otro tensor; se espera el mismo que recibió, reducido en su sitio",
        )
        assert case["integer_exact"], say(
            f"{where}: with integer values the sum differs from dist.all_reduce's (integers add exactly): a chunk is "
            "missed or added twice",
            f"{where}: con valores enteros la suma difiere de la de dist.all_reduce (los enteros se suman sin error): "
            "un trozo falta o se suma dos veces",
        )
        assert case["max_error"] <= 1e-5, say(
            f"{where}: differs from dist.all_reduce by {case['max_error']:.2e} (expected <= 1e-5)",
            f"{where}: difiere de dist.all_reduce en {case['max_error']:.2e} (se espera <= 1e-5)",
        )


@pytest.mark.exercise("1.1")
@pytest.mark.points(1)
def test_ring_average_and_a_world_of_one(ranks):
    for size in (1, 2, 3, 4):
        for rank, case in ring_cases(ranks, size):
            assert case["max_error"] <= 1e-5 and case["integer_exact"], ring_case_problem(size, rank, case)


def ring_case_problem(size: int, rank: int, case: dict) -> str:
    """Why one case of the ring is wrong: its error against dist.all_reduce, or an inexact integer sum."""
    where = say(
        f"world size {size}, rank {rank}, op {case['op']!r}, {case['length']} floats",
        f"tamaño del mundo {size}, rank {rank}, op {case['op']!r}, {case['length']} floats",
    )
    target = say(
        "dist.all_reduce's sum" + (" divided by the world size" if case["op"] == "avg" else ""),
        "la suma de dist.all_reduce" + (" dividida por el tamaño del mundo" if case["op"] == "avg" else ""),
    )
    alone = (
        say(" (a world of one: the tensor comes back as it is)", " (un mundo de uno: el tensor vuelve tal cual)")
        if size == 1
        else ""
    )
    if not case["max_error"] <= 1e-5:
        return say(
            f"{where}: differs from {target} by {case['max_error']:.2e} (expected <= 1e-5){alone}",
            f"{where}: difiere de {target} en {case['max_error']:.2e} (se espera <= 1e-5){alone}",
        )
    return say(
        f"{where}: with integer values the result is not exactly {target}{alone}",
        f"{where}: con valores enteros el resultado no es exactamente {target}{alone}",
    )


@pytest.mark.exercise("1.1")
@pytest.mark.points(2)
def test_ring_sends_chunks_not_the_whole_tensor(ranks):
    """Bytes sent per rank: 2(N-1)/N of the tensor (exactly, up to the uneven chunks). A ring
    that passes whole tensors costs the same for 2 ranks and is caught from 3 on."""
    cases = [(size, rank, case) for size in (2, 3, 4) for rank, case in ring_cases(ranks, size)]
    wrong = [(size, rank, case) for size, rank, case in cases if case["bytes_sent"] != case["bytes_expected"]]
    # the most telling case: the longest tensor (a 1-float tensor says little), then the smallest world
    assert not wrong, telling_byte_count(wrong, len(cases))


def telling_byte_count(wrong: list[tuple[int, int, dict]], total: int) -> str:
    """The most telling wrong byte count: the longest tensor (a 1-float tensor says little), then the
    smallest world and rank."""
    size, rank, case = max(wrong, key=lambda w: (w[2]["length"], -w[0], -w[1]))
    length = case["length"]
    return say(
        f"world size {size}, rank {rank}, {length} floats ({4 * length} bytes): sent {case['bytes_sent']} bytes, a "
        f"ring sends {case['bytes_expected']} (2(N-1)/N x the tensor = {case['bytes_formula']:.0f}, up to the uneven "
        f"chunks): pass one chunk per step, not the whole tensor ({len(wrong)} of {total} cases wrong)",
        f"tamaño del mundo {size}, rank {rank}, {length} floats ({4 * length} bytes): envió {case['bytes_sent']} "
        f"bytes, un anillo envía {case['bytes_expected']} (2(N-1)/N x el tensor = {case['bytes_formula']:.0f}, salvo "
        f"por los trozos desiguales): pasa un trozo en cada paso, no el tensor entero ({len(wrong)} de {total} casos "
        "mal)",
    )


@pytest.mark.exercise("1.1")
@pytest.mark.points(1)
def test_ring_leaves_every_rank_with_the_same_bits(ranks):
    for size in (2, 3, 4):
        cases = [scenario(ranks, f"ring_{size}", r)["cases"] for r in range(size)]
        digests = [[c["digest"] for c in rank_cases] for rank_cases in cases]
        assert all(d == digests[0] for d in digests), different_bits(size, cases)


def different_bits(size: int, cases: list[list[dict]]) -> str:
    """The first rank whose result differs from rank 0's, and in which case."""
    rank = next(r for r in range(1, size) if [c["digest"] for c in cases[r]] != [c["digest"] for c in cases[0]])
    case = next((a for a, b in zip(cases[0], cases[rank]) if a["digest"] != b["digest"]), cases[0][0])
    return say(
        f"world size {size}: ranks 0 and {rank} hold different bits after the all-reduce ({case['length']} floats, "
        f"op {case['op']!r}: their SHA-1 digests differ): each chunk must be summed on one rank only, then passed on "
        "unchanged, so that every rank ends with the same bits",
        f"tamaño del mundo {size}: los ranks 0 y {rank} tienen bits distintos tras el all-reduce ({case['length']} "
        f"floats, op {case['op']!r}: sus resúmenes SHA-1 difieren): cada trozo debe sumarse en un solo rank y luego "
        "pasarse sin cambios, para que todos los ranks acaben con los mismos bits",
    )


@pytest.mark.exercise("1.1")
@pytest.mark.points(1)
def test_ring_rejects_an_unknown_op(ranks):
    result = scenario(ranks, "ring_bad_op", 0)
    assert result["raised"] and "max" in result["message"], (
        say(
            f"ring_all_reduce(t, 'max', group) raised ValueError({result['message']!r}): right, but the message must "
            "name the op it refuses, 'max'",
            f"ring_all_reduce(t, 'max', group) lanzó ValueError({result['message']!r}): bien, pero el mensaje debe "
            "nombrar la op que rechaza, 'max'",
        )
        if result["raised"]
        else say(
            "ring_all_reduce(t, 'max', group) returned without raising: only 'sum' and 'avg' exist, any other op "
            "must raise a ValueError that names it",
            "ring_all_reduce(t, 'max', group) volvió sin lanzar nada: solo existen 'sum' y 'avg', cualquier otra op "
            "debe lanzar un ValueError que la nombre",
        )
    )


# ----------------------------------------------------------------------------------------------
# Exercise 1.2: buckets (in this process)


@pytest.fixture
def assign_buckets(impl_name):
    return impl.load("lab01_ddp", "assign_buckets", impl_name)


def names(buckets) -> list[list[str]]:
    return [[name for name, _ in bucket] for bucket in buckets]


def stack() -> nn.Sequential:
    # parameter bytes in registration order: 0.weight 64, 0.bias 16, 1.weight 64, 1.bias 16, 2.weight 64, 2.bias 16
    return nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4))


def shown(layout: list[list[str]]) -> str:
    """A bucket layout on one line: ``[2.bias 2.weight | 1.bias 1.weight]``."""
    return "[" + " | ".join(" ".join(bucket) for bucket in layout) + "]"


def kinds(buckets) -> list[str]:
    """The types of what the buckets pair with the names."""
    return sorted({type(p).__name__ for bucket in buckets for _, p in bucket})


def stack_layout(cap: int, got: list[list[str]], expected: list[list[str]]) -> str:
    return say(
        f"assign_buckets(three Linear(4, 4), {cap} bytes): got {shown(got)}, expected {shown(expected)}: walk the "
        f"parameters in reverse (weights 64 bytes, biases 16) and close a bucket once it holds >= {cap} bytes",
        f"assign_buckets(tres Linear(4, 4), {cap} bytes): da {shown(got)}, se espera {shown(expected)}: recorre los "
        f"parámetros al revés (pesos de 64 bytes, sesgos de 16) y cierra un bucket cuando tenga >= {cap} bytes",
    )


@pytest.mark.exercise("1.2")
@pytest.mark.points(2)
def test_buckets_reverse_order_up_to_the_cap(assign_buckets):
    for cap, expected in [
        (80, [["2.bias", "2.weight"], ["1.bias", "1.weight"], ["0.bias", "0.weight"]]),
        (100, [["2.bias", "2.weight", "1.bias", "1.weight"], ["0.bias", "0.weight"]]),
        (10_000, [["2.bias", "2.weight", "1.bias", "1.weight", "0.bias", "0.weight"]]),
    ]:
        got = names(assign_buckets(stack(), cap))
        assert got == expected, stack_layout(cap, got, expected)
    buckets = assign_buckets(stack(), 80)
    assert all(isinstance(p, nn.Parameter) for bucket in buckets for _, p in bucket), say(
        "assign_buckets must pair each name with the nn.Parameter itself (the hook and .grad live on it); got "
        f"{kinds(buckets)}",
        f"assign_buckets debe emparejar cada nombre con el propio nn.Parameter (el hook y .grad están en él); da "
        f"{kinds(buckets)}",
    )


@pytest.mark.exercise("1.2")
@pytest.mark.points(1)
def test_buckets_close_when_they_reach_the_cap(assign_buckets):
    """A bias (16 bytes) below a 20-byte cap waits for the weight after it: no message of 16 bytes.
    And a parameter of another dtype or on another device closes the bucket (a bucket is one flat
    buffer)."""
    for cap, expected in [
        (20, [["2.bias", "2.weight"], ["1.bias", "1.weight"], ["0.bias", "0.weight"]]),
        (10, [["2.bias"], ["2.weight"], ["1.bias"], ["1.weight"], ["0.bias"], ["0.weight"]]),
    ]:
        got = names(assign_buckets(stack(), cap))
        assert got == expected, stack_layout(cap, got, expected)
    # a bucket is one flat buffer: one dtype. A float64 layer in the middle closes the bucket before it.
    mixed = stack()
    mixed[1].double()
    got = names(assign_buckets(mixed, 10_000))
    expected = [["2.bias", "2.weight"], ["1.bias", "1.weight"], ["0.bias", "0.weight"]]
    assert got == expected, say(
        f"assign_buckets(three Linear(4, 4), the middle one float64, 10000 bytes): got {shown(got)}, expected "
        f"{shown(expected)}: a bucket is one flat buffer of one dtype on one device, so a parameter of another dtype "
        "closes the bucket before it and starts the next",
        f"assign_buckets(tres Linear(4, 4), el del medio float64, 10000 bytes): da {shown(got)}, se espera "
        f"{shown(expected)}: un bucket es un único búfer plano de un dtype en un dispositivo, así que un parámetro "
        "de otro dtype cierra el bucket anterior y empieza el siguiente",
    )
    # and one device: a layer on another device (PyTorch's "meta" device, which holds no data) does the same
    elsewhere = stack()
    elsewhere[1].to("meta")
    got = names(assign_buckets(elsewhere, 10_000))
    assert got == expected, say(
        f"assign_buckets(three Linear(4, 4), the middle one on the 'meta' device, 10000 bytes): got {shown(got)}, "
        f"expected {shown(expected)}: a bucket is one flat buffer on one device, so a parameter on another device "
        "closes the bucket before it and starts the next",
        f"assign_buckets(tres Linear(4, 4), el del medio en el dispositivo 'meta', 10000 bytes): da {shown(got)}, se "
        f"espera {shown(expected)}: un bucket es un único búfer plano en un dispositivo, así que un parámetro en otro "
        "dispositivo cierra el bucket anterior y empieza el siguiente",
    )


@pytest.mark.exercise("1.2")
@pytest.mark.points(2)
def test_buckets_skip_frozen_and_hold_tied_weights_once(assign_buckets):
    from tests.dist_worker import Toy  # embed.weight is head.weight; frozen.* do not train

    layout = names(assign_buckets(Toy(), 200))
    flat = [n for bucket in layout for n in bucket]
    frozen = [n for n in flat if n.startswith("frozen.")]
    assert not any(n.startswith("frozen.") for n in flat), say(
        f"assign_buckets(Toy(), 200) put the frozen parameters {frozen} in a bucket: they have no gradient "
        "(requires_grad=False), leave them out; got " + shown(layout),
        f"assign_buckets(Toy(), 200) puso los parámetros congelados {frozen} en un bucket: no tienen gradiente "
        "(requires_grad=False), déjalos fuera; da " + shown(layout),
    )
    assert flat.count("embed.weight = head.weight") == 1 and "head.weight" not in flat, say(
        "embed.weight and head.weight are one tensor (tied weights): expected it once, named "
        f"'embed.weight = head.weight' (its names joined by ' = '); got {shown(layout)}",
        "embed.weight y head.weight son un solo tensor (pesos atados): se espera una vez, con el nombre "
        f"'embed.weight = head.weight' (sus nombres unidos por ' = '); da {shown(layout)}",
    )
    expected = [["out.bias", "out.weight"], ["hidden.bias", "hidden.weight"], ["embed.weight = head.weight"]]
    assert layout == expected, say(
        f"assign_buckets(Toy(), 200): got {shown(layout)}, expected {shown(expected)}",
        f"assign_buckets(Toy(), 200): da {shown(layout)}, se espera {shown(expected)}",
    )


# ----------------------------------------------------------------------------------------------
# Exercise 1.3: the hook and the asynchronous launch


@pytest.mark.exercise("1.3")
@pytest.mark.points(2)
def test_ddp_gradients_are_the_average_over_ranks(ranks):
    for r, result in enumerate(both(ranks, "ddp_toy@1.3")):
        assert result["module_is_model"] and result["same_start_as_rank0"], (
            say(
                f"rank {r}: BucketedDDP(model).module is not the model it was given: keep the model itself, not a copy",
                f"rank {r}: BucketedDDP(model).module no es el modelo que recibió: guarda el propio modelo, no una "
                "copia",
            )
            if not result["module_is_model"]
            else say(
                f"rank {r}: after BucketedDDP(model) the weights differ from rank 0's (each rank starts from its own "
                "seed here): the constructor must broadcast rank 0's parameters",
                f"rank {r}: tras BucketedDDP(model) los pesos difieren de los del rank 0 (aquí cada rank empieza "
                "con su propia semilla): el constructor debe difundir (broadcast) los parámetros del rank 0",
            )
        )
        assert result["grad_error"] <= 1e-6, say(
            f"rank {r}: after one backward the gradients differ from the average over the 2 ranks by "
            f"{result['grad_error']:.2e} (expected <= 1e-6)",
            f"rank {r}: tras una pasada hacia atrás los gradientes difieren de la media de los 2 ranks en "
            f"{result['grad_error']:.2e} (se espera <= 1e-6)",
        )
        assert result["frozen_grad_is_none"], say(
            f"rank {r}: the frozen layer (requires_grad=False) got a .grad; expected None: it is in no bucket",
            f"rank {r}: la capa congelada (requires_grad=False) recibió un .grad; se espera None: no está en ninguna "
            "bucket",
        )
        error = result["second_backward_raised"]
        raised, lanzo = (f" (it raised {error})", f" (lanzó {error})") if error else ("", "")
        assert result["second_backward_error"] <= 1e-6, say(
            f"rank {r}: a second backward (zero_grad, the same batch) gives gradients {result['second_backward_error']:.2e} "
            f"from the average{raised}; expected <= 1e-6: the first hook of every backward resets the buckets and "
            "self._next_bucket, or the last step's full buckets are never launched again",
            f"rank {r}: una segunda pasada hacia atrás (zero_grad, el mismo lote) da gradientes a "
            f"{result['second_backward_error']:.2e} de la media{lanzo}; se espera <= 1e-6: el primer hook de cada "
            "pasada reinicia los buckets y self._next_bucket, o los buckets llenos del paso anterior no se vuelven a "
            "lanzar",
        )


@pytest.mark.exercise("1.3")
@pytest.mark.points(1)
def test_ddp_all_reduce_starts_during_backward(ranks):
    """Overlap: the first bucket is launched before the last bucket's gradients exist."""
    for r, result in enumerate(both(ranks, "ddp_toy@1.3")):
        first, last = result["timeline"][0], result["timeline"][-1]
        assert first["launched_s"] is not None and last["last_ready_s"] is not None, say(
            f"rank {r}: bucket 0's launched_s is {first['launched_s']}, the last bucket's last_ready_s "
            f"{last['last_ready_s']} (expected times from self._now()): set last_ready_s in the hook when a bucket "
            "is full and launched_s in _launch",
            f"rank {r}: el launched_s del bucket 0 es {first['launched_s']}, el last_ready_s del último "
            f"{last['last_ready_s']} (se esperan tiempos de self._now()): fija last_ready_s en el hook cuando un "
            "bucket está completo y launched_s en _launch",
        )
        assert first["launched_s"] < last["last_ready_s"], say(
            f"rank {r}: bucket 0 was launched at {first['launched_s']:.6f} s, after the last gradient "
            f"({last['last_ready_s']:.6f} s); expected before: launch each bucket from the hook as soon as it is full",
            f"rank {r}: el bucket 0 se lanzó a los {first['launched_s']:.6f} s, después del último gradiente "
            f"({last['last_ready_s']:.6f} s); se espera antes: lanza cada bucket desde el hook en cuanto esté completo",
        )
        for bucket in result["timeline"]:
            first, full = bucket["first_ready_s"], bucket["last_ready_s"]
            assert first is not None and full is not None and first <= full, say(
                f"rank {r}: bucket {bucket['bucket']}'s first_ready_s is {first}, its last_ready_s {full}: set "
                "first_ready_s (self._now()) when the bucket's first parameter is ready, so that it is not after "
                "last_ready_s",
                f"rank {r}: el first_ready_s del bucket {bucket['bucket']} es {first}, su last_ready_s {full}: fija "
                "first_ready_s (self._now()) cuando el primer parámetro del bucket está listo, de modo que no sea "
                "posterior a last_ready_s",
            )
        launches = result["launches"]
        assert len(launches) == len(result["timeline"]), say(
            f"rank {r}: self._launch ran {len(launches)} times for {len(result['timeline'])} buckets: the hook must "
            "launch each complete bucket with self._launch",
            f"rank {r}: self._launch se ejecutó {len(launches)} veces para {len(result['timeline'])} buckets: el hook "
            "debe lanzar cada bucket completo con self._launch",
        )
        for launch in launches:
            bucket, params = launch["bucket"], launch["params"]
            assert launch["copies"] == 1, say(
                f"rank {r}: _launch of bucket {bucket} ({params} parameters) copied the gradients into the buffer "
                f"with {launch['copies']} calls: expected one call for the whole bucket (a Python call costs "
                "microseconds, whatever the tensor's size)",
                f"rank {r}: _launch del bucket {bucket} ({params} parámetros) copió los gradientes en el búfer con "
                f"{launch['copies']} llamadas: se espera una sola llamada para todo el bucket (una llamada de Python "
                "cuesta microsegundos, sea cual sea el tamaño del tensor)",
            )
            assert launch["all_reduces"] == [True] and not launch["waited"] and launch["handle"], say(
                f"rank {r}: _launch of bucket {bucket} called dist.all_reduce with async_op = {launch['all_reduces']}"
                f"{', waited for it' if launch['waited'] else ''} and left bucket.handle "
                f"{'set' if launch['handle'] else 'None'}: expected one asynchronous all-reduce (async_op=True), not "
                "waited for, its handle in bucket.handle (backward goes on while the bucket travels)",
                f"rank {r}: _launch del bucket {bucket} llamó a dist.all_reduce con async_op = "
                f"{launch['all_reduces']}{', lo esperó' if launch['waited'] else ''} y dejó bucket.handle "
                f"{'asignado' if launch['handle'] else 'en None'}: se espera un solo all-reduce asíncrono "
                "(async_op=True), sin esperarlo, con su handle en bucket.handle (la pasada hacia atrás sigue mientras "
                "el bucket viaja)",
            )


@pytest.mark.exercise("1.3")
@pytest.mark.points(1)
def test_ddp_launches_buckets_in_the_same_order_on_every_rank(ranks):
    """Gradients arrive in opposite orders on the two ranks; the buckets must not."""
    for r, result in enumerate(both(ranks, "ddp_bucket_order@1.3")):
        assert result["a_grad"] == [20.0] * 3 and result["b_grad"] == [6.0] * 5, bucket_order_problem(r, result)


def bucket_order_problem(rank: int, result: dict) -> str:
    """What a's and b's gradients were, what they should be, and the likely cause."""
    a, b = result["a_grad"], result["b_grad"]
    got = say(
        f"rank {rank}: a.grad = {a}, b.grad = {b}; expected 20 and 6 in every entry (each gradient averaged over "
        "the 2 ranks)",
        f"rank {rank}: a.grad = {a}, b.grad = {b}; se espera 20 y 6 en cada elemento (cada gradiente promediado "
        "entre los 2 ranks)",
    )
    if a == [1.0] * 3 and b == [2.0] * 5:
        return got + say(
            ": these are the parameters' values (a = 1, b = 2), not their gradients: the hook is given the parameter, "
            "its gradient is param.grad",
            ": son los valores de los parámetros (a = 1, b = 2), no sus gradientes: el hook recibe el parámetro, su "
            "gradiente es param.grad",
        )
    if a == [40.0] * 3 and b == [12.0] * 5:
        return got + say(
            ": these are the sums, twice the average: divide each bucket by the world size",
            ": son las sumas, el doble de la media: divide cada bucket por el tamaño del mundo",
        )
    return got + say(
        ": a's and b's gradients arrive in opposite orders on the two ranks, and launching buckets in arrival order "
        "pairs the wrong buckets; launch them in index order, bucket 0 first",
        ": los gradientes de a y b llegan en órdenes opuestos a los dos ranks, y lanzar los buckets en orden de "
        "llegada empareja buckets equivocados; lánzalos por orden de índice, el 0 primero",
    )


@pytest.mark.exercise("1.3")
@pytest.mark.points(1)
def test_ddp_no_sync_accumulates_locally(ranks):
    for r, result in enumerate(both(ranks, "ddp_no_sync@1.3")):
        assert result["stayed_local"] == 0.0, say(
            f"rank {r}: after a backward inside no_sync() the gradients differ from this rank's own by "
            f"{result['stayed_local']:.2e} (expected 0): inside no_sync() the hook must not launch any all-reduce",
            f"rank {r}: tras una pasada hacia atrás dentro de no_sync() los gradientes difieren de los de este rank en "
            f"{result['stayed_local']:.2e} (se espera 0): dentro de no_sync() el hook no debe lanzar ningún all-reduce",
        )
        assert result["accumulated_error"] <= 1e-6, say(
            f"rank {r}: one backward inside no_sync(), one outside: .grad differs from the average over the ranks of "
            f"both backwards' sum by {result['accumulated_error']:.2e} (expected <= 1e-6)",
            f"rank {r}: una pasada hacia atrás dentro de no_sync() y otra fuera: .grad difiere de la media entre ranks de la suma "
            f"de ambos en {result['accumulated_error']:.2e} (se espera <= 1e-6)",
        )
        assert result["forward_decides"] == 0.0, say(
            f"rank {r}: forward inside no_sync(), backward outside: the gradients differ from this rank's own by "
            f"{result['forward_decides']:.2e} (expected 0): the forward decides, as in PyTorch's DDP",
            f"rank {r}: pasada hacia delante dentro de no_sync() y hacia atrás fuera: los gradientes difieren de los de este rank en "
            f"{result['forward_decides']:.2e} (se espera 0): decide la pasada hacia delante, como en el DDP de PyTorch",
        )


@pytest.mark.exercise("1.3")
@pytest.mark.points(1)
def test_ddp_ring_switch_gives_the_same_gradients(ranks):
    for r, (ring, torch_) in enumerate(zip(both(ranks, "ddp_ring@1.3"), both(ranks, "ddp_toy@1.3"))):
        assert ring["grad_error"] <= 1e-6, say(
            f"rank {r}: with collective='ring' the gradients differ from the average over the 2 ranks by "
            f"{ring['grad_error']:.2e} (expected <= 1e-6)",
            f"rank {r}: con collective='ring' los gradientes difieren de la media de los 2 ranks en "
            f"{ring['grad_error']:.2e} (se espera <= 1e-6)",
        )
        assert ring["ring_bytes_sent"] == torch_["bytes_all_reduced"], say(
            f"rank {r}: with collective='ring' self.ring_bytes counted {ring['ring_bytes_sent']} bytes, expected "
            f"{torch_['bytes_all_reduced']}: on 2 ranks a ring sends 2(N-1)/N = 1 buffer's worth; count the ring's "
            "bytes into self.ring_bytes",
            f"rank {r}: con collective='ring' self.ring_bytes contó {ring['ring_bytes_sent']} bytes, se esperan "
            f"{torch_['bytes_all_reduced']}: con 2 ranks un anillo envía 2(N-1)/N = 1 búfer; cuenta los bytes del "
            "anillo en self.ring_bytes",
        )


# ----------------------------------------------------------------------------------------------
# Exercise 1.4: wait and unflatten


@pytest.mark.exercise("1.4")
@pytest.mark.points(1)
def test_ddp_finish_counts_bytes_and_is_harmless_twice(ranks):
    for r, result in enumerate(both(ranks, "ddp_toy@1.4")):
        assert not result["grads_not_in_buckets"], say(
            f"rank {r}: after backward the .grad of {result['grads_not_in_buckets']} is not a view of its bucket's "
            "buffer: expected each .grad to be its slot (p.grad = self._slot(p)), where the average is, with no copy "
            "back",
            f"rank {r}: tras la pasada hacia atrás el .grad de {result['grads_not_in_buckets']} no es una vista del "
            "búfer de su bucket: se espera que cada .grad sea su hueco (p.grad = self._slot(p)), donde está la media, "
            "sin copiarla de vuelta",
        )
        assert result["bytes_all_reduced"] == 896, say(
            f"rank {r}: bytes_all_reduced is {result['bytes_all_reduced']}, expected 896: the bytes of all the "
            "buffers, 224 trainable floats x 4 bytes (the frozen layer out, the tied weight once)",
            f"rank {r}: bytes_all_reduced vale {result['bytes_all_reduced']}, se esperan 896: los bytes de todos los "
            "búferes, 224 floats entrenables x 4 bytes (sin la capa congelada, el peso atado una vez)",
        )
        assert result["finish_twice_harmless"], say(
            f"rank {r}: a second call of finish_gradient_synchronization() changed .grad; expected no change: with "
            "no backward in progress it must return at once",
            f"rank {r}: una segunda llamada a finish_gradient_synchronization() cambió .grad; se espera que no cambie: "
            "sin backward en curso debe volver en el acto",
        )
        steps = (result["steps_synchronised"], result["steps_after_finish_twice"])
        assert steps == (1, 1), say(
            f"rank {r}: steps_synchronised is {steps[0]} after one backward and {steps[1]} after two more calls of "
            "finish_gradient_synchronization(); expected 1 and 1: one more per synchronised backward, none for a "
            "call with no backward in progress",
            f"rank {r}: steps_synchronised vale {steps[0]} tras una pasada hacia atrás y {steps[1]} tras dos "
            "llamadas más a finish_gradient_synchronization(); se esperan 1 y 1: uno más por cada pasada hacia atrás "
            "sincronizada, ninguno por una llamada sin pasada en curso",
        )
        assert result["grad_error"] <= 1e-6, say(
            f"rank {r}: after backward the gradients differ from the average over the 2 ranks by "
            f"{result['grad_error']:.2e} (expected <= 1e-6): wait for every bucket, then make each .grad its slot, "
            "where the average is",
            f"rank {r}: tras la pasada hacia atrás los gradientes difieren de la media de los 2 ranks en "
            f"{result['grad_error']:.2e} (se espera <= 1e-6): espera a cada bucket y haz que cada .grad sea su hueco, "
            "donde está la media",
        )


@pytest.mark.exercise("1.4")
@pytest.mark.points(1)
def test_ddp_unused_parameter_is_an_error_that_names_it(ranks):
    for r, result in enumerate(both(ranks, "ddp_unused@1.4")):
        if result["raised"] and result["message"].startswith("Exercise 1.4: "):
            raise NotImplementedError(result["message"])  # the stub's error (a RuntimeError): not written yet
        assert result["raised"], say(
            f"rank {r}: the backward left forgotten.weight and forgotten.bias without gradient and ended without "
            "error; expected a RuntimeError that names them (their bucket was never launched)",
            f"rank {r}: la pasada hacia atrás dejó forgotten.weight y forgotten.bias sin gradiente y terminó sin error; se "
            "espera un RuntimeError que los nombre (su bucket nunca se lanzó)",
        )
        assert "forgotten.weight" in result["message"], say(
            f"rank {r}: the RuntimeError must name the parameter without gradient, forgotten.weight; it says "
            f"{result['message'][:150]!r}",
            f"rank {r}: el RuntimeError debe nombrar el parámetro sin gradiente, forgotten.weight; dice "
            f"{result['message'][:150]!r}",
        )
        assert result["seconds"] < limit(5), say(
            f"rank {r}: raising took {result['seconds']:.1f} s (expected < {limit(5):g} s): raise at once, do not wait "
            "for a bucket that was never launched",
            f"rank {r}: lanzar el error tardó {result['seconds']:.1f} s (se espera < {limit(5):g} s): lánzalo en el "
            "acto, no esperes a un bucket que nunca se lanzó",
        )


# ----------------------------------------------------------------------------------------------
# All together: your DDP on your ring trains MiniGPT as one process does


@pytest.mark.exercise("all")
@pytest.mark.points(2)
def test_ddp_minigpt_two_ranks_equal_one_process(ranks):
    """All four exercises at once (``collective="ring"``): the averaged gradients of one backward,
    then three AdamW steps. AdamW would hide gradients summed instead of averaged (it divides by
    the gradient's own size), so the gradients are compared first."""
    r0, r1 = both(ranks, "ddp_minigpt@all")
    for r, result in enumerate((r0, r1)):
        assert result["grad_error"] <= 1e-6, say(
            f"rank {r}: after one backward the gradients differ from one process's by {result['grad_error']:.2e} "
            "(expected <= 1e-6): is each bucket divided by the world size?",
            f"rank {r}: tras una pasada hacia atrás los gradientes difieren de los de un proceso en {result['grad_error']:.2e} "
            "(se espera <= 1e-6): ¿se divide cada bucket por el tamaño del mundo?",
        )
    assert r0["buckets"] > 1, say(
        f"MiniGPT with a 0.05 MB bucket cap went into {r0['buckets']} bucket(s), expected more than 1",
        f"MiniGPT con un tope de 0,05 MB por bucket quedó en {r0['buckets']} bucket(s), se espera más de 1",
    )
    drift = max(r0["drifts"] + r1["drifts"])
    assert drift <= 1e-5, say(
        f"after 3 steps the logits differ from one process's by {drift:.2e} (expected <= 1e-5)",
        f"tras 3 pasos los logits difieren de los de un proceso en {drift:.2e} (se espera <= 1e-5)",
    )
    step = next((k + 1 for k, (a, b) in enumerate(zip(r0["digests"], r1["digests"])) if a != b), "?")
    assert r0["digests"] == r1["digests"], say(
        f"the two ranks' parameters differ after step {step} of 3 (their SHA-1 digests differ; expected: the same "
        "bits)",
        f"los parámetros de los dos ranks difieren tras el paso {step} de 3 (sus resúmenes SHA-1 difieren; se espera: "
        "los mismos bits)",
    )
