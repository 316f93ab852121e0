"""ZeRO stage 1 for real: an optimizer whose state is sharded over the ranks.

Built like PyTorch's ``torch.distributed.optim.ZeroRedundancyOptimizer``: you give it the
parameters, the class of the optimizer to shard, and that optimizer's settings,

    optimizer = ZeroOneOptimizer(model.parameters(), torch.optim.AdamW, lr=3e-3, betas=(0.9, 0.95))

and use it like any optimizer (``zero_grad``, ``backward``, ``step``), with no DDP wrapper: it
synchronises the gradients itself. It follows ``torch.optim``'s rules, so it can wrap any model:

* a parameter with ``requires_grad=False`` (frozen) is not in the sharded buffers at all: it
  costs no gradient and no optimizer state, and nothing ever changes it;
* a parameter shared by two modules (tied weights) is one parameter: stored and updated once;
* a parameter that received no gradient in a step, on any rank, is left untouched by that step,
  weights and optimizer state alike, as ``torch.optim`` skips a parameter whose ``.grad`` is None.
  (Zeroing its gradient and stepping would not be the same: AdamW's decoupled weight decay, and
  its momentum, move a weight whose gradient is zero.)

What happens, per parameter group:

1. At construction the group's trainable parameters (:func:`trainable_parameters`) are moved
   into one flat buffer (each parameter becomes a view of it), and so are their gradients:
   ``param.grad`` is a view of a flat gradient buffer that backward accumulates into in place. No
   copy is ever made, so the model states cost exactly 4Ψ (weights) + 4Ψ (gradients) + 8Ψ/N
   (Adam's m and v, for this rank's shard only) in fp32, which is what Lab 02's model predicts.
2. The flat buffer is cut into N chunks with :func:`minigpt.parallel.ring.chunk_bounds`; rank r owns
   chunk r. Where a parameter overlaps chunk r, its *piece* (a view of the flat buffer) is a
   parameter of the inner optimizer (an ``optimizer_class`` instance), whose state is therefore
   1/N of the usual. One piece per parameter, not one per chunk, so that a parameter's piece can
   sit out a step on its own.
3. Backward marks every parameter whose gradient was accumulated (a hook). ``step()``: the marks
   are summed over the ranks (one small all-reduce, like DDP's ``find_unused_parameters``); the
   flat gradient is **reduce-scattered** (Lab 01's ring, averaging), so chunk r holds the averaged
   gradient on rank r; pieces of parameters no rank marked have their ``.grad`` set to None for
   the inner step, which therefore skips them; the flat weights are **all-gathered**, so every
   rank holds all the new weights. Bytes per rank: (N-1)/N of the gradient plus (N-1)/N of the
   weights, 2(N-1)/N · 4Ψ in all (DDP's all-reduce), plus 2(N-1)/N bytes per parameter for the marks.
4. Gradient clipping needs the norm of the *whole* averaged gradient, which no rank holds:
   :meth:`clip_grad_norm_` computes it with an all-reduce of one number.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from minigpt.parallel import ring


def trainable_parameters(params: list[nn.Parameter]) -> list[nn.Parameter]:
    """The parameters of one group that go into the flat buffers: those with ``requires_grad``,
    each once (a tied parameter can be listed twice), in the order given."""
    seen: set[int] = set()
    kept = []
    for p in params:
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            kept.append(p)
    return kept


@dataclass
class FlatGroup:
    """One parameter group's flat buffers, and the pieces of it this rank updates."""

    params: list[nn.Parameter]  # the trainable parameters, views of ``flat``
    offsets: list[tuple[int, int]]  # where each sits in ``flat`` (and in ``grad``)
    flat: torch.Tensor  # the weights
    grad: torch.Tensor  # the gradients; ``param.grad`` are views of it
    chunk: tuple[int, int]  # this rank's part of both
    pieces: list[nn.Parameter] = field(default_factory=list)  # views of flat, one per overlapping parameter
    piece_params: list[int] = field(default_factory=list)  # the parameter (index) of each piece


