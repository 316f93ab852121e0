"""Lab 05 exercises: tensor and context parallelism.

Fill in the four pieces, then grade yourself:

    make grade LAB=05          # this lab: points per exercise, one line per lost point
    make grade EX=5.2          # one exercise (the reference stands in for the others)
    make grade LAB=05 LANG=es  # el informe en español
    make hint EX=5.3           # stuck? the next hint of one exercise (one more on each call)

Each stub states its task: what it must achieve, its contract, and why it matters; the steps are in
the hints. The reference is the package ``minigpt/parallel/tensor_parallel/``; try not to peek. The layers
(``ColumnParallelLinear``, ``RowParallelLinear``, ``VocabParallelEmbedding``), the model
``TPMiniGPT`` and ``ring_attention`` are written: they take a *kit* of the pieces below
(``minigpt.parallel.tensor_parallel.kit.kit_for("exercises")`` builds it from this file), so a
model built with your kit runs your code at every place these pieces are used.

Conventions: PyTorch's ``nn.Linear`` keeps its weight as ``(out_features, in_features)`` and
computes ``y = x W^T + b``. A tensor-parallel group has ``tp`` ranks; ``group=None`` is the default
process group. Two helpers of the scaffold do the communication for you, on Lab 01's ring, and count
the bytes they send in ``counter`` (a ``ByteCounter``, or None for the module's own counter):

* ``comm.all_reduce(x, group, counter)``: the sum of ``x`` over the group, as a new tensor (no
  autograd: it detaches its input);
* ``comm.all_reduce_max(x, group, counter)``: the element-wise maximum over the group, the same way.

Every rank of the group must call a collective, in the same order, the same number of times.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist  # noqa: F401
from torch.nn import functional as F  # noqa: F401

from minigpt.parallel.ring import ByteCounter
from minigpt.parallel.tensor_parallel import comm  # noqa: F401  (comm.all_reduce, comm.all_reduce_max)
from minigpt.parallel.tensor_parallel.comm import Group

# ----------------------------------------------------------------------------------------------
# Exercise 5.1: cutting a Linear


def column_slice(
    weight: torch.Tensor, bias: torch.Tensor | None, tp: int, rank: int, parts: int = 1
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Exercise 5.1a: rank ``rank``'s share of a ``Linear`` cut by **output features** (column-parallel).

    ``weight`` is ``(out, in)``, ``bias`` ``(out,)`` or None. The output features are first split
    into ``parts`` equal consecutive parts (``parts=3`` for MiniGPT's fused ``[q | k | v]``
    projection, ``out = 3 C``), and each part is cut by itself into ``tp`` equal runs of rows: rank
    r keeps run r of every part, concatenated in part order, ``(out / tp, in)``, and the same entries
    of the bias, ``(out / tp,)`` (None stays None). So with ``parts=3`` a rank keeps the same heads
    of q, k and v. Raise ValueError when ``tp`` does not divide the rows of a part (or ``parts``
    does not divide ``out``). Return new tensors (``.clone()``), not views of ``weight``.

    Why: a column-parallel layer computes this rank's share of the output features, with no
    communication; cutting q, k and v apart (not the fused matrix as one block) keeps each rank's
    heads whole, so attention runs on each rank without talking to the others.
    """
    raise NotImplementedError("Exercise 5.1: keep this rank's rows of each part of the weight, and of the bias")


