"""Lab 05 · Tensor and context parallelism: the graded checks.

The pieces that need no process group (cutting a Linear, the row-parallel layer with a simulated
sum over the ranks, the online softmax, the block mask) are tested in this process. The rest runs
once per session in one launch (the ``tp_scratch`` fixture of tests/ranks.py,
tests/tp_scratch_worker.py): tensor-parallel groups of 2 ranks, two of them side by side on 4 ranks
when Exercise 5.2 is graded, so that f or g summing over the whole world instead of its group shows.
Each test reads the scenario run for its exercise (``f@5.2``: only Exercise 5.2 the learner's). The course's own checks of the mechanism are in
tests/test_lab05_reference.py.

    make grade EX=5.2          # or: .venv/bin/python -m minigpt.grader --exercise 5.2
"""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from minigpt.parallel.tensor_parallel.ring_attention import positions
from tests.ranks import Launch, scenario
from tests.words import refuses, say, short

pytestmark = [pytest.mark.lab("05"), pytest.mark.timeout(180)]

TOLERANCE = 1e-12  # float64 throughout, but for the end-to-end model (float32, like one process)


def both(launch: Launch, name: str) -> list[dict]:
    return [scenario(launch, name, r) for r in range(2)]


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def biggest(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach() - b.detach()).abs().max())


# ----------------------------------------------------------------------------------------------
# Exercise 5.1: cutting a Linear