def flatten(params: list[nn.Parameter], world_size: int, rank: int) -> FlatGroup:
    """Move ``params`` (and their gradients) into one flat buffer each, so that every parameter
    and its ``.grad`` become views of them; cut out this rank's pieces."""
    if not params:
        raise ValueError("flatten needs at least one trainable parameter")
    first = params[0]
    mixed = [p.dtype for p in params if p.dtype != first.dtype or p.device != first.device]
    if mixed:
        raise ValueError(
            f"one flat buffer needs one dtype and device per parameter group; "
            f"got {first.dtype} and {mixed[0]}: put them in separate groups"
        )
    total = sum(p.numel() for p in params)
    flat = torch.empty(total, dtype=first.dtype, device=first.device)
    grad = torch.zeros(total, dtype=first.dtype, device=first.device)
    offsets, offset = [], 0
    for p in params:
        n = p.numel()
        flat[offset : offset + n].copy_(p.detach().view(-1))
        p.data = flat[offset : offset + n].view_as(p)
        p.grad = grad[offset : offset + n].view_as(p)
        offsets.append((offset, offset + n))
        offset += n
    chunk = ring.chunk_bounds(total, world_size)[rank]
    group = FlatGroup(params, offsets, flat, grad, chunk)
    for i, (start, stop) in enumerate(offsets):
        a, b = max(start, chunk[0]), min(stop, chunk[1])
        if a < b:
            piece = nn.Parameter(flat[a:b])  # shares flat's storage
            piece.grad = grad[a:b]
            group.pieces.append(piece)
            group.piece_params.append(i)
    return group


