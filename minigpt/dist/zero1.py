"""ZeRO stage 1 for real: an optimizer whose state is sharded over the ranks.

Built like PyTorch's ``torch.distributed.optim.ZeroRedundancyOptimizer``: you give it the
parameters, the class of the optimizer to shard, and that optimizer's settings,

    optimizer = ZeroOneOptimizer(model.parameters(), torch.optim.AdamW, lr=3e-3, betas=(0.9, 0.95))

and use it like any optimizer (``zero_grad``, ``backward``, ``step``), with no DDP wrapper:
it synchronises the gradients itself. What happens, per parameter group:

1. At construction the group's parameters are moved into one flat buffer (each parameter becomes
   a view of it), and so are their gradients: ``param.grad`` is a view of a flat gradient buffer
   that backward accumulates into in place. No copy is ever made, so the model states cost
   exactly 4Ψ (weights) + 4Ψ (gradients) + 8Ψ/N (Adam's m and v, for this rank's shard only)
   in fp32, which is what Lab 02's model predicts for ZeRO-1.
2. The flat buffer is cut into N chunks with :func:`minigpt.dist.ring.chunk_bounds`; rank r owns
   chunk r. The inner optimizer (an ``optimizer_class`` instance) sees only one parameter per
   group: a view of chunk r. Its state is therefore 1/N of the usual.
3. ``step()``: the flat gradient is **reduce-scattered** (Lab 01's ring, averaging), so chunk r
   holds the averaged gradient on rank r (the other chunks hold partial sums and must not be
   read); the inner optimizer updates chunk r in place; the flat weights are **all-gathered**,
   so every rank holds all the new weights. Bytes per rank: (N-1)/N of the gradient plus (N-1)/N
   of the weights, 2(N-1)/N · 4Ψ in all: the same as DDP's all-reduce.
4. Gradient clipping needs the norm of the *whole* averaged gradient, which no rank holds:
   :meth:`clip_grad_norm_` adds the squares of each rank's chunk with an all-reduce of one
   number. ``minigpt.train.train_step`` calls it instead of ``torch.nn.utils.clip_grad_norm_``
   when the optimizer has one.

``zero_grad()`` always zeroes in place (``set_to_none`` is ignored): the gradients must stay
views of the flat buffer.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from minigpt.dist import ring


class ZeroOneOptimizer(torch.optim.Optimizer):
    """ZeRO-1: ``optimizer_class`` run on this rank's shard of every parameter group."""

    def __init__(self, params, optimizer_class: type[torch.optim.Optimizer] = torch.optim.AdamW,
                 process_group: dist.ProcessGroup | None = None, **defaults):
        super().__init__(params, defaults)
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group)
        self.rank = dist.get_rank(process_group)
        self.counter = ring.ByteCounter()  # what this rank sent in the ring collectives
        self.flat_params: list[torch.Tensor] = []
        self.flat_grads: list[torch.Tensor] = []
        self.bounds: list[tuple[int, int]] = []  # this rank's chunk of each group's flat buffer
        self._reduced = False
        local_groups = []
        for group in self.param_groups:
            flat, grad = self._flatten(group["params"])
            self.flat_params.append(flat)
            self.flat_grads.append(grad)
            start, stop = ring.chunk_bounds(flat.numel(), self.world_size)[self.rank]
            self.bounds.append((start, stop))
            shard = torch.nn.Parameter(flat[start:stop])  # shares flat's storage
            shard.grad = grad[start:stop]
            local_groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": [shard]})
        self.local = optimizer_class(local_groups)

    @staticmethod
    def _flatten(params: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Move ``params`` (and their gradients) into one flat buffer each; every parameter and
        its ``.grad`` become views of them."""
        total = sum(p.numel() for p in params)
        first = params[0]
        flat = torch.empty(total, dtype=first.dtype, device=first.device)
        grad = torch.zeros(total, dtype=first.dtype, device=first.device)
        offset = 0
        for p in params:
            n = p.numel()
            flat[offset:offset + n].copy_(p.detach().view(-1))
            p.data = flat[offset:offset + n].view_as(p)
            p.grad = grad[offset:offset + n].view_as(p)
            offset += n
        return flat, grad

    def reduce_gradients(self) -> None:
        """Reduce-scatter every group's flat gradient (average): chunk r is final on rank r.
        Done once per step; :meth:`step` and :meth:`clip_grad_norm_` call it."""
        if self._reduced:
            return
        for grad in self.flat_grads:
            ring.ring_reduce_scatter(grad, "avg", self.process_group, self.counter)
        self._reduced = True

    def shard_grads(self) -> list[torch.Tensor]:
        return [grad[start:stop] for grad, (start, stop) in zip(self.flat_grads, self.bounds)]

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: float, eps: float = 1e-6) -> torch.Tensor:
        """Clip the averaged gradient to ``max_norm`` by its global L2 norm (the sum of the
        squares of every rank's chunk, all-reduced); returns that norm, like
        ``torch.nn.utils.clip_grad_norm_``."""
        self.reduce_gradients()
        local = torch.zeros(1, dtype=torch.float32, device=self.flat_grads[0].device)
        for g in self.shard_grads():
            local += g.float().pow(2).sum()
        ring.ring_all_reduce(local, "sum", self.process_group, self.counter)
        norm = local.sqrt()
        coefficient = torch.clamp(max_norm / (norm + eps), max=1.0)
        for g in self.shard_grads():
            g.mul_(coefficient.to(g.dtype))
        return norm[0]

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.reduce_gradients()
        for group, local in zip(self.param_groups, self.local.param_groups):
            local.update({k: v for k, v in group.items() if k != "params"})  # e.g. the lr schedule
        self.local.step()
        for flat in self.flat_params:
            ring.ring_all_gather(flat, self.process_group, self.counter)
        self._reduced = False
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:  # noqa: ARG002 (always in place)
        for grad in self.flat_grads:
            grad.zero_()
        self._reduced = False

    def state_dict(self):
        """Refused: each rank holds only its shard of the state, so no rank can answer alone.
        :meth:`full_state` gathers it (a collective: every rank calls it)."""
        raise RuntimeError("ZeroOneOptimizer: rank-local state_dict() would hold 1/N of the optimizer state; "
                           "call full_state() on every rank to gather the whole")

    def load_state_dict(self, state_dict):
        raise RuntimeError("ZeroOneOptimizer: cannot load a whole optimizer's state_dict, each rank holds only "
                           "its shard; build it from the same seed and parameters instead")

    def state_bytes(self) -> int:
        """Bytes of optimizer state this rank holds (its shard's m and v for Adam)."""
        return sum(t.numel() * t.element_size() for s in self.local.state.values()
                   for t in s.values() if torch.is_tensor(t) and t.dim() > 0)

    @torch.no_grad()
    def full_state(self) -> list[dict[str, torch.Tensor]]:
        """The whole optimizer state, gathered from every rank: for each parameter group, each
        state tensor (``exp_avg``, ...) as one flat tensor of the group's size, plus ``step``.
        Collective: every rank must call it. Used to check the run against one process."""
        out = []
        for flat, local in zip(self.flat_params, self.local.param_groups):
            state = self.local.state[local["params"][0]]
            group_state = {}
            for key, value in state.items():
                if torch.is_tensor(value) and value.dim() > 0:
                    whole = torch.zeros(flat.numel(), dtype=value.dtype, device=value.device)
                    start, stop = ring.chunk_bounds(flat.numel(), self.world_size)[self.rank]
                    whole[start:stop] = value
                    ring.ring_all_gather(whole, self.process_group, ring.ByteCounter())  # not counted
                    group_state[key] = whole
                else:
                    group_state[key] = value
            out.append(group_state)
        return out

    def load_into(self, optimizer: torch.optim.Optimizer) -> None:
        """Give ``optimizer`` (the same class, over a single-process copy of the model whose
        parameters are in the same order) this optimizer's whole state. Collective."""
        for state, group, flat in zip(self.full_state(), optimizer.param_groups, self.flat_params):
            offset = 0
            for p in group["params"]:
                n = p.numel()
                optimizer.state[p] = {k: (v[offset:offset + n].view_as(p).clone() if torch.is_tensor(v) and v.dim() > 0
                                          else (v.clone() if torch.is_tensor(v) else v))
                                      for k, v in state.items()}
                offset += n