@pytest.mark.exercise("5.1")
@pytest.mark.points(1)
def test_column_slice_keeps_each_ranks_output_features(lab05):
    for parts in (1, 3):
        for tp in (1, 2, 4):
            weight = torch.randn(12 * parts, 5, generator=gen(tp + parts), dtype=torch.float64)
            bias = torch.randn(12 * parts, generator=gen(7), dtype=torch.float64)
            where = say(
                f"a ({12 * parts}, 5) weight, parts={parts}, tp={tp}",
                f"un peso ({12 * parts}, 5), parts={parts}, tp={tp}",
            )
            for rank in range(tp):
                w, b = lab05.column_slice(weight, bias, tp, rank, parts)
                rows = torch.cat(
                    [torch.arange(p * 12 + rank * 12 // tp, p * 12 + (rank + 1) * 12 // tp) for p in range(parts)]
                )
                assert tuple(w.shape) == (12 * parts // tp, 5) and torch.equal(w, weight[rows]), say(
                    f"{where}: rank {rank}'s weight is {tuple(w.shape)}, expected rows {rows.tolist()} of the weight, "
                    f"{(12 * parts // tp, 5)} (run {rank} of the {tp} runs of rows of each of the {parts} part(s))",
                    f"{where}: el peso del rank {rank} es {tuple(w.shape)}, se esperan las filas {rows.tolist()} del "
                    f"peso, {(12 * parts // tp, 5)} (el tramo {rank} de los {tp} tramos de filas de cada una de las "
                    f"{parts} parte(s))",
                )
                assert b is not None and torch.equal(b, bias[rows]), say(
                    f"{where}: rank {rank}'s bias is {short(b)}, expected entries {rows.tolist()} of the bias",
                    f"{where}: el sesgo del rank {rank} es {short(b)}, se esperan las entradas {rows.tolist()} del sesgo",
                )
                w.fill_(7.0)
                assert not bool((weight == 7.0).any()), say(
                    f"{where}: writing into rank {rank}'s slice changed the whole weight: expected a new tensor, not a view",
                    f"{where}: escribir en la porción del rank {rank} cambió el peso entero: se espera un tensor nuevo, "
                    "no una vista",
                )
    w, b = lab05.column_slice(torch.ones(4, 3), None, 2, 1)
    assert b is None, say(
        f"column_slice with bias=None returned a bias {short(b)}: expected None",
        f"column_slice con bias=None devolvió un sesgo {short(b)}: se espera None",
    )
    for rows, parts, tp, why, why_es in [
        (12, 1, 5, "5 ranks cannot share 12 rows equally", "5 ranks no pueden repartirse 12 filas por igual"),
        (
            12,
            3,
            3,
            "3 divides the 12 rows but not a part's 4: each of q, k and v is cut by itself",
            "3 divide las 12 filas pero no las 4 de una parte: q, k y v se cortan cada una por su lado",
        ),
        (12, 5, 1, "5 parts do not divide 12 rows", "5 partes no dividen 12 filas"),
    ]:
        refuses(
            f"column_slice(a ({rows}, 5) weight, bias, tp={tp}, rank=0, parts={parts})",
            lambda rows=rows, parts=parts, tp=tp: lab05.column_slice(
                torch.ones(rows, 5), torch.ones(rows), tp, 0, parts
            ),
            why,
            why_es,
        )


@pytest.mark.exercise("5.1")
@pytest.mark.points(1)
def test_row_slice_keeps_each_ranks_input_features_and_the_bias_whole(lab05):
    weight = torch.randn(6, 12, generator=gen(1), dtype=torch.float64)
    bias = torch.randn(6, generator=gen(2), dtype=torch.float64)
    for tp in (1, 2, 3, 4):
        for rank in range(tp):
            w, b = lab05.row_slice(weight, bias, tp, rank)
            cols = slice(rank * 12 // tp, (rank + 1) * 12 // tp)
            assert tuple(w.shape) == (6, 12 // tp) and torch.equal(w, weight[:, cols]), say(
                f"tp={tp}, rank {rank}: the weight is {tuple(w.shape)}, expected columns {cols.start}..{cols.stop - 1} "
                f"of the (6, 12) weight, (6, {12 // tp})",
                f"tp={tp}, rank {rank}: el peso es {tuple(w.shape)}, se esperan las columnas {cols.start}..{cols.stop - 1} "
                f"del peso (6, 12), (6, {12 // tp})",
            )
            assert b is not None and torch.equal(b, bias), say(
                f"tp={tp}, rank {rank}: the bias is {short(b)}, expected the whole bias on every rank (added once, "
                "after the sum)",
                f"tp={tp}, rank {rank}: el sesgo es {short(b)}, se espera el sesgo entero en cada rank (sumado una vez, "
                "tras la suma)",
            )
            w.fill_(7.0)
            assert not bool((weight == 7.0).any()), say(
                f"tp={tp}, rank {rank}: writing into the slice changed the whole weight: expected a new tensor, not a view",
                f"tp={tp}, rank {rank}: escribir en la porción cambió el peso entero: se espera un tensor nuevo, no una vista",
            )
    refuses(
        "row_slice(a (6, 12) weight, bias, tp=5, rank=0)",
        lambda: lab05.row_slice(weight, bias, 5, 0),
        "5 ranks cannot share 12 input features equally",
        "5 ranks no pueden repartirse 12 características de entrada por igual",
    )


def simulated_row_parallel(row_parallel_linear, tp: int, with_bias: bool = True):
    """A (7, 12) -> (7, 5) Linear cut over ``tp`` simulated ranks: every rank runs
    ``row_parallel_linear`` with a ``reduce`` that sums what every rank passed to it (a first round
    records each rank's term, a second gives each rank the sum, gradient as g's: the identity).
    Returns (each rank's output, the expected output, how many times each rank called reduce)."""
    x = torch.randn(7, 12, generator=gen(tp), dtype=torch.float64)
    weight = torch.randn(5, 12, generator=gen(10 + tp), dtype=torch.float64)
    bias = torch.randn(5, generator=gen(20 + tp), dtype=torch.float64) if with_bias else None
    size = 12 // tp
    pieces = [(x[:, r * size : (r + 1) * size], weight[:, r * size : (r + 1) * size]) for r in range(tp)]
    terms: list[torch.Tensor] = []
    for xr, wr in pieces:  # round 1: what each rank hands to reduce
        row_parallel_linear(xr, wr, bias, lambda t: terms.append(t.detach()) or t)
    total = sum(terms) if terms else None
    outputs, calls = [], []
    for xr, wr in pieces:  # round 2: reduce returns the sum over the ranks
        count = []
        outputs.append(row_parallel_linear(xr, wr, bias, lambda t, c=count: c.append(1) or t + (total - t.detach())))
        calls.append(len(count))
    return outputs, F.linear(x, weight, bias), calls


@pytest.mark.exercise("5.1")
@pytest.mark.points(3)
def test_row_parallel_linear_sums_the_partial_products_and_adds_the_bias_once(lab05):
    for tp in (1, 2, 3, 4):
        for with_bias in (True, False):
            outputs, expected, calls = simulated_row_parallel(lab05.row_parallel_linear, tp, with_bias)
            where = say(
                f"tp={tp}, {'with' if with_bias else 'without'} bias", f"tp={tp}, {'con' if with_bias else 'sin'} sesgo"
            )
            assert calls == [1] * tp, say(
                f"{where}: reduce called {calls} times per rank, expected once on each rank",
                f"{where}: reduce llamado {calls} veces por rank, se espera una vez en cada rank",
            )
            for rank, out in enumerate(outputs):
                assert out.shape == expected.shape, say(
                    f"{where}, rank {rank}: the output is {tuple(out.shape)}, expected {tuple(expected.shape)}",
                    f"{where}, rank {rank}: la salida es {tuple(out.shape)}, se espera {tuple(expected.shape)}",
                )
                error = biggest(out, expected)
                assert error <= TOLERANCE, say(
                    f"{where}, rank {rank}: the output differs from the whole Linear's x W^T + b by {error:.3g} "
                    f"(a bias added before reduce is summed {tp} times)",
                    f"{where}, rank {rank}: la salida difiere de x W^T + b del Linear entero en {error:.3g} (un "
                    f"sesgo sumado antes de reduce se suma {tp} veces)",
                )


# ----------------------------------------------------------------------------------------------
# Exercise 5.2: f and g


def every_rank(launch: Launch, name: str) -> list[dict]:
    """Each rank's result of one of Exercise 5.2's scenarios: every rank of the launch (two
    tensor-parallel groups on 4 ranks)."""
    return [scenario(launch, name, r) for r in range(len(launch.results))]


def braces(ranks: list[int]) -> str:
    return "{" + ", ".join(str(r) for r in ranks) + "}"


def over_the_world(result: dict, what: str, what_es: str) -> str:
    """The likely cause when a sum covered the whole world instead of the rank's tensor-parallel
    group: the collective ran on the default group, not on the group it was given."""
    world, group = result["world"], braces(result["group"])
    return say(
        f"; {what} was summed over all {world} ranks, not over its tp group {group}: the all-reduce ran on "
        f"the default group (the whole world), not on the group it was given; {world // 2} tp groups of 2 "
        "ranks run side by side here, each on its own data",
        f"; {what_es} se sumó sobre los {world} ranks, no sobre su grupo tp {group}: el all-reduce corrió en "
        f"el grupo por defecto (el mundo entero), no en el grupo que se le dio; aquí corren {world // 2} "
        "grupos tp de 2 ranks a la vez, cada uno con sus datos",
    )


@pytest.mark.exercise("5.2")
@pytest.mark.points(2)
def test_f_is_the_identity_forward_and_sums_the_gradients_backward(tp_scratch):
    for rank, result in enumerate(every_rank(tp_scratch, "f@5.2")):
        assert result["forward"] == 0.0 and result["forward_bytes"] == 0, say(
            f"rank {rank}: copy_to_tp's output differs from its input by {result['forward']:.3g} and sent "
            f"{result['forward_bytes']} bytes: expected the identity forward, no communication (every rank holds "
            "the same input already)",
            f"rank {rank}: la salida de copy_to_tp difiere de su entrada en {result['forward']:.3g} y envió "
            f"{result['forward_bytes']} bytes: se espera la identidad en la pasada hacia delante, sin comunicación "
            "(cada rank ya tiene la misma entrada)",
        )
        got = "no gradient" if result["backward"] is None else f"{result['backward']:.3g}"
        own = say(" (it is this rank's own gradient: no all-reduce)", " (es el gradiente de este rank: sin all-reduce)")
        world = over_the_world(result, "the gradient", "el gradiente") if result["backward_world"] else ""
        group = braces(result["group"])
        assert result["backward"] is not None and result["backward"] <= TOLERANCE, say(
            f"rank {rank}: the gradient copy_to_tp gives its input differs from the sum over its tp group {group} "
            f"of the incoming gradients by {got}{own if result['backward_own'] else ''}: expected their all-reduce "
            f"over the group{world}",
            f"rank {rank}: el gradiente que copy_to_tp da a su entrada difiere de la suma sobre su grupo tp {group} "
            f"de los gradientes que llegan en {got}{own if result['backward_own'] else ''}: se espera su all-reduce "
            f"sobre el grupo{world}",
        )


@pytest.mark.exercise("5.2")
@pytest.mark.points(2)
def test_g_sums_forward_and_is_the_identity_backward(tp_scratch):
    for rank, result in enumerate(every_rank(tp_scratch, "g@5.2")):
        world = over_the_world(result, "the output", "la salida") if result["forward_world"] else ""
        group = braces(result["group"])
        assert result["forward"] <= TOLERANCE, say(
            f"rank {rank}: reduce_from_tp's output differs from the sum over its tp group {group} of their inputs by "
            f"{result['forward']:.3g}: expected their all-reduce over the group{world}",
            f"rank {rank}: la salida de reduce_from_tp difiere de la suma sobre su grupo tp {group} de sus entradas "
            f"en {result['forward']:.3g}: se espera su all-reduce sobre el grupo{world}",
        )
        got = "no gradient" if result["backward"] is None else f"{result['backward']:.3g}"
        summed = say(" (it is the sum over the ranks)", " (es la suma entre los ranks)")
        assert result["backward"] is not None and result["backward"] == 0.0, say(
            f"rank {rank}: the gradient reduce_from_tp gives its input differs from the incoming one by "
            f"{got}{summed if result['backward_summed'] else ''}: expected the identity backward",
            f"rank {rank}: el gradiente que reduce_from_tp da a su entrada difiere del que llega en "
            f"{got}{summed if result['backward_summed'] else ''}: se espera la identidad en la pasada hacia atrás",
        )


MLP_MEASURES = ("out", "x_grad", "fc_grad", "proj_grad", "proj_bias_grad")


@pytest.mark.exercise("5.2")
@pytest.mark.points(1)
def test_f_and_g_around_a_column_then_row_mlp_equal_one_process(tp_scratch):
    for rank, result in enumerate(every_rank(tp_scratch, "mlp@5.2")):
        wrong = {
            k: "no gradient" if result[k] is None else f"{result[k]:.2e}"
            for k in MLP_MEASURES
            if result[k] is None or result[k] > TOLERANCE
        }
        world = over_the_world(result, "the input's gradient", "el gradiente de la entrada")
        world = world if result["x_grad_world"] else ""
        group = braces(result["group"])
        assert not wrong, say(
            f"rank {rank}: a column-parallel Linear, GELU and a row-parallel Linear on the tp group {group}, with "
            f"your f and g, differ from the same MLP in one process: {short(wrong)} (largest differences of the "
            f"output and of the gradients; expected <= 1e-12 in float64){world}",
            f"rank {rank}: un Linear por columnas, GELU y un Linear por filas en el grupo tp {group}, con tus f y g, "
            f"difieren del mismo MLP en un proceso: {short(wrong)} (mayores diferencias de la salida y de los "
            f"gradientes; se espera <= 1e-12 en float64){world}",
        )


# ----------------------------------------------------------------------------------------------
# Exercise 5.3: the vocabulary-parallel cross-entropy


@pytest.mark.exercise("5.3")
@pytest.mark.points(2)
def test_vocab_parallel_loss_equals_one_process_on_every_rank(tp_scratch):
    for rank, result in enumerate(both(tp_scratch, "ce@5.3")):
        assert result["shape"] == [2, 16] and result["loss"] <= TOLERANCE, say(
            f"rank {rank}: the per-token loss is {result['shape']} and differs from one process's cross-entropy "
            f"over the 13 words by {result['loss']}: expected (B, T) = [2, 16], <= 1e-12 (each rank holds 7 of "
            "the 14 padded columns; the padding column holds 50.0 and must count for nothing)",
            f"rank {rank}: la pérdida por token es {result['shape']} y difiere de la entropía cruzada de un proceso "
            f"sobre las 13 palabras en {result['loss']}: se espera (B, T) = [2, 16], <= 1e-12 (cada rank tiene 7 de "
            "las 14 columnas con relleno; la columna de relleno vale 50.0 y no debe contar)",
        )
        assert result["ranks_agree"], say(
            f"rank {rank}: the ranks returned different losses: expected the same bits on every rank",
            f"rank {rank}: los ranks devolvieron pérdidas distintas: se esperan los mismos bits en cada rank",
        )
        assert result["bytes"] < result["logit_bytes"] / 2, say(
            f"rank {rank}: the loss sent {result['bytes']} bytes, as much as the logits themselves "
            f"({result['logit_bytes']}): expected a few numbers per token (the maximum, the sum of exponentials, the "
            "target's logit), never the logits",
            f"rank {rank}: la pérdida envió {result['bytes']} bytes, tanto como los propios logits "
            f"({result['logit_bytes']}): se esperan unos pocos números por token (el máximo, la suma de "
            "exponenciales, el logit del objetivo), nunca los logits",
        )
        assert large_logits_hold(result["large"]), large_logits_problem(rank, result["large"])


def large_logits_hold(large: dict) -> bool:
    return bool(large.get("finite")) and large["error_relative"] <= 1e-9


def large_logits_problem(rank: int, large: dict) -> str:
    """What the loss did with logits in the thousands, and the rule."""
    if "error" in large:
        got = (large["error"], large["error"])
    elif not large["finite"]:
        got = ("not finite", "no es finita")
    else:
        got = (
            f"{large['error_relative']:.2e} (relative) from one process's",
            f"está a {large['error_relative']:.2e} (relativo) de la de un proceso",
        )
    return say(
        f"rank {rank}: with logits in the thousands (3000 x randn) the loss is {got[0]}: expected finite and within "
        "1e-9 of one process's (exp(3000) overflows: subtract the maximum over every rank's columns first)",
        f"rank {rank}: con logits de miles (3000 x randn) la pérdida {got[1]}: se espera finita y a menos de 1e-9 de "
        "la de un proceso (exp(3000) desborda: resta antes el máximo sobre las columnas de todos los ranks)",
    )


@pytest.mark.exercise("5.3")
@pytest.mark.points(2)
def test_vocab_parallel_loss_gradient_is_softmax_minus_onehot_on_this_ranks_columns(tp_scratch):
    for rank, result in enumerate(both(tp_scratch, "ce@5.3")):
        got = "no gradient" if result["grad"] is None else f"{result['grad']:.3g}"
        assert result["grad"] is not None and result["grad"] <= TOLERANCE, say(
            f"rank {rank}: the gradient of the loss with respect to this rank's logits differs from one process's "
            f"by {got}: expected (softmax - onehot(target)) times the incoming gradient, on this rank's columns",
            f"rank {rank}: el gradiente de la pérdida respecto a los logits de este rank difiere del de un proceso "
            f"en {got}: se espera (softmax - onehot(objetivo)) por el gradiente que llega, en las columnas de este rank",
        )
        assert result["padding_grad"] == 0.0, say(
            f"rank {rank}: the padding column got a gradient of {result['padding_grad']:.3g}: expected 0",
            f"rank {rank}: la columna de relleno recibió un gradiente de {result['padding_grad']:.3g}: se espera 0",
        )
        assert not result["backward_calls"] and result["backward_bytes"] == 0, say(
            f"rank {rank}: the loss's backward communicated ({short(result['backward_calls'])}, "
            f"{result['backward_bytes']} bytes counted): expected no communication in backward, each rank's gradient "
            "comes from what its forward kept (its softmax and the target's place)",
            f"rank {rank}: la pasada hacia atrás de la pérdida se comunicó ({short(result['backward_calls'])}, "
            f"{result['backward_bytes']} bytes contados): no se espera comunicación en la pasada hacia atrás, el "
            "gradiente de cada rank sale de lo que guardó su pasada hacia delante (su softmax y el lugar del objetivo)",
        )


# ----------------------------------------------------------------------------------------------
# Exercise 5.4: the online softmax and the block mask


def merged(step, scores: torch.Tensor, v: torch.Tensor, cuts: list[int], maxima: list | None = None) -> torch.Tensor:
    m = total = acc = None
    bounds = [0, *cuts, scores.shape[-1]]
    for a, b in zip(bounds, bounds[1:]):
        m, total, acc = step(m, total, acc, scores[..., a:b], v[..., a:b, :])
        if maxima is not None:
            maxima.append(m)
    return acc / total.unsqueeze(-1)


@pytest.mark.exercise("5.4")
@pytest.mark.points(2)
def test_online_softmax_merges_blocks_into_one_softmax(lab05):
    g = gen(4)
    scores = 4 * torch.randn(2, 3, 6, 12, generator=g, dtype=torch.float64)
    scores[..., 4:8] += 10.0  # a later block raises every row's maximum: the old sums must be rescaled
    scores[..., 1, 5] = float("-inf")  # masked entries
    scores[..., 2, 8:] = float("-inf")  # a row with a whole block masked
    v = torch.randn(2, 3, 12, 5, generator=g, dtype=torch.float64)
    for cuts in ([6], [4, 8], [1, 2, 3, 10]):
        s, vv = scores.clone().requires_grad_(), v.clone().requires_grad_()
        expected = F.softmax(s, dim=-1) @ vv
        w = torch.randn(expected.shape, generator=gen(len(cuts)), dtype=torch.float64)
        ref_grads = torch.autograd.grad((expected * w).sum(), (s, vv))
        s2, v2 = scores.clone().requires_grad_(), v.clone().requires_grad_()
        maxima: list = []
        out = merged(lab05.online_softmax_step, s2, v2, cuts, maxima)
        carried = [k for k, m in enumerate(maxima) if isinstance(m, torch.Tensor) and m.requires_grad]
        assert not carried, say(
            f"blocks of keys cut at {cuts}: the running maximum m returned after block {carried[0]} carries a "
            "gradient: expected each block's maximum taken from scores.detach() (a shift the softmax ignores; the "
            "gradient goes through the exponentials only)",
            f"bloques de claves cortados en {cuts}: el máximo acumulado m devuelto tras el bloque {carried[0]} lleva "
            "gradiente: se espera el máximo de cada bloque tomado de scores.detach() (un desplazamiento que el "
            "softmax ignora; el gradiente pasa solo por las exponenciales)",
        )
        error = biggest(out, expected) if out.shape == expected.shape else float("inf")
        assert error <= 1e-12, say(
            f"blocks of keys cut at {cuts}: acc / total after the last block differs from softmax(scores) @ v by "
            f"{error:.3g} (a later block has a larger maximum: the old total and acc must be rescaled by "
            "exp(m - m'))",
            f"bloques de claves cortados en {cuts}: acc / total tras el último bloque difiere de softmax(scores) @ v "
            f"en {error:.3g} (un bloque posterior tiene un máximo mayor: el total y el acc anteriores deben "
            "reescalarse por exp(m - m'))",
        )
        grads = torch.autograd.grad((out * w).sum(), (s2, v2), allow_unused=True)
        grad_error = max(biggest(a, b) if a is not None else float("inf") for a, b in zip(grads, ref_grads))
        assert grad_error <= 1e-12, say(
            f"blocks of keys cut at {cuts}: the gradients of the scores and of v differ from the softmax's by "
            f"{grad_error:.3g}: expected the same (the maximum detached, the gradient through the exponentials)",
            f"bloques de claves cortados en {cuts}: los gradientes de las puntuaciones y de v difieren de los del "
            f"softmax en {grad_error:.3g}: se esperan los mismos (el máximo sin gradiente, el gradiente por las "
            "exponenciales)",
        )


@pytest.mark.exercise("5.4")
@pytest.mark.points(2)
def test_block_mask_compares_global_positions(lab05):
    for balanced in (False, True):
        layout = say("load-balanced" if balanced else "contiguous", "equilibrada" if balanced else "contigua")
        for cp in (2, 4):
            seq_len = 16
            for q_rank in range(cp):
                for k_rank in range(cp):
                    q_pos, k_pos = positions(seq_len, cp, q_rank, balanced), positions(seq_len, cp, k_rank, balanced)
                    got = lab05.block_mask(q_pos, k_pos)
                    expected = k_pos.unsqueeze(0) <= q_pos.unsqueeze(1)
                    where = say(
                        f"{layout} layout, cp={cp}: block_mask(queries at {q_pos.tolist()}, keys at {k_pos.tolist()})",
                        f"disposición {layout}, cp={cp}: block_mask(consultas en {q_pos.tolist()}, claves en "
                        f"{k_pos.tolist()})",
                    )
                    assert got.shape == expected.shape and got.dtype == torch.bool, say(
                        f"{where} is {tuple(got.shape)} {got.dtype}, expected {tuple(expected.shape)} torch.bool",
                        f"{where} es {tuple(got.shape)} {got.dtype}, se espera {tuple(expected.shape)} torch.bool",
                    )
                    if torch.equal(got, expected):
                        continue
                    row = int((got != expected).any(dim=1).nonzero()[0])
                    seen, visible = k_pos[got[row]].tolist(), k_pos[expected[row]].tolist()
                    raise AssertionError(
                        say(
                            f"{where}: the query at position {int(q_pos[row])} sees the keys at {seen}, expected "
                            f"{visible}: True where the key's global position is at most the query's",
                            f"{where}: la consulta en la posición {int(q_pos[row])} ve las claves en {seen}, se "
                            f"espera {visible}: True donde la posición global de la clave es como mucho la de la "
                            "consulta",
                        )
                    )


# ----------------------------------------------------------------------------------------------
# All together


@pytest.mark.exercise("all")
@pytest.mark.points(2)
def test_all_together_your_tensor_parallel_minigpt_equals_one_process(tp_scratch):
    """All of your Lab 05 code in TPMiniGPT (2 blocks) on 2 ranks: the logits, the loss and every
    gradient against one process's (float32)."""
    for rank, result in enumerate(both(tp_scratch, "model@all")):
        assert max(result["logits"], result["loss"], result["grads"]) <= 1e-5, say(
            f"rank {rank}: MiniGPT cut over 2 ranks with your pieces differs from one process: logits by "
            f"{result['logits']:.2e}, loss by {result['loss']:.2e}, gradients by {result['grads']:.2e} (the worst: "
            f"{result['worst']}); expected <= 1e-5",
            f"rank {rank}: MiniGPT cortado en 2 ranks con tus piezas difiere de un proceso: logits en "
            f"{result['logits']:.2e}, pérdida en {result['loss']:.2e}, gradientes en {result['grads']:.2e} (el peor: "
            f"{result['worst']}); se espera <= 1e-5",
        )


@pytest.mark.exercise("all")
@pytest.mark.points(2)
def test_all_together_your_ring_attention_equals_full_causal_attention(tp_scratch):
    for rank, result in enumerate(both(tp_scratch, "ring@all")):
        for layout, case in result["cases"].items():
            assert max(case["out"], case["grads"]) <= TOLERANCE, say(
                f"rank {rank}, {layout} slices: ring attention on 2 ranks with your online softmax and block mask "
                f"differs from full causal attention: output by {case['out']:.3g}, gradients of q, k, v by "
                f"{case['grads']:.3g} (expected <= 1e-12 in float64)",
                f"rank {rank}, porciones {'contiguas' if layout == 'contiguous' else 'equilibradas'}: la atención en "
                f"anillo en 2 ranks con tu softmax en línea y tu máscara por bloques difiere de la atención causal "
                f"completa: salida en {case['out']:.3g}, gradientes de q, k, v en {case['grads']:.3g} (se espera <= "
                "1e-12 en float64)",
            )
