"""Running a schedule: one training step of a pipeline, operation by operation.

Every stage (one rank each) runs its own list of operations (:mod:`.schedule`):

* ``F i`` (:func:`forward_step`): take micro-batch i's input (the tokens on the first stage, the
  activations received from the previous stage otherwise), run this stage's layers, and send the
  output on (the last stage computes the loss instead). Autograd's graph of the step stays alive:
  the stage *holds* micro-batch i (its input and output) until ``B i``.
* ``B i`` (:func:`backward_step`): receive the gradient of the output from the next stage (the last
  stage starts from its loss), run backward through this stage's graph, and send the gradient of
  the input back. The stage drops micro-batch i.

The received activations are leaves of this stage's graph: ``requires_grad_()`` on them is what
makes backward compute the gradient the previous stage needs. Each micro-batch's loss is scaled by
1/m, so the gradients summed over the m micro-batches are those of the whole batch's mean loss
(MiniGPT's loss is a mean of per-sentence means, see :func:`minigpt.model.masked_loss`).

After the schedule, the two copies of the tied embedding matrix swap gradients
(:func:`sync_tied_gradient`), the gradient norm of the whole model is put together from every
stage's share (:func:`clip_grad_norm_`), and each stage's optimizer steps its own parameters.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from minigpt.parallel.pipeline.link import Link
from minigpt.parallel.pipeline.schedule import Op
from minigpt.parallel.pipeline.stage import PipelineStage
from minigpt.parallel.ring import ByteCounter, ring_all_reduce

TIED_TAG = 1_000_000  # the tag of the tied matrix's gradient swap (micro-batches use 0..m-1)


@dataclass
class MicroBatches:
    """A batch cut into ``m`` equal micro-batches: token ids, targets and loss masks, each ``(B/m, T)``."""

    tokens: list[torch.Tensor]
    targets: list[torch.Tensor]
    masks: list[torch.Tensor]

    @classmethod
    def cut(cls, x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor, m: int) -> MicroBatches:
        if m < 1 or len(x) % m:
            raise ValueError(f"a batch of {len(x)} sequences cannot be cut into {m} equal micro-batches")
        return cls(list(x.chunk(m)), list(y.chunk(m)), list(mask.chunk(m)))

    def __len__(self) -> int:
        return len(self.tokens)


def forward_step(
    stage: PipelineStage, i: int, batches: MicroBatches, link: Link, held: dict[int, tuple], scale: float
) -> float | None:
    """``F i`` on ``stage``: returns micro-batch i's loss on the last stage (unscaled), else None.

    ``held[i]`` keeps ``(input, output)`` for the backward: the input is None on the first stage
    (token ids have no gradient); the output is the loss times ``scale`` on the last stage."""
    if stage.is_first:
        inputs = batches.tokens[i]
    else:
        inputs = link.recv_activation(i).requires_grad_()
    outputs = stage(inputs)
    if stage.is_last:
        loss = stage.loss(outputs, batches.targets[i], batches.masks[i])
        held[i] = (None if stage.is_first else inputs, loss * scale)
        return loss.item()
    link.send_activation(outputs.detach(), i)
    held[i] = (None if stage.is_first else inputs, outputs)
    return None


def backward_step(stage: PipelineStage, i: int, link: Link, held: dict[int, tuple]) -> None:
    """``B i`` on ``stage``: backward through micro-batch i's graph, and the input's gradient sent back."""
    inputs, outputs = held.pop(i)
    if stage.is_last:
        outputs.backward()
    else:
        outputs.backward(link.recv_gradient(i))
    if not stage.is_first:
        link.send_gradient(inputs.grad, i)


@dataclass
class StepRecord:
    """What one stage saw during one step: its operations' times, its busy time, its peak."""

    loss: float = 0.0  # the batch's mean loss (last stage only)
    ops: list[tuple[str, int, float, float]] = field(
        default_factory=list
    )  # (kind, i, start, end) from the step's start
    seconds: float = 0.0  # the whole step on this stage, from its first operation to its last send
    waited_s: float = 0.0  # blocked in receives
    peak_held: int = 0  # most micro-batches held at once

    @property
    def busy_s(self) -> float:
        return self.seconds - self.waited_s


