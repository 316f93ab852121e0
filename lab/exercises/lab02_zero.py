"""Lab 02 exercises: the ZeRO simulator.

Fill in the five pieces (2.1-2.3 in the numpy simulator, 2.4-2.5 in a real ZeRO-1 optimizer), then
grade yourself:

    make grade LAB=02          # this lab: points per exercise, one line per lost point
    make grade EX=2.1          # one exercise (the reference stands in for the others)
    make grade LAB=02 LANG=es  # el informe en español
    make hint EX=2.2           # stuck? the next hint of one exercise (one more on each call)

Read the lab guide first: ``lab/02-zero-simulator.md``. Each stub states its task: what it must
achieve, its contract, and why it matters; the steps are in the hints. The reference is in
``minigpt/zero/memory.py``, ``minigpt/zero/comm.py``, ``minigpt/zero/simulate.py`` and
``minigpt/parallel/zero1.py``; try not to peek. What you can use:

* ``recipe(name)`` -> a :class:`Recipe` with ``param_bytes``, ``grad_bytes``,
  ``optimizer_bytes`` (K) and ``reduce_bytes`` (bytes per communicated gradient element);
* ``working_buffer(stage, largest_layer, recipe)`` -> the bytes of the one unit held whole;
* ``DeviceMemory(params, grads, optimizer, working, host_params, host_grads, host_optimizer)``;
* ``Collective(op, what, group, group_size, elements, element_bytes, count=1)``, whose
  ``bytes_sent`` applies the ring factor for you;
* in the simulator, a :class:`Cluster` ``c`` (see the reference ``zero1_step`` and
  ``zero3_step``, which are yours to read): ``c.workers``, ``c.units``, ``c.chunk(unit, rank)``,
  ``c.reduce_scatter(buffers, unit)``, ``c.all_gather(buffers, unit)``, ``c.record(label,
  collective)``, ``c.backward_unit(worker, unit, weights)``, ``c.finish_backward(worker)``,
  ``c.adam_update(worker, unit, weights, where, grad, step)``, and on a worker
  ``w.hold(name, kind, array)``, ``w.get(name)``, ``w.drop(name)``.
"""

from __future__ import annotations

import numpy as np  # noqa: F401
import torch
from torch import nn

from minigpt.parallel import ring  # noqa: F401
from minigpt.parallel.zero1 import FlatGroup, ZeroOneOptimizer as _Scaffold  # noqa: F401
from minigpt.zero.comm import Collective  # noqa: F401
from minigpt.zero.memory import DeviceMemory, Recipe, recipe, working_buffer  # noqa: F401
from minigpt.zero.simulate import Cluster, _forward_whole  # noqa: F401


def device_memory(
    psi: float,
    n_devices: int,
    stage: int,
    recipe_name: str = "mixed",
    largest_layer: float = 0,
    offload_optimizer: bool = False,
    offload_params: bool = False,
) -> DeviceMemory:
    """Exercise 2.1: the bytes of model state on one of ``n_devices`` at ZeRO ``stage``.

    What: a :class:`DeviceMemory` of the bytes one device holds for ``psi`` parameters: its
    weights, gradients and optimizer state, the working buffer (``working_buffer(stage,
    largest_layer, rec)``), and what offload moved to the host. The recipe (``recipe(recipe_name)``)
    gives the bytes per parameter of each: ``param_bytes``, ``grad_bytes``, ``optimizer_bytes`` (K).

    Contract: stage 1 shards the optimizer state over the N devices, stage 2 the gradients too,
    stage 3 the weights too; what is not sharded is whole on every device. Offload moves bytes, it
    does not remove them: ``offload_optimizer`` puts the optimizer bytes in ``host_optimizer``
    (and, from stage 2, the gradient bytes in ``host_grads``: the optimizer that updates them runs
    there); ``offload_params`` puts the weights in ``host_params`` and is only valid at stage 3.
    Raise ValueError for psi <= 0, n_devices < 1 (or not an int), a stage not in 0..3, an unknown
    recipe, or offload_params below stage 3.

    Why: this is the ZeRO paper's (2 + 2 + K)Ψ table made a function; the graded tests hold it to
    the paper's numbers and to what the simulator's workers really hold.
    """
    raise NotImplementedError(
        "Exercise 2.1: per-device memory = weights + gradients + optimizer, each divided by N from its stage on"
    )


def zero2_step(c: Cluster, xs: list, ys: list, rows: int, step: int) -> float:
    """Exercise 2.2: one ZeRO-2 training step on every worker of ``c``; return the loss.

    What: the same step as ``zero1_step`` (every worker holds its weights whole, its optimizer
    state sharded), but with the gradients sharded too: at no moment does a worker hold more than
    one unit's whole gradient, and between units only its own chunk of each (``w.get(f"gradshard{u}")``,
    the chunk ``c.chunk(u, w.rank)``). Afterwards every worker holds the same, updated weights whole.

    Contract: the forward is ``_forward_whole(c, xs, ys, rows)`` (it returns the loss). Backward runs
    unit by unit, from the last to the first, each worker's whole gradient of a unit held as a
    *working* buffer (``w.hold(name, "working", array)``; it must not outlive the unit) and summed
    over the workers with one ``c.reduce_scatter`` per unit; ``c.finish_backward(w)`` ends each
    worker's backward. Each worker updates only its chunk of each unit, ``c.adam_update(w, u,
    weights, chunk, gradient_shard, step)``, and one ``c.all_gather`` per unit puts the weights back
    together. ``c.record(label, collective)`` marks each moment (the memory tests read the peaks).

    Why: the reduce-scatter is an all-reduce cut in half: each worker needs only the sum over its
    own chunk, since it only updates that chunk. Dropping the whole gradient as soon as it is
    reduced is what saves ZeRO-2's memory; keeping it would be ZeRO-1 with extra steps.
    """
    raise NotImplementedError(
        "Exercise 2.2: ZeRO-2 = reduce-scatter each unit's gradient, keep your chunk, update it, all-gather the weights"
    )


