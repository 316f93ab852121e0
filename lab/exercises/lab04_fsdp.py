"""Lab 04 exercises: FSDP from scratch.

Fill in the five pieces, then grade yourself:

    make grade LAB=04          # this lab: points per exercise, one line per lost point
    make grade EX=4.3          # one exercise (the reference stands in for the others)
    make grade LAB=04 LANG=es  # el informe en español
    make hint EX=4.3           # stuck? the next hint of one exercise (one more on each call)

Each stub states its task: what it must achieve, its contract (what holds when it returns, which
collective it may call) and why it matters; the steps are in the hints. The reference is the package
``minigpt/parallel/fsdp_by_hand/`` (one concept a file); try not to peek. It is ZeRO-3 with FSDP2's
design: every parameter is cut along its rows into one padded shard per rank, the module holds its
shard between steps, and each *unit* (a module that ``fully_shard`` was called on: each block, then
the whole model as the root) gathers its parameters just before they are needed and frees them
right after.

Your :class:`FSDPUnit` inherits the reference's scaffolding (the shards, the gathered tensors, the
operations its docstring lists, the hooks and the books they keep, the records) and replaces the
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

from minigpt.parallel.fsdp_by_hand.api import find_units  # noqa: F401
from minigpt.parallel.fsdp_by_hand.gradients import real_rows  # noqa: F401
from minigpt.parallel.fsdp_by_hand.ownership import Slot
from minigpt.parallel.fsdp_by_hand.sharding import padded_rows  # noqa: F401
from minigpt.parallel.fsdp_by_hand.unit import FSDPUnit as _Scaffold


def shard_rows(full: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Exercise 4.1a: rank ``rank``'s shard of ``full``, cut along dimension 0 (its rows).

    What: the rows of ``full`` padded with zero rows up to a multiple of ``world_size``
    (``padded_rows(rows, world_size)``), cut into ``world_size`` equal runs of rows: rank r's run.
    609 rows on 2 ranks become 610: each rank keeps 305, and rank 1's last row is a zero.

    Contract: every rank's shard has the same shape, ``(padded_rows / world_size, *full.shape[1:])``,
    even for a parameter with fewer rows than ranks (some ranks then hold only padding); the shards
    of ranks 0, 1, ... put back in order are ``full`` followed by the zero rows; the shard is a new
    tensor of ``full``'s dtype and device, not a view of ``full``.

    Why: one all-gather of equal pieces is what rebuilds a parameter, and it needs every rank's piece
    to be the same size (FSDP2 pads the same way). A view would keep ``full``'s whole storage alive:
    the memory sharding is meant to save.
    """
    raise NotImplementedError("Exercise 4.1: cut the rows into equal shards, padding with zero rows")


