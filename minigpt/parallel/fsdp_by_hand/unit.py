"""One FSDP unit: its shards, its gathered parameters, and what it does around its forward and backward.

A unit holds, for each parameter it owns (:mod:`.ownership`), a :class:`ShardedParam`:

* ``shard`` - this rank's rows (:mod:`.sharding`), an ``nn.Parameter`` in the master dtype: what
  the module holds between steps, so the optimizer and ``state_dict()`` see shards only;
* ``full`` - a full-size ``nn.Parameter`` in the compute dtype whose *storage* is freed (0 bytes)
  while the unit is sharded and refilled by an all-gather when it is needed (the modules then hold
  it). Autograd keeps pointing at the same tensor, so backward can use it again once gathered
  again, and adds the unit's gradients into ``full.grad``.

ZeRO-3's four moves, one method each (Exercise 4.3): :meth:`before_forward` (whole, the forward
prefetch in flight), :meth:`after_forward` (freed, unless backward needs it first),
:meth:`before_backward` (whole again, the next units of backward in flight), :meth:`after_backward`
(freed, then its gradients reduce-scattered into the shards: :mod:`.gradients`).

The four hooks around them keep the books (and write the events). The first unit to run becomes the
root and starts each step's order; a forward counts one use and marks its inputs and outputs, so that
autograd calls *pre-backward* at the outputs' first gradient and *post-backward* once the inputs have
theirs; a unit used k times runs :meth:`after_backward` after its k-th backward only. At the end of
backward the root's callback finishes every unit whose inputs needed no gradient (the root itself:
its input is token ids) and frees what is left.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd import Variable

from minigpt.parallel.fsdp_by_hand import gradients, ownership, prefetch, sharding
from minigpt.parallel.fsdp_by_hand.marks import UNIT_ATTR, WHOLE_ATTR, find_units
from minigpt.parallel.fsdp_by_hand.ownership import Slot
from minigpt.parallel.fsdp_by_hand.record import Recorder


@dataclass(frozen=True)
class MixedPrecision:
    """``param_dtype``: the dtype of the gathered parameters and of the computation (None: the
    master dtype); ``reduce_dtype``: the dtype of the reduce-scatter (None: ``param_dtype``)."""

    param_dtype: torch.dtype | None = None
    reduce_dtype: torch.dtype | None = None


@dataclass
class ShardedParam:
    shard: nn.Parameter
    full: nn.Parameter
    rows: int
    shape: torch.Size
    slots: list[Slot]
    origin: int  # id() of the parameter it replaced (to tell a tie across units)


def _free(t: torch.Tensor) -> None:
    t.untyped_storage().resize_(0)


def _allocate(t: torch.Tensor) -> None:
    size = t.numel() * t.element_size()
    if t.untyped_storage().size() != size:
        t.untyped_storage().resize_(size)


class FSDPUnit:
    """The state and hooks of one unit; made by :func:`minigpt.parallel.fsdp_by_hand.fully_shard`.
    The pieces the hooks use are attributes, so that a subclass (Lab 04's exercises) can replace any
    of them: sharding, ownership, the four moves, the reduce-scatter, the global norm, the prefetch."""

    shard_rows = staticmethod(sharding.shard_rows)
    gather_rows = staticmethod(sharding.gather_rows)
    unit_parameters = staticmethod(ownership.unit_parameters)
    reduce_scatter_gradients = staticmethod(gradients.reduce_gradients)
    global_grad_norm = staticmethod(gradients.global_grad_norm)
    backward_prefetch_targets = staticmethod(prefetch.backward_prefetch_targets)

    def reduce_gradients(self) -> None:
        """Reduce-scatter the gradients (:attr:`reduce_scatter_gradients`), announced to the recorder first:
        the buffer of its contract, each parameter with a full gradient padded as its shard, in ``reduce_dtype``."""
        with_grad = [p for p in self.params if p.full.grad is not None]
        if with_grad:
            numel = self.world_size * sum(p.shard.numel() for p in with_grad)
            self._record("reduce-scatter", numel, torch.empty((), dtype=self.reduce_dtype).element_size(), False)
        self.reduce_scatter_gradients(self)

    def clipping_norm(self, model: nn.Module) -> torch.Tensor:
        """The global norm (:attr:`global_grad_norm`), its all-reduce announced: one number per gradient."""
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        if grads:
            self._record("all-reduce", len(grads), grads[0].element_size(), False)
        return self.global_grad_norm(model)

    def __init__(
        self,
        module: nn.Module,
        params: list[tuple[nn.Parameter, list[Slot]]],
        group: dist.ProcessGroup | None,
        reshard_after_forward: bool,
        mp: MixedPrecision,
        recorder: Recorder | None,
    ):
        self.module, self.group = module, group
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)
        self.reshard_after_forward = reshard_after_forward
        self.recorder = recorder
        self.name = "?"  # set by the root: "root", "blocks.0", ...
        self.root: FSDPUnit | None = None  # set at the first forward
        self.units: list[FSDPUnit] = []  # the root's list of every unit below it, itself first
        self.forward_prefetch: list[FSDPUnit] = []  # explicit lists (set_modules_to_*_prefetch)
        self.backward_prefetch: list[FSDPUnit] | None = None  # None: implicit
        self.params: list[ShardedParam] = []
        master = None
        for p, slots in params:
            master = master or p.dtype
            shard = nn.Parameter(self.shard_rows(p.detach(), self.rank, self.world_size), requires_grad=p.requires_grad)
            compute = mp.param_dtype or p.dtype
            full = nn.Parameter(torch.empty(p.shape, dtype=compute, device=p.device), requires_grad=p.requires_grad)
            _free(full)
            self.params.append(ShardedParam(shard, full, p.shape[0], p.shape, slots, id(p)))
            shard.__dict__[UNIT_ATTR] = self  # this shard belongs to a unit
        self.param_dtype = mp.param_dtype or master or torch.float32
        self.reduce_dtype = mp.reduce_dtype or self.param_dtype
        self.gathered = False
        self._in_flight: tuple[dist.Work, torch.Tensor] | None = None
        self._uses = 0  # forwards whose backward has not finished yet
        self.whole: list[tuple[str, nn.Parameter]] = []  # ignored parameters (keep_whole)
        self._hold("shard")

    def keep_whole(self, named: list[tuple[str, nn.Parameter]]) -> None:
        """The unit's ignored parameters: left whole in their modules, the same on every rank of the
        group (rank 0's values are sent to the others once, here)."""
        self.whole = named
        for _, p in named:
            p.__dict__[WHOLE_ATTR] = self
            with torch.no_grad():
                dist.broadcast(p.data, dist.get_global_rank(self.group, 0) if self.group else 0, group=self.group)

    def average_whole_gradients(self) -> None:
        """The mean over the group of each ignored parameter's gradient (each rank computed it from
        its own rows): one all-reduce per parameter, at the end of backward."""
        for _, p in self.whole:
            if p.grad is not None:
                self.record_collective("all-reduce", p.grad, is_async=False)
                dist.all_reduce(p.grad, op=dist.ReduceOp.SUM, group=self.group)
                p.grad /= self.world_size

    # -- moving between shards and whole parameters ---------------------------------------------

    def _hold(self, which: str) -> None:
        """Point every slot at the shards (``"shard"``) or at the gathered tensors (``"full"``)."""
        for p in self.params:
            tensor = p.shard if which == "shard" else p.full
            for module, attr, _ in p.slots:
                module._parameters[attr] = tensor

    def unshard(self, async_op: bool = False) -> None:
        """All-gather the unit's parameters (nothing if gathered or already in flight); with
        ``async_op`` return at once and let :meth:`wait_unshard` finish it."""
        if self.gathered or self._in_flight is not None or not self.params:
            return
        with torch.no_grad():
            local = torch.cat([p.shard.detach().reshape(-1).to(self.param_dtype) for p in self.params])
        out = local.new_empty(self.world_size * local.numel())
        self.record_collective("all-gather", out, async_op)
        self.event("all-gather")
        work = dist.all_gather_single(out, local, group=self.group, async_op=async_op)
        if async_op and self.recorder is not None:
            work.get_future().then(lambda _: self.recorder.completed(self.name))
        self._in_flight = (work, out)
        if not async_op:
            self.wait_unshard()

    def wait_unshard(self) -> None:
        """Wait for the unit's all-gather and copy each parameter's rows out of it."""
        if self._in_flight is None:
            return
        work, out = self._in_flight
        if work is not None:
            if not work.is_completed():
                self.event("waiting", in_schedule=False)  # the prefetch was not done in time
            work.wait()
        self._in_flight = None
        by_rank = out.view(self.world_size, -1)  # row r: rank r's shards, one after another
        offset = 0
        with torch.no_grad():
            for p in self.params:
                n = p.shard.numel()
                padded = by_rank[:, offset : offset + n].reshape(self.world_size * p.shard.shape[0], *p.shape[1:])
                _allocate(p.full)
                p.full.data.copy_(padded[: p.rows])  # .data: autograd does not count this write
                offset += n
        self.gathered = True
        self._hold("full")
        self.event("gathered", in_schedule=False)

    def reshard(self) -> None:
        """Free the gathered parameters; the modules hold the shards again."""
        self.wait_unshard()  # a prefetch nobody used: finish it before freeing its target
        if not self.gathered:
            return
        self.event("freeing", in_schedule=False)  # the moment before: in backward, the peak
        for p in self.params:
            _free(p.full)
        self.gathered = False
        self._hold("shard")
        self.event("free")

    # -- the mechanism (Exercise 4.3): the four moves of ZeRO-3 ------------------------------------

    def before_forward(self) -> None:
        """The unit whole for its forward (its own gather first: it is needed now), then the explicit
        forward prefetch in flight, not waited for."""
        self.unshard()
        self.wait_unshard()
        for ahead in self.forward_prefetch:
            ahead.unshard(async_op=True)

    def after_forward(self) -> None:
        """Free the gathered parameters, unless the unit keeps them for its backward (the root, which
        backward reaches first, or ``reshard_after_forward=False``)."""
        if self.reshard_after_forward and self is not self.root:
            self.reshard()

    def before_backward(self) -> None:
        """The unit whole again (its forward freed it), then the next units of backward in flight."""
        self.unshard()
        self.wait_unshard()
        for ahead in self.backward_prefetch_units():
            ahead.unshard(async_op=True)

    def after_backward(self) -> None:
        """After the unit's last backward of the step: free the gathered parameters, then reduce-scatter
        the full gradients into the shards. Freeing first, the reduce-scatter's buffer takes the place
        of the parameters instead of joining them: the backward peak is one unit's parameters lower."""
        self.reshard()
        self.reduce_gradients()

    # -- the hooks: the books kept around the mechanism ---------------------------------------------

    def pre_forward(self, module: nn.Module, args: tuple) -> tuple:
        """The root (elected at the first forward) starts the step; :meth:`before_forward`; a use counted."""
        if self.root is None:
            self._become_root()
        if self is self.root:
            self._start_step()
        self.before_forward()
        if torch.is_grad_enabled():
            self._uses += 1
            args = _mark_inputs(self, args)
        # the root's computation (the embedding here, the head after the last block) wraps the blocks':
        # FSDP2's schedule (Lab 03's tracer) names blocks only, so the root's mark is in the timeline only
        self.event("forward", in_schedule=self is not self.root)
        return args

    def post_forward(self, module: nn.Module, args: tuple, output):
        """The unit's place in the order backward reverses; :meth:`after_forward`; the outputs marked."""
        self.root.post_forward_order.append(self.name)
        self.after_forward()
        if torch.is_grad_enabled():
            output = _mark_outputs(self, output)
        return output

    def pre_backward(self) -> None:
        """The root queues the end of backward (once per backward); :meth:`before_backward`."""
        if self is self.root and not self.root._callback_queued:
            self.root._callback_queued = True
            Variable._execution_engine.queue_callback(self.root._finish_backward)
        self.before_backward()
        self.event("backward", in_schedule=self is not self.root)  # the root's: its head's backward, first

    def post_backward(self) -> None:
        """Once the unit's inputs have their gradient: one use less; after the last, :meth:`after_backward`."""
        self._uses -= 1
        if self._uses > 0:
            return  # a unit used twice: its other use has not finished its backward yet
        self.after_backward()

    # -- the root's work --------------------------------------------------------------------------

    def backward_prefetch_units(self) -> list[FSDPUnit]:
        """The units to gather ahead at this unit's pre-backward: the explicit list, else the ones whose
        backward comes next (:meth:`backward_prefetch_targets`, Exercise 4.5)."""
        if self.backward_prefetch is not None:
            return self.backward_prefetch
        by_name = {u.name: u for u in self.root.units}
        return [by_name[n] for n in self.backward_prefetch_targets(self.root.post_forward_order, self.name, 1)]

    def _become_root(self) -> None:
        self.units = find_units(self.module)
        for unit in self.units:
            unit.root = self
        self.post_forward_order: list[str] = []
        self._callback_queued = False
        if self.recorder is not None:
            self.recorder._census = self.held_bytes

    def _start_step(self) -> None:
        if torch.is_grad_enabled():
            self.post_forward_order = []

    def _finish_backward(self) -> None:
        """Queued at the root's pre-backward; autograd runs it when the whole backward is done."""
        for unit in self.units:
            if unit._uses > 0:  # its inputs needed no gradient, so no hook told it
                unit._uses = 1
                unit.post_backward()
        for unit in self.units:
            unit.reshard()
            unit.average_whole_gradients()
        self._callback_queued = False

    def held_bytes(self) -> int:
        """Bytes of parameters and gradients this rank holds now, every unit of the root counted from
        the storages themselves (gathered tensors, full gradients, shards and their grads, an
        all-gather's buffer in flight; a storage several of them view counted once)."""
        storages: dict[int, int] = {}
        for unit in self.units:
            if unit._in_flight is not None:
                buffer = unit._in_flight[1].untyped_storage()
                storages[buffer.data_ptr()] = buffer.nbytes()
            for p in unit.params:
                for t in (p.shard, p.shard.grad, p.full, p.full.grad):
                    if t is not None and t.untyped_storage().nbytes():
                        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return sum(storages.values())

    # -- records ----------------------------------------------------------------------------------

    def event(self, what: str, in_schedule: bool = True) -> None:
        if self.recorder is not None:
            self.recorder.event(what, self.name, in_schedule)

    def record_collective(self, kind: str, full_buffer: torch.Tensor, is_async: bool) -> None:
        self._record(kind, full_buffer.numel(), full_buffer.element_size(), is_async)

    def _record(self, kind: str, numel: int, element_size: int, is_async: bool) -> None:
        if self.recorder is not None:
            self.recorder.collective(kind, self.name, numel, element_size, self.world_size, is_async)
            if kind == "reduce-scatter":
                self.recorder.event("reduce-scatter", self.name)


# -- telling autograd when a unit's backward starts and ends ----------------------------------------


class _PostBackward(torch.autograd.Function):
    """Identity on the unit's inputs; its backward runs once their gradient is computed, which is
    after the unit's own backward: the unit's post-backward."""

    @staticmethod
    def forward(ctx, unit, *inputs):
        ctx.unit = unit
        return inputs

    @staticmethod
    def backward(ctx, *grads):
        ctx.unit.post_backward()
        return (None, *grads)


def _mark_inputs(unit: FSDPUnit, args: tuple) -> tuple:
    positions = [i for i, a in enumerate(args) if torch.is_tensor(a) and a.requires_grad]
    if not positions:
        return args
    marked = _PostBackward.apply(unit, *(args[i] for i in positions))
    args = list(args)
    for i, t in zip(positions, marked):
        args[i] = t
    return tuple(args)


def _mark_outputs(unit: FSDPUnit, output):
    tensors = [t for t in (output if isinstance(output, (tuple, list)) else (output,)) if torch.is_tensor(t)]
    tensors = [t for t in tensors if t.requires_grad]
    if tensors:
        torch.autograd.graph.register_multi_grad_hook(tensors, lambda grads: unit.pre_backward(), mode="any")
    return output