def step_collectives(
    psi: float,
    stage: int,
    shard_degree: int,
    replicas: int = 1,
    recipe_name: str = "mixed",
    reshard_after_forward: bool = True,
) -> list[Collective]:
    """Exercise 2.3: the collectives of one step, as a list of :class:`Collective`.

    What: every collective a device joins in one training step of ZeRO ``stage``, sharded over
    ``shard_degree`` devices and, for HSDP, replicated over ``replicas`` groups; each a
    ``Collective(op, what, group, group_size, elements, element_bytes, count)`` ("all-reduce",
    "reduce-scatter" or "all-gather"; "gradients" or "weights"; the group "data", "shard" or
    "replica").

    Contract: stage 0 (DDP) all-reduces the gradients over the ``shard_degree`` devices and does not
    shard, so ``replicas`` must be 1 (else ValueError). Stages 1-3 reduce-scatter the gradients and
    all-gather the weights in the shard group ("data" when ``replicas == 1``, else "shard"); stage 3
    gathers the weights twice a step when ``reshard_after_forward`` (forward and again for
    backward). With ``replicas > 1`` the gradient *shard* (``psi / shard_degree`` elements) is also
    all-reduced across the ``replicas`` groups. Gradients travel at ``recipe.reduce_bytes`` per
    element, weights at ``recipe.param_bytes``. Bad values (psi, stage, degrees) are ValueErrors.

    Why: with these the course computes the bytes each device sends per step (``bytes_sent`` applies
    the ring factor) and holds them against what PyTorch's own runs send.
    """
    raise NotImplementedError("Exercise 2.3: list the step's collectives with their groups and sizes")


def trainable_parameters(params: list[nn.Parameter]) -> list[nn.Parameter]:
    """Exercise 2.4: what a ZeRO-1 optimizer puts in its flat buffers, for one parameter group.

    ``params`` is a group's list as the user gave it (``model.parameters()`` or a list of their
    own). Return the parameters that train, each once, in the order given:

    * leave out a parameter with ``requires_grad=False`` (frozen): it never gets a gradient, and
      in the flat buffers it would cost gradient memory and be exposed to the optimizer;
    * a parameter listed twice (tied weights, or a user's list that repeats one) appears once, where
      it first appears: the same ``Parameter`` object, not a tensor of equal values.

    Why: the flat buffers are cut into equal pieces, one per rank; a frozen or repeated parameter in
    them costs memory on every rank, and a repeated one would be updated twice per step.
    """
    raise NotImplementedError("Exercise 2.4: the trainable parameters, frozen ones out, each once")


class ZeroOneOptimizer(_Scaffold):
    """Your ZeRO-1: the scaffolding (``minigpt/parallel/zero1.py``) builds the flat buffers from your
    :func:`trainable_parameters`, cuts out this rank's pieces, marks the parameters that receive a
    gradient, reduces, and gathers the state for the checks. You write the step."""

    trainable_parameters = staticmethod(trainable_parameters)

    @torch.no_grad()
    def step(self, closure=None):
        """Exercise 2.5: one ZeRO-1 step that follows ``torch.optim``'s rules.

        What the scaffolding gives you:

        * ``self.reduce_gradients()``: sums the usage marks over the ranks and reduce-scatters every
          group's flat gradient (averaging); afterwards ``self.used[self._index[id(param)]]`` is
          non-zero exactly when some rank's backward produced a gradient for ``param``;
        * ``self.groups``: one :class:`FlatGroup` per parameter group (None for a group with
          nothing to train), with ``.params`` (the trainable parameters), ``.flat`` (their weights),
          ``.pieces`` (this rank's pieces: parameters of the inner optimizer, views of ``.flat``,
          whose ``.grad`` are views of the reduced gradient) and ``.piece_params`` (for each piece,
          the index in ``.params`` of the parameter it is a piece of);
        * ``self.local``: the inner optimizer over the pieces; ``self.param_groups`` and
          ``self.local.param_groups`` correspond one to one;
        * ``ring.ring_all_gather(tensor, self.process_group, self.counter)``.

        What must hold when it returns: ``closure`` (if given) was called, under
        ``torch.enable_grad()``, and its loss is returned (else None); the gradients were reduced
        once; each inner group has every setting of its ``self.param_groups`` twin but ``"params"``
        (the learning-rate schedule changes them every step); this rank's pieces took one step of the
        inner optimizer, except the pieces of a parameter that **no rank** gave a gradient this step,
        which are untouched, weights and optimizer state alike, as ``torch.optim`` leaves a parameter
        whose ``.grad`` is None (and their ``.grad`` views are back in place afterwards); every
        group's ``.flat`` holds the whole, updated weights on every rank (all-gathered); and
        ``self._reduced`` is False.

        Why: a ZeRO-1 optimizer must be a drop-in replacement: the same weights as the plain
        optimizer on one process, step after step, whatever the model does (a layer unused this step
        must not decay or move with stale momentum).
        """
        raise NotImplementedError("Exercise 2.5: reduce, step the pieces that have a gradient, all-gather")