def gather_rows(shard: torch.Tensor, rows: int, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Exercise 4.1b: the whole tensor of ``rows`` rows, rebuilt from every rank's ``shard``.

    What: on every rank of ``group``, the tensor whose rows are rank 0's shard, then rank 1's, ...,
    without the padding rows at the end: ``rows`` rows, ``shard``'s other dimensions, dtype and device.

    Contract: every rank of ``group`` calls it with a shard of the same shape (what :func:`shard_rows`
    makes); it uses one collective, an all-gather into one tensor of ``world_size *
    shard.shape[0]`` rows (not a list of tensors: which call of ``torch.distributed`` is that?).

    Why: this is the "unshard" of ZeRO-3: a unit's parameters exist whole only between this gather
    and the moment they are freed again.
    """
    raise NotImplementedError("Exercise 4.1: all-gather the shards and drop the padding rows")


def unit_parameters(unit: nn.Module, nested: list[nn.Module]) -> list[tuple[nn.Parameter, list[Slot]]]:
    """Exercise 4.2: the parameters the unit ``unit`` owns, each once, with every place it sits.

    What: a list of ``(parameter, slots)``, in the order parameters are first met walking
    ``unit.named_modules(remove_duplicate=False)`` (a walk that visits a module held under two names
    once per name). A slot is ``(module, attribute name, qualified name)``, e.g. ``(model.lm_head,
    "weight", "lm_head.weight")``: a place where the unit must put the gathered tensor. A module's
    own parameters are in ``module._parameters`` (a dict that may hold None: not a parameter). The
    qualified name is ``prefix + "." + attribute``, or the attribute alone at the top (empty prefix).

    The rules (each one is graded):

    * a tied parameter (``model.lm_head.weight is model.wte.weight``) is **one** entry with one
      slot per module that holds it;
    * the same module met twice under two names is still one slot: one slot per (module, attribute);
    * modules inside a ``nested`` unit (its submodules, itself included) are skipped: a block
      sharded first owns its own parameters;
    * a frozen parameter (``requires_grad=False``) is owned like any other.

    Why: a tied parameter is one parameter: one shard, gathered once, and both uses add into one
    gradient; owned twice, it would be sent twice and its gradient split in two. A frozen parameter
    must still be sharded and gathered (the forward reads it); it simply gets no gradient.
    """
    raise NotImplementedError("Exercise 4.2: each parameter once with all its slots, nested units skipped")


def reduce_gradients(unit) -> None:
    """Exercise 4.4a: after ``unit``'s backward, reduce-scatter the full gradients into the shards.

    What: each rank holds ``p.full.grad``, the whole gradient of its own slice of the batch, for the
    parameters of ``unit.params``. Afterwards each shard's ``.grad`` holds its rows of the **mean over
    the ranks** of those gradients (the padding rows 0), in ``p.shard``'s shape and dtype, **added**
    to a ``.grad`` already there (gradient accumulation); and every ``p.full.grad`` is None.

    Contract: one collective per call, a reduce-scatter on ``unit.group`` of one flat buffer in
    ``unit.reduce_dtype`` laid out so that chunk r is rank r's rows
    of every parameter, in the unit's order, each parameter padded as its shard was. Parameters whose
    ``p.full.grad`` is None (unused, or frozen: the same on every rank) take no part; with none left,
    no collective at all.

    Why: data parallelism wants the mean of the ranks' gradients, and each rank only ever needs the
    rows it updates: a reduce-scatter is the half of an all-reduce that gives exactly that, for half
    the bytes. The full gradients are the memory FSDP exists to save: they must not outlive this.
    """
    raise NotImplementedError("Exercise 4.4: reduce-scatter the padded gradients, mean over ranks, into the shards")


@torch.no_grad()
def global_grad_norm(model: nn.Module) -> torch.Tensor:
    """Exercise 4.4b: the 2-norm of the *whole* gradient of the sharded ``model``, the same on
    every rank (every rank calls it: a collective).

    What: a 0-d tensor, the norm of the gradient one process would hold: every parameter with a
    gradient, every rank's rows of it, and none of the padding rows.

    Contract: ``find_units(model)`` lists the units (the root's first); for ``p`` in ``unit.params``,
    ``p.shard`` is a shard, and ``model.parameters()`` yields the shards too, in the model's order;
    ``real_rows(grad, p.rows, unit.rank, unit.world_size)`` is a shard's gradient without its padding
    rows. The combination order is part of the contract: a parameter's norm is the square root of the
    **sum over the ranks** of its pieces' squared norms, and the whole norm is the norm of those
    parameters' norms (not the square root of their squares' sum: the same on paper, another
    rounding). So one collective on ``units[0].group``: a sum over the ranks of one vector, one
    squared piece norm **per parameter**; not one number per rank.

    Why: clipping scales every shard by ``max_norm / norm``; a rank that used its own norm would clip
    its shards by another factor, and they would stop being pieces of one model. Summed in this
    order, the norm is FSDP2's to the bit; one number per rank is equal on paper and not in float32
    (the lab's page shows what that changes over a training).
    """
    raise NotImplementedError("Exercise 4.4: the pieces' squared norms, summed over ranks with one all-reduce")


def backward_prefetch_targets(post_forward_order: list[str], current: str, depth: int = 1) -> list[str]:
    """Exercise 4.5: at unit ``current``'s pre-backward, the names of the units to all-gather ahead.

    What: the ``depth`` units whose backward comes right *after* ``current``'s, in that order (fewer
    near the end; ``[]`` for the last unit, for a ``current`` not in the order, or for ``depth < 1``).

    Contract: ``post_forward_order`` lists unit names in the order their forward finished, e.g.
    ``["blocks.0", "blocks.1", "blocks.2", "blocks.3", "root"]`` (the root finishes last). Backward
    runs the units in the reverse order of their *last* finish (a unit used twice counts once, at its
    last finish): ``root, blocks.3, ..., blocks.0``.

    Why: while ``current`` computes its backward, the next unit's all-gather can travel (the
    prefetch). The unit *before* ``current`` has just finished its backward: gathering it again
    would be wasted, and the one that is needed next would be gathered late.
    """
    raise NotImplementedError("Exercise 4.5: the units that run backward right after this one")


class FSDPUnit(_Scaffold):
    """Your unit: the scaffold's state and books, your pieces.

    The class attributes are what ``fully_shard`` and the scaffold call (``unit.shard_rows(...)``,
    ``unit_class.unit_parameters``). The scaffold's hooks run your four methods of Exercise 4.3 at
    the right moments and keep the books around them (the root, the order of a step, the uses of a
    unit, the marks that make autograd call back, the end of backward, the events the tests read):
    your methods are the mechanism, nothing else.

    What a unit can do:

    * ``self.unshard()`` issues the unit's all-gather and returns with the unit *whole* (its
      parameters gathered into its modules); ``self.unshard(async_op=True)`` issues it and returns
      at once, the gather in flight. Either does nothing when the unit is whole already or its
      gather is already in flight;
    * ``self.wait_unshard()`` finishes the unit's gather in flight, if there is one: the unit is
      then whole;
    * ``self.reshard()`` frees the gathered parameters (0 bytes again; the modules hold the shards);
    * ``self.reduce_gradients()`` reduce-scatters the unit's full gradients into its shards' ``.grad``
      and drops them (your Exercise 4.4; while 4.3 is graded the reference's stands in);
    * ``self.gathered``: True while the unit is whole; ``self.root``: the root's unit;
      ``self.reshard_after_forward``: False when the unit was made to stay whole after its forward;
      ``self.forward_prefetch``: the units to gather ahead at this unit's forward (an explicit list,
      often empty); ``self.backward_prefetch_units()``: the units to gather ahead at its backward.

    Gathers issued on one group finish in the order they were issued.
    """

    shard_rows = staticmethod(shard_rows)
    gather_rows = staticmethod(gather_rows)
    unit_parameters = staticmethod(unit_parameters)
    reduce_scatter_gradients = staticmethod(reduce_gradients)
    global_grad_norm = staticmethod(global_grad_norm)
    backward_prefetch_targets = staticmethod(backward_prefetch_targets)

    def before_forward(self) -> None:
        """Exercise 4.3a: runs right before the unit's forward.

        Contract: when it returns, the unit is whole, and each unit of ``self.forward_prefetch`` has
        its all-gather in flight, issued and not waited for. Collectives: the unit's own all-gather
        (unless a prefetch issued it already: then that one has finished) and the all-gathers of the
        units ahead. Their order is part of the contract: the Why below says which.

        Why: between steps a unit holds only its shards, and its forward reads every parameter. A
        prefetch is meant to travel while this unit computes; waited for here, it only adds its time
        to this forward; issued before the unit's own gather, it makes this forward wait for it.
        """
        raise NotImplementedError("Exercise 4.3: make the unit whole before its forward, the prefetch in flight")

    def after_forward(self) -> None:
        """Exercise 4.3b: runs right after the unit's forward.

        Contract: when it returns, the unit's gathered parameters are freed, unless backward would
        gather them again at once (which unit's backward comes first?) or the unit was made to stay
        whole (``reshard_after_forward`` False). No collective.

        Why: freeing after forward is what makes ZeRO-3's peak one unit's parameters, not the whole
        model's. Freeing what the very next computation reads only buys one more all-gather.
        """
        raise NotImplementedError("Exercise 4.3: free the unit after its forward, unless backward needs it first")

    def before_backward(self) -> None:
        """Exercise 4.3c: runs when the unit's output gets its first gradient, before its backward.

        Contract: when it returns, the unit is whole again, and each unit of
        ``self.backward_prefetch_units()`` has its all-gather in flight, not waited for.
        Collectives: the unit's own all-gather (none if it stayed whole; if a prefetch issued it,
        that one has finished) and the all-gathers of the units ahead, in the order the Why of
        ``before_forward`` asks for.

        Why: the forward freed the unit, and its backward reads the parameters again: autograd kept
        pointing at the same full tensors, whose storage must be refilled in place. A backward that
        meets a freed parameter fails inside autograd ("storage of size 0"). The prefetch lets the
        next unit's parameters travel while this one computes.
        """
        raise NotImplementedError("Exercise 4.3: make the unit whole again for its backward, the next ones in flight")

    def after_backward(self) -> None:
        """Exercise 4.3d: runs once the unit's last backward of the step is done (the scaffold counts
        a unit's uses: one called twice in one forward gets here after its second backward only).

        Contract: when it returns, the unit's gathered parameters are freed and its full gradients
        are reduce-scattered into its shards (every ``p.full.grad`` None, each ``p.shard.grad`` its
        rows of the mean). Collectives: the unit's one reduce-scatter; the Why says when.

        Why: nothing reads this unit's parameters again in this step. Kept, they would pile up unit
        after unit and backward's peak would grow toward the whole model. Freed before the
        reduce-scatter, the reduce-scatter's buffer takes the place of the parameters instead of
        joining them: backward's peak is one unit's parameters lower.
        """
        raise NotImplementedError("Exercise 4.3: after the last backward, nothing gathered and the gradients sharded")