def row_slice(
    weight: torch.Tensor, bias: torch.Tensor | None, tp: int, rank: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Exercise 5.1b: rank ``rank``'s share of a ``Linear`` cut by **input features** (row-parallel).

    ``weight`` is ``(out, in)``: rank r keeps columns ``[r in/tp, (r+1) in/tp)``, ``(out, in / tp)``,
    as a new contiguous tensor (not a view). The bias ``(out,)`` is not cut: return a copy of it
    whole (None stays None); it is added once, after the sum over the ranks (see
    :func:`row_parallel_linear`). Raise ValueError when ``tp`` does not divide ``in``.

    Why: a row-parallel layer takes the column-parallel layer's output slice as it is; each rank's
    product is one term of the full product, and the terms are summed once.
    """
    raise NotImplementedError("Exercise 5.1: keep this rank's columns of the weight, and the bias whole")


def row_parallel_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, reduce: Callable[[torch.Tensor], torch.Tensor]
) -> torch.Tensor:
    """Exercise 5.1c: the output of a row-parallel layer on this rank.

    ``x`` ``(..., in / tp)`` is this rank's slice of the input features (the output of a
    column-parallel layer), ``weight`` ``(out, in / tp)`` this rank's columns (:func:`row_slice`),
    ``bias`` ``(out,)`` whole, or None. This rank's product ``x W_r^T`` is one term of the full
    ``x W^T``; ``reduce`` is a function the layer hands you that returns the sum of its argument
    over the ranks of the group (it is ``reduce_from_tp``, or a reduce-scatter with sequence
    parallelism; autograd goes through it). Call it exactly once, on this rank's term, and return
    ``(..., out)``: the full ``x W^T + b``, with the bias counted once.

    Why: the bias is not a term of the sum: added on every rank before the sum, it would be counted
    ``tp`` times. One call of ``reduce``: one collective per layer, which is Megatron's cost.
    """
    raise NotImplementedError("Exercise 5.1: reduce this rank's partial product once, then add the bias once")


# ----------------------------------------------------------------------------------------------
# Exercise 5.2: Megatron's f and g


def copy_to_tp(x: torch.Tensor, group: Group = None, counter: ByteCounter | None = None) -> torch.Tensor:
    """Exercise 5.2a: "f", placed before a column-parallel layer whose input every rank of ``group``
    holds whole.

    Contract. Forward: the result has ``x``'s shape, dtype and values, and nothing is sent (every rank
    of the group already holds the same ``x``). Backward: the gradient that reaches ``x`` on a rank is
    the sum, over the ranks of ``group`` and no others, of the gradients that reached the result on
    each of them. That sum is the only communication, forward or backward, and it goes through the
    scaffold's helpers on ``group``, counted in ``counter`` (``group`` may be a subgroup of the world,
    one tensor-parallel group among several). Return a tensor that autograd connects to ``x``.

    A question before you write: autograd derives a backward from the operations a forward runs,
    and no operation here has this backward. How do you give PyTorch a backward of your own? (Its
    documentation, "Extending torch.autograd", answers; what must your backward return, and for
    which arguments?)

    Why: every rank feeds the same ``x`` into its own columns of the next weight, so the gradient a
    rank computes for ``x`` is only its columns' share; the sum over the group is the gradient one
    process would have. Only the ranks of this group hold the other columns: in a world with
    several tensor-parallel groups (Labs 06 and 07), the ranks of another group hold the same
    columns on other data, and their gradients do not belong in this sum.
    """
    raise NotImplementedError("Exercise 5.2: f: the identity forward, an all-reduce of the gradient backward")


def reduce_from_tp(x: torch.Tensor, group: Group = None, counter: ByteCounter | None = None) -> torch.Tensor:
    """Exercise 5.2b: "g", placed after a row-parallel layer, whose output on each rank of ``group``
    is one term of a sum.

    Contract. Forward: the result is the sum of ``x`` over the ranks of ``group`` (the same on each of
    them), with ``x``'s shape and dtype; that sum is the only communication, through the scaffold's
    helpers on ``group``, counted in ``counter``. Backward: the gradient that reaches ``x`` is the
    gradient that reached the result, unchanged, with no communication: the same question as
    :func:`copy_to_tp`'s.

    Why: after a row-parallel layer each rank holds one term of the output; every rank needs the whole
    sum to go on, and the gradient of a sum with respect to each of its terms is the gradient of the
    sum itself. f and g mirror each other: what one does forward, the other does backward, so that
    each of a layer's two passes has one collective.
    """
    raise NotImplementedError("Exercise 5.2: g: an all-reduce forward, the identity backward")


# ----------------------------------------------------------------------------------------------
# Exercise 5.3: the loss from a slice of the vocabulary


def vocab_parallel_cross_entropy(
    logits: torch.Tensor,
    targets: torch.Tensor,
    start: int,
    vocab_size: int,
    group: Group = None,
    counter: ByteCounter | None = None,
) -> torch.Tensor:
    """Exercise 5.3: the per-token cross-entropy from this rank's slice of the vocabulary.

    ``logits`` ``(B, T, V_r)`` are this rank's logits: the vocabulary columns ``[start, start +
    V_r)`` (rank r: ``start = r * V_r``; the vocabulary is padded to a multiple of tp, so the last
    rank's last columns may be at or past ``vocab_size``: they are padding, no word, and must be
    ignored, as if their logit were ``-inf``, whatever value they hold). ``targets`` ``(B, T)`` are
    token ids in ``[0, vocab_size)``; a target lives on exactly one rank.

    Return the loss of every token, ``(B, T)``, the same on every rank:
    ``log sum_j exp(z_j) - z_target`` over the whole (true) vocabulary, equal to
    ``F.cross_entropy(all_logits.transpose(1, 2), targets, reduction="none")`` in one process, without
    ever gathering the ``V`` logits: what crosses ranks are a few numbers per token (a maximum, a sum
    of exponentials, the target's logit), through ``comm.all_reduce_max`` and ``comm.all_reduce``, and
    it must stay finite for logits in the thousands.

    The gradient must reach ``logits``: ``d loss / d logits = (softmax(z) - onehot(target)) *
    grad.unsqueeze(-1)`` on this rank's columns only (0 in the padding columns), with no
    communication in backward. The helpers detach: what comes back from a collective carries no
    gradient, so either write a ``torch.autograd.Function`` with that backward, or build the loss so
    that autograd finds it.

    Why: the output layer's logits are the largest activation of a language model (tokens x
    vocabulary); gathering them whole on every rank would undo the memory the vocabulary-parallel
    layer saved.
    """
    raise NotImplementedError(
        "Exercise 5.3: per-token loss from this rank's vocabulary slice: all-reduce the max, then the sums"
    )


# ----------------------------------------------------------------------------------------------
# Exercise 5.4: ring attention's pieces


def online_softmax_step(
    m: torch.Tensor | None,
    total: torch.Tensor | None,
    acc: torch.Tensor | None,
    scores: torch.Tensor,
    v: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Exercise 5.4a: merge one key/value block into the running softmax of each query row.

    The running state of each query row: ``m`` ``(..., Tq)`` the maximum score seen so far, ``total``
    ``(..., Tq)`` the sum of ``exp(score - m)`` so far, ``acc`` ``(..., Tq, D)`` the sum of
    ``exp(score - m) * v`` so far; all three are None before the first block. The new block:
    ``scores`` ``(..., Tq, Tk)`` (masked entries are ``-inf``; every row of the first block has a
    finite one) and its values ``v`` ``(..., Tk, D)``.

    Contract: return the new ``(m, total, acc)``, which hold the same three things over every block
    seen so far, this one included: ``m`` the largest score of each row, ``total`` and ``acc`` the
    sums above, every term taken against the **new** ``m``. After the last block
    ``acc / total.unsqueeze(-1)`` is then ``softmax(all scores) @ all v``, exactly, and no
    ``exp`` ever sees a positive argument. Take the block's maximum from ``scores.detach()`` (a
    shift the softmax ignores: no gradient through it); the gradient must flow through ``scores``
    and ``v`` into ``total`` and ``acc``.

    Why: ring attention sees the keys one block at a time, as they come round the ring; the softmax
    over all of them is never computed at once, only merged block by block, and it must come out
    exactly as one softmax, with no overflow however large the scores.
    """
    raise NotImplementedError(
        "Exercise 5.4: move the running maximum, rescale the old sums by exp(m - m'), add this block"
    )


def block_mask(q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """Exercise 5.4b: which keys of one block pair each query may see, under the causal mask.

    ``q_pos`` ``(Tq,)`` and ``k_pos`` ``(Tk,)`` are the **global** positions in the whole sequence of
    the queries this rank holds and of the keys of the block it is processing (each a run of
    consecutive positions, or two runs in the load-balanced layout, e.g. ``[0, 1, 6, 7]``). Return a
    ``(Tq, Tk)`` bool tensor, True where the key's position is at most the query's. A block of
    earlier keys is then entirely visible, a block of later keys entirely hidden (ring attention
    skips it), and only blocks that share positions get a triangle.

    Why: a block pair compared by positions within the block would give every pair the diagonal
    triangle: a query would see later keys of an earlier rank's block and miss earlier keys.
    """
    raise NotImplementedError("Exercise 5.4: True where the key's global position is at most the query's")