def run_schedule(
    stage: PipelineStage,
    order: list[Op],
    batches: MicroBatches,
    link: Link,
    forward: Callable = forward_step,
    backward: Callable = backward_step,
) -> StepRecord:
    """Run this stage's ``order`` for one step (gradients accumulate into ``.grad``). On a GPU the
    kernels run after their call returns, so the clock waits for them after every operation: the
    times of the record are the device's, not the moments the work was queued."""
    m = len(batches)
    held: dict[int, tuple] = {}
    record = StepRecord()
    link.waited_s = 0.0
    device = next(stage.parameters()).device
    settle = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    t0 = time.perf_counter()
    for kind, i in order:
        start = time.perf_counter() - t0
        if kind == "F":
            loss = forward(stage, i, batches, link, held, 1.0 / m)
            if stage.is_last:
                record.loss += loss / m
        else:
            backward(stage, i, link, held)
        settle()
        record.ops.append((kind, i, start, time.perf_counter() - t0))
        record.peak_held = max(record.peak_held, len(held))
    link.wait_sends()
    settle()
    record.seconds = time.perf_counter() - t0
    record.waited_s = link.waited_s
    if held:
        raise ValueError(f"stage {stage.stage}'s schedule ended with micro-batches {sorted(held)} never run backward")
    return record


@torch.no_grad()
def forward_only(stage: PipelineStage, batches: MicroBatches, link: Link) -> torch.Tensor | None:
    """The logits of every micro-batch through the stages, in order, with no gradient and no
    schedule (each stage forwards each micro-batch as it arrives): on the last stage, None on the
    others. The sends are waited for before it returns."""
    logits = []
    for i in range(len(batches)):
        inputs = batches.tokens[i] if stage.is_first else link.recv_activation(i)
        outputs = stage(inputs)
        if stage.is_last:
            logits.append(outputs)
        else:
            link.send_activation(outputs, i)
    link.wait_sends()
    return torch.cat(logits) if logits else None


def sync_tied_gradient(stage: PipelineStage, first_rank: int, last_rank: int, counter: ByteCounter) -> None:
    """The first and the last stage swap the gradients of their copies of the tied matrix and both
    keep the sum (``a + b`` is ``b + a`` exactly: the copies stay bit-identical)."""
    weight = stage.tied_weight()
    if weight is None:
        return
    other = last_rank if stage.is_first else first_rank
    mine = weight.grad if weight.grad is not None else torch.zeros_like(weight)
    theirs = torch.empty_like(mine)
    request = dist.isend(mine.contiguous(), dst=other, tag=TIED_TAG)
    dist.recv(theirs, src=other, tag=TIED_TAG)
    request.wait()
    counter.sent += mine.numel() * mine.element_size()
    counter.messages += 1
    weight.grad = mine + theirs


def clip_grad_norm_(
    stage: PipelineStage, max_norm: float, model_names: list[str], counter: ByteCounter
) -> torch.Tensor:
    """Clip by the whole model's gradient norm, computed exactly as ``torch.nn.utils.clip_grad_norm_``
    computes it in one process: the norm of the vector of every parameter's gradient norm, in the
    model's parameter order (``model_names``: MiniGPT's, the tied matrix once).

    Each stage writes its parameters' norms into their places of a vector of zeros (the tied matrix
    on the first stage only), and Lab 01's ring all-reduce sums the stages' vectors: each entry is
    one stage's number plus zeros, so every rank gets the same vector one process would stack. A
    norm put together another way (say the square root of a float64 sum of squares) differs in the
    last bits, and AdamW can amplify that difference: the lab page shows by how much."""
    grads = {name: p.grad for name, p in stage.named_in_model() if p.grad is not None}
    first = next(iter(grads.values()))
    norms = torch.zeros(len(model_names), dtype=first.dtype, device=first.device)
    for i, name in enumerate(model_names):
        if name in grads:
            norms[i] = torch.linalg.vector_norm(grads[name])
    total = torch.linalg.vector_norm(ring_all_reduce(norms, "sum", None, counter))
    torch.nn.utils.clip_grads_with_norm_([p for p in stage.parameters() if p.grad is not None], max_norm, total)
    return total


def step_bytes_model(stages: int, stage: int, batch: int, seq: int, n_embd: int, vocab: int, element_size: int) -> int:
    """Bytes stage ``stage`` passes to ``isend`` in one step (the norm's all-reduce aside): the
    activations of the whole batch down (all but the last stage), their gradients back up (all but
    the first), and the tied matrix's gradient (the first and the last, when there are two)."""
    activations = batch * seq * n_embd * element_size
    tied = vocab * n_embd * element_size if stages > 1 and stage in (0, stages - 1) else 0
    return activations * (stage < stages - 1) + activations * (stage > 0) + tied


def bubble_fraction(records: list[StepRecord]) -> float:
    """Measured idle share of a step: 1 - (busy time of every stage) / (stages x the longest stage's
    step), where busy = the step minus the time blocked in receives."""
    makespan = max(r.seconds for r in records)
    return 1 - sum(r.busy_s for r in records) / (len(records) * makespan)
