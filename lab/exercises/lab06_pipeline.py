"""Lab 06 exercises: pipelines and meshes.

Fill in the pieces, then grade yourself:

    make grade LAB=06          # this lab: points per exercise, one line per lost point
    make grade EX=6.2          # one exercise (the reference stands in for the others)
    make grade LAB=06 LANG=es  # el informe en español
    make hint EX=6.2           # stuck? the next hint of one exercise (one more on each call)

Each stub states its task: what it must achieve, its contract, and why it matters; the steps are in
the hints. The reference is the package ``minigpt/parallel/pipeline/`` (``schedule.py`` and
``engine.py``); try not to peek. The rest of the pipeline is written: :class:`PipelineStage` (MiniGPT cut into
consecutive stages), :class:`Link` (the sends and receives between neighbouring stages),
``check_schedule`` and ``run_schedule``. ``lab/06_pipeline.py --impl exercises`` runs your 1F1B
and your steps, and so do the graded tests.

Conventions. A model is cut into ``stages`` stages (stage s on rank s); a batch is cut into
``micro_batches`` micro-batches numbered ``0 .. m-1``. One stage's schedule is a list of
operations, ``("F", i)`` (the forward of micro-batch i on this stage) or ``("B", i)`` (its
backward). Stage s can run ``F i`` once stage s - 1 has sent it micro-batch i's activations, and
``B i`` once stage s + 1 has sent back their gradient (the last stage: once its own ``F i`` ran).
Sends never block (they are posted and waited for at the end of the step); receives block, so a
list in a bad order stops the pipeline until the receive's timeout (``PipelineTimeout``).
"""

from __future__ import annotations

import torch  # noqa: F401

from minigpt.parallel.pipeline.engine import MicroBatches
from minigpt.parallel.pipeline.link import Link
from minigpt.parallel.pipeline.schedule import Op
from minigpt.parallel.pipeline.stage import PipelineStage

# ----------------------------------------------------------------------------------------------
# Exercise 6.1: the 1F1B schedule


def one_f_one_b(stage: int, stages: int, micro_batches: int) -> list[Op]:
    """Exercise 6.1: stage ``stage``'s list of operations under 1F1B (one forward, one backward).

    Return a list of ``("F", i)`` and ``("B", i)`` tuples that runs the forward and the backward of
    every micro-batch ``i`` in ``range(micro_batches)`` exactly once, in three phases:

    * **warm-up**: the forwards of the first ``w = min(stages - 1 - stage, micro_batches)``
      micro-batches (the last stage has none: it computes the loss, so it can start backward at
      once; stage 0 has the most, enough to fill the pipe below it);
    * **steady state**: for each of the micro-batches ``i = w .. m-1`` in turn, ``("F", i)`` and
      then the backward of the oldest micro-batch not yet run backward (``("B", 0)`` first);
    * **cool-down**: the backwards that are left, in order.

    So stage s never holds more than ``stages - s`` micro-batches (and never more than
    ``micro_batches``), and the lists of all the stages together never block each other:
    ``check_schedule([one_f_one_b(s, p, m) for s in range(p)], m)`` accepts them. Examples:
    ``one_f_one_b(0, 2, 3)`` is ``F0 F1 B0 F2 B1 B2``; ``one_f_one_b(1, 2, 3)`` is
    ``F0 B0 F1 B1 F2 B2``. GPipe (``schedule.gpipe``: all forwards, then all backwards) is written.

    Why: GPipe holds every micro-batch's activations until its backwards start; 1F1B starts each
    micro-batch's backward as soon as the stages after it allow, so a stage holds at most
    ``stages - s`` of them, for the same bubble.
    """
    raise NotImplementedError(
        "Exercise 6.1: warm up with stages - 1 - stage forwards, then one F and one B, then cool down"
    )


# ----------------------------------------------------------------------------------------------
# Exercise 6.2: one step of the pipeline, its sends and receives


def forward_step(
    stage: PipelineStage, i: int, batches: MicroBatches, link: Link, held: dict[int, tuple], scale: float
) -> float | None:
    """Exercise 6.2a: ``("F", i)`` on ``stage``; returns micro-batch i's loss on the last stage
    (unscaled, a Python float), None on the others.

    What you have: ``stage.is_first`` / ``stage.is_last``; ``stage(x)`` runs this stage's layers
    (token ids ``(b, T)`` on the first stage, activations ``(b, T, C)`` on the others) and returns
    activations ``(b, T, C)``, or logits on the last stage; ``stage.loss(logits, targets, mask)``
    is MiniGPT's loss; ``batches.tokens[i]``, ``batches.targets[i]``, ``batches.masks[i]`` are
    micro-batch i's token ids, targets and loss mask; ``link.recv_activation(i)`` blocks until the
    previous stage's activations of micro-batch i arrive (a new tensor, not part of any graph) and
    ``link.send_activation(tensor, i)`` sends this stage's output of micro-batch i to the next stage.

    What must hold when it returns:

    * the stage ran on micro-batch i's input: the tokens on the first stage, otherwise the received
      activations, taken in such a way that this stage's backward can compute their gradient (the
      Why);
    * on the other stages the output went on to the next stage, as numbers (a send carries no graph);
    * ``held[i]`` is ``(input, output)`` for the backward: ``input`` None on the first stage (token
      ids have no gradient), the received activations otherwise; ``output`` the stage's output with
      its graph, which on the last stage is the loss times ``scale`` (1/m: the m micro-batches'
      gradients then add up to the whole batch's).

    Why: the received activations are a new tensor, not part of any graph, and the previous stage
    waits for their gradient: a backward here that does not produce it leaves that stage waiting
    until its receive's timeout.
    """
    raise NotImplementedError("Exercise 6.2: micro-batch i's forward on this stage, with its receive and send")


def backward_step(stage: PipelineStage, i: int, link: Link, held: dict[int, tuple]) -> None:
    """Exercise 6.2b: ``("B", i)`` on ``stage``: backward through micro-batch i's graph.

    What must hold when it returns: micro-batch i is no longer in ``held`` (the stage no longer holds
    its activations and graph); the stage's parameters' ``.grad`` have micro-batch i's share added;
    and, on every stage but the first, the gradient of micro-batch i's input went back to the previous
    stage (``link.send_gradient(tensor, i)``; the first stage has no previous stage and sends nothing).
    On the last stage ``output`` is the scaled loss; on the others ``link.recv_gradient(i)`` blocks
    until the next stage sends the gradient of this stage's output (same shape as ``output``).

    Why: a B that leaves micro-batch i held keeps its activations alive to the end of the step,
    which is the memory 1F1B exists to save; a B that does not send the input's gradient back leaves
    the previous stage waiting.
    """
    raise NotImplementedError("Exercise 6.2: micro-batch i's backward on this stage, with its receive and send")


# Exercises 6.3 (the degrees of an HSDP mesh) and 6.4 (HSDP's bytes per mesh dimension) are in
# lab/exercises/lab06_mesh.py.
