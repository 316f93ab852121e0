"""When training diverges: which value stopped being a number, at which step, and which setting to
look at.

A run whose loss becomes ``nan`` or ``inf`` is over: every later step computes with it, and a
traceback from deep inside the optimizer says nothing useful. :class:`Watch` follows a run step by
step, in the order the values are made:

1. the **loss** of the step (computed with the weights the previous step left);
2. the **gradient norm** the optimizer is about to step with (when it is given the optimizer: a
   hook before each ``optimizer.step``; after clipping, which cannot repair a non-finite
   gradient: ``max_norm / nan`` is ``nan``);
3. the **weights** after the update.

The first of them that is not finite raises :class:`Diverged`, whose text is the one line a
script prints, e.g. (``python -m minigpt.train --weight-decay 1e4`` on a model of one block)::

    step 8: the loss is nan: training diverged (largest weight 1 at the start, 3.43e+10 before this
    step); look at --weight-decay 10000: with --lr 0.003, AdamW multiplies the weights by 1 - lr x
    weight decay = -29 each step, which grows them once it is below -1; keep lr x weight decay well
    below 1 (the default weight decay is 0.01)

The likely cause is read from the run's settings: the learning rate is the usual one, not the only
one. AdamW's decoupled weight decay multiplies the weights by ``1 - lr x weight_decay`` at every
step, which grows them as soon as that product passes 2 (``--weight-decay 1e4`` above, or a huge
learning rate with the default decay); with clipping off nothing bounds one step; SGD's momentum
adds steps up.

Under torchrun every rank checks its own values. Lab 01 hands it the loss averaged over the ranks,
and data-parallel ranks hold the same weights and gradients, so every rank stops at the same step
with the same line (with its rank). Labs 02 and 03 hand it each rank's own loss and the weights
after the step (Lab 03's gathered in full); a nan in one rank's loss reaches every rank's weights
through the averaged gradient in the same step, so every rank stops there too.
"""

from __future__ import annotations

import math
import signal
import threading
from collections.abc import Iterable

import torch

from minigpt import cli


class Diverged(FloatingPointError):
    """A value of the training became nan or inf; ``str(exc)`` is the line to print after
    ``prog: error:``."""


def stop(prog: str, exc: Diverged) -> int:
    """Print ``exc``'s line as this rank's last word (:func:`minigpt.cli.stop`, exit status 1, which
    it returns). Under torchrun, the first rank to exit makes torchrun stop the others with SIGTERM:
    from here on that signal ends this rank quietly, since its line already says why it stops."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return cli.stop(prog, str(exc))


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's shard on this rank (no communication), a plain tensor as it is."""
    return t.to_local() if hasattr(t, "to_local") else t


def _largest(tensors: list[torch.Tensor]) -> torch.Tensor:
    """max |x| of each tensor (nan when it holds a nan); empty shards count as 0."""
    return torch.stack(
        [t.detach().abs().max().float() if t.numel() else torch.zeros((), device=t.device) for t in tensors]
    ).cpu()


class Watch:
    """Follow one run for divergence. ``cfg`` is its :class:`minigpt.train.TrainConfig` (what the
    advice names); with ``optimizer`` the gradient norm is checked before every step."""

    def __init__(self, model: torch.nn.Module, cfg, optimizer: torch.optim.Optimizer | None = None):
        self.cfg = cfg
        self.named = [(name, p) for name, p in model.named_parameters()]
        self.start = self.before = self._largest_weight(self.named)
        self.grad_norm: float | None = None
        if optimizer is not None:
            optimizer.register_step_pre_hook(self._before_update)

    @staticmethod
    def _largest_weight(named: list[tuple[str, torch.Tensor]]) -> float:
        return float(_largest([_local(p) for _, p in named]).max()) if named else 0.0

    def _before_update(self, optimizer, args, kwargs) -> None:
        grads = [_local(p.grad).detach() for _, p in self.named if p.grad is not None]
        if grads:
            norms = torch.stack([torch.linalg.vector_norm(g.float()) for g in grads])
            self.grad_norm = float(torch.linalg.vector_norm(norms))

    def after_step(self, step: int, loss: float, weights: Iterable[tuple[str, torch.Tensor]] | None = None) -> None:
        """Check step ``step`` (0-based): its ``loss``, the gradient norm seen before its update,
        and the weights after it (``weights``: other (name, tensor) pairs than the model's own, e.g.
        a sharded model's full state gathered). Raises :class:`Diverged`."""
        grad_norm, self.grad_norm = self.grad_norm, None
        named = self.named if weights is None else list(weights)
        largest = _largest([_local(p) for _, p in named]) if named else torch.zeros(1)
        finite = torch.isfinite(largest)
        if not math.isfinite(loss):
            what = f"the loss is {loss}"
        elif grad_norm is not None and not math.isfinite(grad_norm):
            what = f"the gradient norm is {grad_norm} (the loss, {loss:.4g}, was finite)"
        elif not bool(finite.all()):
            k = int((~finite).nonzero()[0])
            what = (
                f"the weight {named[k][0]} is {float(largest[k])} after the update (the loss, {loss:.4g}, was finite)"
            )
        else:
            self.before = float(largest.max())
            return
        raise Diverged(
            f"step {step}: {what}: training diverged (largest weight {self.start:.3g} at the start, "
            f"{self.before:.3g} before this step); {likely_cause(self.cfg)}"
        )


def likely_cause(cfg) -> str:
    """Which setting to look at first, and why, from the run's config."""
    lr, wd = cfg.lr, cfg.weight_decay
    factor = f"1 - lr x weight decay = {1 - lr * wd:.3g}"
    if cfg.optimizer == "adamw" and lr * wd >= 1 and wd >= 1:
        if lr > 1:
            return (
                f"look at --lr {lr:g} and --weight-decay {wd:g}: AdamW moves every weight by up to about lr "
                f"per step, and its weight decay multiplies the weights by {factor} each step; lower both "
                f"(the defaults are 0.003 and 0.01)"
            )
        return (
            f"look at --weight-decay {wd:g}: with --lr {lr:g}, AdamW multiplies the weights by {factor} "
            f"each step, which grows them once it is below -1; keep lr x weight decay well below 1 (the "
            f"default weight decay is 0.01)"
        )
    if cfg.grad_clip == 0:
        return (
            f"look at --lr {lr:g} with clipping off (--grad-clip 0): nothing bounds a step; "
            f"lower --lr, or clip (--grad-clip 1, the default)"
        )
    if cfg.optimizer == "sgd":
        return (
            f"look at --lr {lr:g}: SGD with --momentum {cfg.momentum:g} steps by up to about "
            f"lr / (1 - momentum) x the gradient; lower --lr (Lab 01's SGD run uses 0.1)"
        )
    # a large lr also makes the decay's factor large: say so, it is half of what grew the weights
    also = f", and its weight decay multiplies them by {factor} each step" if lr * wd > 2 else ""
    return (
        f"look at --lr {lr:g}: AdamW moves every weight by up to about lr per step{also}; "
        f"lower it (the default is 0.003)"
    )
