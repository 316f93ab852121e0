"""Lab 04 exercises: FSDP from scratch.

Fill in the five pieces, then grade yourself:

    make grade LAB=04          # this lab: points per exercise, one line per lost point
    make grade EX=4.3          # one exercise (the reference stands in for the others)
    make grade LAB=04 LANG=es  # el informe en español

The reference is the package ``minigpt/parallel/fsdp_by_hand/`` (one concept a file); try not to
peek. It is ZeRO-3 with FSDP2's design: every parameter is cut along its rows into one padded
shard per rank, the module holds its shard between steps, and each *unit* (a module that
``fully_shard`` was called on: each block, then the whole model as the root) gathers its
parameters just before they are needed and frees them right after.

Your :class:`FSDPUnit` inherits the reference's scaffolding (the shards, the gathered tensors,
``unshard``/``wait_unshard``/``reshard``, the root's bookkeeping, the records) and replaces the
pieces below. ``fully_shard(module, unit_class=FSDPUnit)`` builds units of your class::

    from minigpt.parallel.fsdp_by_hand import fully_shard
    for block in model.blocks:
        fully_shard(block, unit_class=FSDPUnit)
    fully_shard(model, unit_class=FSDPUnit)

What a unit holds (``unit.params``, one ``ShardedParam`` per parameter it owns, in the order of
:func:`unit_parameters`): ``.shard`` (this rank's rows, the ``nn.Parameter`` the optimizer sees),
``.full`` (a full-size ``nn.Parameter`` whose storage is freed, 0 bytes, while the unit is
sharded), ``.rows`` (the parameter's real number of rows), ``.shape`` (its full shape) and
``.slots``. And ``unit.rank``, ``unit.world_size``, ``unit.group``, ``unit.reduce_dtype``,
``unit.name`` (``"root"``, ``"blocks.0"``, ...), ``unit.root`` (the root's unit).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd import Variable  # noqa: F401  (Variable._execution_engine.queue_callback)

from minigpt.parallel.fsdp_by_hand.api import find_units  # noqa: F401
from minigpt.parallel.fsdp_by_hand.gradients import real_rows  # noqa: F401
from minigpt.parallel.fsdp_by_hand.ownership import Slot
from minigpt.parallel.fsdp_by_hand.sharding import padded_rows  # noqa: F401
from minigpt.parallel.fsdp_by_hand.unit import FSDPUnit as _Scaffold, _mark_inputs, _mark_outputs  # noqa: F401


def shard_rows(full: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Exercise 4.1a: rank ``rank``'s shard of ``full``, cut along dimension 0 (its rows).

    When ``world_size`` does not divide the rows, ``full`` is first padded with zero rows up to
    the next multiple (``padded_rows(rows, world_size)``): 609 rows on 2 ranks become 610, so each
    rank keeps 305 and rank 1's last row is a zero. Every rank's shard then has the same shape,
    ``(padded_rows / world_size, *full.shape[1:])``, which one all-gather of equal pieces needs.
    Return a new tensor (not a view of ``full``: the shard lives on while ``full`` is dropped) of
    ``full``'s dtype and device. A parameter with fewer rows than ranks leaves some ranks only
    padding.
    """
    raise NotImplementedError("Exercise 4.1: cut the rows into equal shards, padding with zero rows")