class ZeroOneOptimizer(torch.optim.Optimizer):
    """ZeRO-1: ``optimizer_class`` run on this rank's shard of every parameter group."""

    trainable_parameters = staticmethod(trainable_parameters)

    def __init__(
        self,
        params,
        optimizer_class: type[torch.optim.Optimizer] = torch.optim.AdamW,
        process_group: dist.ProcessGroup | None = None,
        **defaults,
    ):
        super().__init__(params, defaults)
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group)
        self.rank = dist.get_rank(process_group)
        self.counter = ring.ByteCounter()  # what this rank sent in the ring collectives
        self.groups: list[FlatGroup | None] = []  # None: a group with nothing to train
        self._index: dict[int, int] = {}  # id(parameter) -> its place in the usage marks
        local_groups = []
        for group in self.param_groups:
            trainable = [p for p in self.trainable_parameters(group["params"]) if id(p) not in self._index]
            flat = flatten(trainable, self.world_size, self.rank) if trainable else None
            self.groups.append(flat)
            for p in trainable:
                self._index[id(p)] = len(self._index)
                if p.requires_grad:  # (a frozen parameter never gets a gradient, so never a mark)
                    p.register_post_accumulate_grad_hook(self._mark_used)
            settings = {k: v for k, v in group.items() if k != "params"}
            local_groups.append({**settings, "params": flat.pieces if flat else []})
        self.local = optimizer_class(local_groups)
        self.used = torch.zeros(len(self._index), dtype=torch.uint8, device=self._device())
        self._reduced = False

    def _device(self) -> torch.device:
        return next((g.flat.device for g in self.groups if g is not None), torch.device("cpu"))

    def _mark_used(self, param: nn.Parameter) -> None:
        """The hook: ``param`` received a gradient in this backward pass."""
        self.used[self._index[id(param)]] = 1

    @property
    def flat_params(self) -> list[torch.Tensor]:
        return [g.flat for g in self.groups if g is not None]

    @property
    def flat_grads(self) -> list[torch.Tensor]:
        return [g.grad for g in self.groups if g is not None]

    def reduce_gradients(self) -> None:
        """Sum the usage marks over the ranks, and reduce-scatter every group's flat gradient
        (average): chunk r is final on rank r. Done once per step; :meth:`step` and
        :meth:`clip_grad_norm_` call it."""
        if self._reduced:
            return
        self._adopt_gradients()
        ring.ring_all_reduce(self.used, "sum", self.process_group, self.counter)
        for grad in self.flat_grads:
            ring.ring_reduce_scatter(grad, "avg", self.process_group, self.counter)
        self._reduced = True

    def _adopt_gradients(self) -> None:
        """Put every gradient back in the flat buffer if something took it out: a
        ``model.zero_grad()`` sets ``.grad`` to None, and the next backward then makes a new
        tensor that the reduce-scatter would never see."""
        for flat in self.groups:
            if flat is None:
                continue
            for p, (start, stop) in zip(flat.params, flat.offsets):
                if p.grad is not None and p.grad.data_ptr() == flat.grad[start:].data_ptr():
                    continue
                view = flat.grad[start:stop].view_as(p)
                if p.grad is None:
                    view.zero_()
                else:
                    view.copy_(p.grad)
                p.grad = view

    def shard_grads(self) -> list[torch.Tensor]:
        return [g.grad[g.chunk[0] : g.chunk[1]] for g in self.groups if g is not None]

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: float, eps: float = 1e-6) -> torch.Tensor:
        """Clip the averaged gradient to ``max_norm`` by its global L2 norm (the sum of the
        squares of every rank's chunk, all-reduced); returns that norm, like
        ``torch.nn.utils.clip_grad_norm_``. A gradient-less parameter's zeros add nothing.
        ``minigpt.train.train_step`` calls it instead of ``torch.nn.utils.clip_grad_norm_`` when the
        optimizer has one."""
        self.reduce_gradients()
        # the squares summed in the gradients' own dtype: a float64 run's norm in float32 would round
        # the clipping scale to float32 (8.8e-8 of step drift in float64, where 1e-15 is the algorithm)
        dtype = self.flat_grads[0].dtype if self.flat_grads else torch.float32
        local = torch.zeros(1, dtype=dtype, device=self._device())
        for g in self.shard_grads():
            local += g.to(dtype).pow(2).sum()
        ring.ring_all_reduce(local, "sum", self.process_group, self.counter)
        norm = local.sqrt()
        coefficient = torch.clamp(max_norm / (norm + eps), max=1.0)
        for g in self.shard_grads():
            g.mul_(coefficient.to(g.dtype))
        return norm[0]

    @torch.no_grad()
    def step(self, closure=None):
        """Reduce, step this rank's pieces of the parameters that have a gradient, gather."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.reduce_gradients()
        for group, local in zip(self.param_groups, self.local.param_groups):
            local.update({k: v for k, v in group.items() if k != "params"})  # e.g. the lr schedule
        skipped = []
        for flat in self.groups:
            if flat is None:
                continue
            for piece, i in zip(flat.pieces, flat.piece_params):
                if not self.used[self._index[id(flat.params[i])]]:  # no rank had a gradient for it
                    skipped.append((piece, piece.grad))
                    piece.grad = None  # torch.optim skips it: no update, no state change
        self.local.step()
        for piece, grad in skipped:
            piece.grad = grad
        for flat in self.flat_params:
            ring.ring_all_gather(flat, self.process_group, self.counter)
        self._reduced = False
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:  # noqa: ARG002 (always in place)
        """Zero every gradient in place, always (``set_to_none`` is ignored): the gradients must stay
        views of the flat buffer."""
        for grad in self.flat_grads:
            grad.zero_()
        self.used.zero_()
        self._reduced = False

    def state_dict(self):
        """Refused: each rank holds only its shard of the state, so no rank can answer alone.
        :meth:`full_state` gathers it (a collective: every rank calls it)."""
        raise RuntimeError(
            "ZeroOneOptimizer: rank-local state_dict() would hold 1/N of the optimizer state; "
            "call full_state() on every rank to gather the whole"
        )

    def load_state_dict(self, state_dict):
        raise RuntimeError(
            "ZeroOneOptimizer: cannot load a whole optimizer's state_dict, each rank holds only "
            "its shard; build it from the same seed and parameters instead"
        )

    def state_bytes(self) -> int:
        """Bytes of optimizer state this rank holds (its pieces' m and v for Adam)."""
        return sum(
            t.numel() * t.element_size()
            for s in self.local.state.values()
            for t in s.values()
            if torch.is_tensor(t) and t.dim() > 0
        )

    @torch.no_grad()
    def full_state(self) -> list[list[dict[str, torch.Tensor] | None]]:
        """The whole optimizer state, gathered from every rank: per group, per trainable parameter,
        its state as the inner optimizer would hold it for the whole parameter (``exp_avg``, ...
        of the parameter's shape, and ``step``), or None for a parameter that never had a
        gradient. Collective: every rank must call it. The check against one process reads it."""
        out = []
        for flat in self.groups:
            if flat is None:
                out.append([])
                continue
            states = [self.local.state.get(piece, {}) for piece in flat.pieces]
            keys: list = [None] * self.world_size
            dist.all_gather_object(keys, sorted({k for s in states for k in s}), group=self.process_group)
            has_state = torch.zeros(len(flat.params), dtype=torch.float64, device=flat.flat.device)
            scalars: dict[str, torch.Tensor] = {}
            wholes: dict[str, torch.Tensor] = {}
            for key in sorted({k for ks in keys for k in ks}):
                whole = torch.zeros_like(flat.flat)
                scalar = torch.zeros(len(flat.params), dtype=torch.float64, device=flat.flat.device)
                for piece, i, state in zip(flat.pieces, flat.piece_params, states):
                    if key not in state:
                        continue
                    has_state[i] = 1
                    value = state[key]
                    if value.dim() > 0:
                        whole[piece_range(flat, piece)[0] : piece_range(flat, piece)[1]] = value
                    else:
                        scalar[i] = float(value)
                ring.ring_all_gather(whole, self.process_group, ring.ByteCounter())  # not counted
                dist.all_reduce(scalar, op=dist.ReduceOp.MAX, group=self.process_group)
                wholes[key], scalars[key] = whole, scalar
            dist.all_reduce(has_state, op=dist.ReduceOp.MAX, group=self.process_group)
            scalar_keys = {k for s in states for k, v in s.items() if v.dim() == 0} | {"step"}
            params_state = []
            for i, (p, (start, stop)) in enumerate(zip(flat.params, flat.offsets)):
                if not has_state[i]:
                    params_state.append(None)
                    continue
                state = {}
                for key in wholes:
                    if key in scalar_keys:
                        state[key] = torch.tensor(float(scalars[key][i]), dtype=torch.float32)
                    else:
                        state[key] = wholes[key][start:stop].view_as(p).clone()
                params_state.append(state)
            out.append(params_state)
        return out

    def load_into(self, optimizer: torch.optim.Optimizer) -> None:
        """Give ``optimizer`` (the same class, over a single-process copy of the model, with the
        same groups of the same trainable parameters in the same order) this optimizer's whole
        state. Collective."""
        for states, group in zip(self.full_state(), optimizer.param_groups):
            trainable = [p for p in group["params"] if p.requires_grad]
            for p, state in zip(trainable, states):
                if state is None:
                    optimizer.state.pop(p, None)
                else:
                    optimizer.state[p] = state


def piece_range(flat: FlatGroup, piece: nn.Parameter) -> tuple[int, int]:
    """Where ``piece`` (a view of ``flat.flat``) sits in the flat buffer."""
    start = (piece.data_ptr() - flat.flat.data_ptr()) // flat.flat.element_size()
    return start, start + piece.numel()
