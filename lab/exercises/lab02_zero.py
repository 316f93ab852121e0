"""Lab 02 exercises: the ZeRO simulator.

Fill in the five pieces (2.1-2.3 in the numpy simulator, 2.4-2.5 in a real ZeRO-1 optimizer), then
grade yourself:

    make grade LAB=02          # this lab: points per exercise, one line per lost point
    make grade EX=2.1          # one exercise (the reference stands in for the others)
    make grade LAB=02 LANG=es  # el informe en español

Read the lab guide first: ``lab/02-zero-simulator.md``. The reference is in
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

    Per parameter the recipe gives the weights' bytes, the gradients' and the optimizer's (K).
    Stage 1 divides the optimizer state by N, stage 2 the gradients too, stage 3 the weights
    too. Add ``working_buffer(stage, largest_layer, rec)``. Then offload:
    ``offload_optimizer`` moves the optimizer bytes to ``host_optimizer`` (and, from stage 2,
    the gradient bytes to ``host_grads``); ``offload_params`` moves the weights to
    ``host_params`` and is only valid at stage 3.

    Raise ValueError for psi <= 0, n_devices < 1 (or not an int), a stage not in 0..3, an
    unknown recipe, or offload_params below stage 3.
    """
    raise NotImplementedError(
        "Exercise 2.1: per-device memory = weights + gradients + optimizer, each divided by N from its stage on"
    )


def zero2_step(c: Cluster, xs: list, ys: list, rows: int, step: int) -> float:
    """Exercise 2.2: one ZeRO-2 training step on every worker of ``c``; return the loss.

    Start with ``loss = _forward_whole(c, xs, ys, rows)`` (forward on every worker with its
    whole weights ``w.get(f"weights{u}")``). Then, for each unit u from the last to the first:

    1. each worker computes the unit's whole gradient, ``c.backward_unit(w, u, weights)``, and
       holds it as a *working* buffer (it must not outlive this unit);
    2. ``c.reduce_scatter`` those buffers (one per worker); ``c.record(...)`` the moment;
    3. each worker copies the chunk it owns, ``c.chunk(u, w.rank)``, into its gradient shard
       ``w.get(f"gradshard{u}")`` and drops the working buffer.

    Then every worker calls ``c.finish_backward(w)`` and updates only its chunk of every unit
    with ``c.adam_update(w, u, weights, chunk, gradient_shard, step)``; finally every unit's
    weights are ``c.all_gather``-ed so all workers hold the new weights whole.
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

    Stage 0: one all-reduce of the gradients over the ``shard_degree`` devices (``replicas``
    must be 1, else ValueError). Stages 1-3: a reduce-scatter of the gradients and an all-gather
    of the weights (``count=2`` at stage 3 when ``reshard_after_forward``), in the group
    ``"data"`` when ``replicas == 1`` and ``"shard"`` otherwise; with ``replicas > 1`` add an
    all-reduce of the gradient shard (``psi / shard_degree`` elements) in the group
    ``"replica"`` of ``replicas`` devices. Gradients travel at ``recipe.reduce_bytes`` per
    element, weights at ``recipe.param_bytes``.
    """
    raise NotImplementedError("Exercise 2.3: list the step's collectives with their groups and sizes")


def trainable_parameters(params: list[nn.Parameter]) -> list[nn.Parameter]:
    """Exercise 2.4: what a ZeRO-1 optimizer puts in its flat buffers, for one parameter group.

    ``params`` is a group's list as the user gave it (``model.parameters()`` or a list of their
    own). Return the parameters that train, each once, in the order given:

    * leave out a parameter with ``requires_grad=False`` (frozen): it never gets a gradient, and
      in the flat buffers it would cost gradient memory and be exposed to the optimizer;
    * a parameter listed twice (tied weights, or a user's list that repeats one) appears once:
      compare by identity (``id(p)``), never with ``==`` (that compares tensors element by element).
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

        Do, in order: call ``closure`` (under ``torch.enable_grad()``) if one is given; reduce the
        gradients; copy every setting but ``"params"`` from each of ``self.param_groups`` into the
        matching inner group (the learning-rate schedule changes them every step); for every piece
        of a parameter that **no rank** gave a gradient this step, set the piece's ``.grad`` to
        None, so that the inner optimizer leaves it alone (``torch.optim`` skips a parameter whose
        ``.grad`` is None: no weight decay, no momentum, no state change), and put the ``.grad``
        views back after the inner step; step the inner optimizer; all-gather every group's
        ``.flat``; set ``self._reduced = False``. Return the closure's loss (or None).
        """
        raise NotImplementedError("Exercise 2.5: reduce, step the pieces that have a gradient, all-gather")