def gather_rows(shard: torch.Tensor, rows: int, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Exercise 4.1b: the whole tensor of ``rows`` rows, rebuilt from every rank's ``shard``.

    One collective, every rank of ``group`` calls it: ``dist.all_gather_single(out, shard,
    group=group)`` puts rank r's shard at rows ``r * shard.shape[0]`` onwards of ``out`` (a tensor
    of ``world_size * shard.shape[0]`` rows; the input must be contiguous). Drop the padding rows.
    """
    raise NotImplementedError("Exercise 4.1: all-gather the shards and drop the padding rows")


def unit_parameters(unit: nn.Module, nested: list[nn.Module]) -> list[tuple[nn.Parameter, list[Slot]]]:
    """Exercise 4.2: the parameters the unit ``unit`` owns, each once, with every place it sits.

    Return a list of ``(parameter, slots)`` in the order parameters are first met walking
    ``unit.named_modules(remove_duplicate=False)`` (that walk visits a module held twice, e.g.
    MiniGPT's ``lm_head`` beside ``wte``, under each of its names). A slot is ``(module, attribute
    name, qualified name)``, e.g. ``(model.lm_head, "weight", "lm_head.weight")``: where the unit
    must put the gathered tensor. Read a module's own parameters from ``module._parameters`` (a
    dict that may hold None: skip it). The qualified name is ``prefix + "." + attribute``, or the
    attribute alone at the top (empty prefix).

    * a tied parameter (``model.lm_head.weight is model.wte.weight``) is **one** entry with one
      slot per module that holds it: gathered once, both uses add into one gradient;
    * the same module met twice under two names is still one slot (compare modules with ``is``);
    * modules inside a ``nested`` unit (its submodules, itself included) are skipped: a block
      sharded first owns its own parameters;
    * a frozen parameter (``requires_grad=False``) is owned like any other (it must be sharded
      and gathered; it simply gets no gradient).
    """
    raise NotImplementedError("Exercise 4.2: each parameter once with all its slots, nested units skipped")


def reduce_gradients(unit) -> None:
    """Exercise 4.4a: after ``unit``'s backward, reduce-scatter the full gradients into the shards.

    Each rank holds ``p.full.grad`` (the whole gradient of its own slice of the batch) for the
    unit's parameters in ``unit.params``; leave out those whose ``p.full.grad`` is None (unused,
    or frozen: the same on every rank), and return at once if none is left. Data parallelism
    wants the mean over the ranks, and each rank keeps only its shard's rows:

    1. each gradient, converted to ``unit.reduce_dtype``, padded with zero rows to
       ``world_size * p.shard.shape[0]`` rows (as its shard was) and viewed as
       ``(world_size, -1)``: row r is rank r's piece;
    2. the views side by side (``torch.cat(..., dim=1)``), flattened: chunk r of the buffer is
       rank r's rows of every parameter, in the unit's order;
    3. call ``unit.record_collective("reduce-scatter", buffer, is_async=False)`` (the tests count
       the bytes from it), then ``dist.reduce_scatter_single(out, buffer, op=dist.ReduceOp.SUM,
       group=unit.group)`` with ``out`` of ``buffer.numel() // world_size`` elements;
    4. divide ``out`` by the world size (the mean), cut it into the shards' pieces, in order,
       each viewed as ``p.shard.shape`` and converted to ``p.shard.dtype``: it becomes
       ``p.shard.grad``, or is added to a ``.grad`` already there (gradient accumulation);
    5. drop the full gradients (``p.full.grad = None``): they are the memory FSDP saves.
    """
    raise NotImplementedError("Exercise 4.4: reduce-scatter the padded gradients, mean over ranks, into the shards")


@torch.no_grad()
def global_grad_norm(model: nn.Module) -> torch.Tensor:
    """Exercise 4.4b: the 2-norm of the *whole* gradient of the sharded ``model``, the same on
    every rank (every rank calls it: a collective).

    ``find_units(model)`` lists the units (the root's first); for ``p`` in ``unit.params``,
    ``p.shard`` is a shard, and ``model.parameters()`` yields the shards too, in the model's order.
    For each shard whose ``.grad`` is not None, in ``model.parameters()`` order, take the norm of
    this rank's piece (``real_rows(grad, p.rows, unit.rank, unit.world_size)`` leaves the padding
    rows out). The whole norm of a parameter is the square root of the *sum over the ranks* of
    its pieces' norms squared, and the norm of the whole gradient is the norm of those. One
    ``dist.all_reduce`` (SUM) on ``units[0].group`` of the vector of squared piece norms does every
    parameter at once (announce it first with ``units[0].record_collective("all-reduce", tensor,
    is_async=False)``). Return a 0-d tensor. (Summing in this order, the norm is FSDP2's to the
    bit; the lab's page shows what one all-reduce of a single number changes.)
    """
    raise NotImplementedError("Exercise 4.4: the pieces' squared norms, summed over ranks with one all-reduce")


def backward_prefetch_targets(post_forward_order: list[str], current: str, depth: int = 1) -> list[str]:
    """Exercise 4.5: at unit ``current``'s pre-backward, the names of the units to all-gather ahead.

    ``post_forward_order`` lists unit names in the order their forward finished, e.g.
    ``["blocks.0", "blocks.1", "blocks.2", "blocks.3", "root"]`` (the root finishes last). Backward
    runs the units in the reverse order of their *last* finish (a unit used twice counts once,
    at its last finish): ``root, blocks.3, ..., blocks.0``. Return the ``depth`` units that come
    right *after* ``current`` in that backward order (fewer near the end; ``[]`` for the last
    unit, for a ``current`` not in the order, or for ``depth < 1``). The unit before ``current``
    has just finished its backward: gathering it again would be wasted.
    """
    raise NotImplementedError("Exercise 4.5: the units that run backward right after this one")


class FSDPUnit(_Scaffold):
    """Your unit: the scaffold's state, your pieces. The class attributes below are what
    ``fully_shard`` and the scaffold call (``unit.shard_rows(...)``, ``unit_class.unit_parameters``)."""

    shard_rows = staticmethod(shard_rows)
    gather_rows = staticmethod(gather_rows)
    unit_parameters = staticmethod(unit_parameters)
    global_grad_norm = staticmethod(global_grad_norm)
    backward_prefetch_targets = staticmethod(backward_prefetch_targets)

    def reduce_gradients(self) -> None:
        reduce_gradients(self)

    def pre_forward(self, module: nn.Module, args: tuple) -> tuple:
        """Exercise 4.3a: runs before ``module.forward(*args)``; returns the (possibly new) args.

        1. if ``self.root`` is None, call ``self._become_root()`` (the first unit to run is the
           root); if ``self is self.root``, call ``self._start_step()`` (a new step's order);
        2. gather the unit: ``self.unshard()`` then ``self.wait_unshard()`` (the second finishes
           a prefetch already in flight);
        3. start the explicit forward prefetch: ``ahead.unshard(async_op=True)`` for each
           ``ahead`` in ``self.forward_prefetch``;
        4. when ``torch.is_grad_enabled()``: count one more use (``self._uses += 1``) and return
           ``_mark_inputs(self, args)`` instead of ``args`` (autograd will call
           :meth:`post_backward` once the inputs' gradient is computed);
        5. a unit that is not the root writes ``self.event("forward")`` last (the schedule the
           tests compare with FSDP2's).
        """
        raise NotImplementedError("Exercise 4.3: gather the unit before its forward, mark its inputs")

    def post_forward(self, module: nn.Module, args: tuple, output):
        """Exercise 4.3b: runs after the forward; returns the output.

        Append ``self.name`` to ``self.root.post_forward_order``. Free the gathered parameters
        (``self.reshard()``) when ``self.reshard_after_forward`` and the unit is not the root (the
        root keeps them: backward starts with it). When ``torch.is_grad_enabled()``, return
        ``_mark_outputs(self, output)`` (autograd will call :meth:`pre_backward` when the output's
        first gradient arrives), else ``output``.
        """
        raise NotImplementedError("Exercise 4.3: record the order, free the unit, mark its outputs")

    def pre_backward(self) -> None:
        """Exercise 4.3c: runs when the unit's output gets its first gradient, before its backward.

        The root, the first time in a backward (``not self.root._callback_queued``), sets
        ``self.root._callback_queued = True`` and queues ``self.root._finish_backward`` with
        ``Variable._execution_engine.queue_callback`` (it ends the step: units whose inputs need
        no gradient, and the final frees). Then the unit must be whole again, since its forward
        freed it: ``self.unshard()`` and ``self.wait_unshard()``. Then prefetch the units of
        ``self._backward_prefetch_units()`` with ``unshard(async_op=True)``. A unit that is not
        the root writes ``self.event("backward")`` last.
        """
        raise NotImplementedError("Exercise 4.3: gather the unit again, prefetch the next ones")

    def post_backward(self) -> None:
        """Exercise 4.3d: runs once the unit's inputs have their gradient (its backward is done).

        Count one use less (``self._uses -= 1``); if uses remain (a unit called twice in one
        forward), return: its other backward has not run yet. Otherwise free the gathered
        parameters (``self.reshard()``), then ``self.reduce_gradients()``.
        """
        raise NotImplementedError("Exercise 4.3: free the unit, then reduce-scatter its gradients")
