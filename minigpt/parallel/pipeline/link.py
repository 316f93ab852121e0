"""The wires between neighbouring stages: activations go down the pipe, their gradients come back.

Stage s talks to two ranks only: the previous stage (it receives activations from it and sends it
their gradients) and the next stage (the other way round). Every message carries its micro-batch's
number as its *tag*, so a receive takes exactly the tensor of the micro-batch it asks for, whatever
else is in flight. Sends are posted asynchronously (``isend``: a stage never waits for its
neighbour to be ready to listen) and waited for at the end of the step; receives block, bounded by
the timeout of the process group: a stage that waits longer raises :class:`PipelineTimeout`, which
says which stage waited for what, from whom. The bytes passed to ``isend`` are counted.

On GPUs (NCCL) the tag travels nowhere: NCCL matches the messages between two ranks in the order
they were posted. The schedules keep that order on both ends of every wire (each stage forwards the
micro-batches in the order its predecessor does, and runs their backwards in the order its
successor does), which :func:`~minigpt.parallel.pipeline.schedule.check_posting_order` checks.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from minigpt.parallel.ring import ByteCounter


class PipelineTimeout(RuntimeError):
    """A stage waited longer than the timeout for a tensor from a neighbour."""


class Link:
    """Stage ``stage``'s sends and receives. ``ranks[s]`` is the global rank of stage s; the
    activations of one micro-batch have ``shape`` and ``dtype`` and live on ``device`` (the
    stage's: NCCL receives into GPU memory only)."""

    def __init__(
        self,
        stage: int,
        ranks: list[int],
        shape: tuple[int, ...],
        dtype: torch.dtype,
        timeout_s: float,
        counter: ByteCounter | None = None,
        device: torch.device | str = "cpu",
    ):
        self.stage, self.ranks, self.shape, self.dtype = stage, ranks, shape, dtype
        self.device = torch.device(device)
        self.timeout_s = timeout_s
        self.counter = ByteCounter() if counter is None else counter
        self.prev = ranks[stage - 1] if stage > 0 else None
        self.next = ranks[stage + 1] if stage + 1 < len(ranks) else None
        self.pending: list[tuple[dist.Work, torch.Tensor]] = []
        self.waited_s = 0.0  # time spent blocked in receives since the last reset

    def _send(self, tensor: torch.Tensor, dst: int | None, micro_batch: int) -> None:
        if dst is None:
            raise ValueError(f"stage {self.stage} has no neighbour to send micro-batch {micro_batch} to")
        tensor = tensor.contiguous()
        self.pending.append((dist.isend(tensor, dst=dst, tag=micro_batch), tensor))
        self.counter.sent += tensor.numel() * tensor.element_size()
        self.counter.messages += 1

    def _recv(self, src: int | None, micro_batch: int, what: str, other: int) -> torch.Tensor:
        if src is None:
            raise ValueError(f"stage {self.stage} has no neighbour to receive {what} of micro-batch {micro_batch} from")
        tensor = torch.empty(self.shape, dtype=self.dtype, device=self.device)
        t0 = time.perf_counter()
        try:
            dist.recv(tensor, src=src, tag=micro_batch)
            if tensor.is_cuda:  # NCCL's recv returns once the transfer is queued: the wait is for its data
                torch.cuda.synchronize(tensor.device)
        except RuntimeError as exc:
            if "Timed out" not in str(exc) and "timeout" not in str(exc).lower():
                raise
            raise PipelineTimeout(
                f"stage {self.stage} (rank {self.ranks[self.stage]}) waited {self.timeout_s:g} s for {what} of "
                f"micro-batch {micro_batch} from stage {other} (rank {src}): the stages' schedules wait for each "
                "other (a deadlock), or that stage stopped; check the schedule with check_schedule"
            ) from None
        self.waited_s += time.perf_counter() - t0
        self.counter.received += tensor.numel() * tensor.element_size()
        return tensor

    def send_activation(self, tensor: torch.Tensor, micro_batch: int) -> None:
        """Send this stage's output for ``micro_batch`` down to the next stage."""
        self._send(tensor, self.next, micro_batch)

    def recv_activation(self, micro_batch: int) -> torch.Tensor:
        """The previous stage's output for ``micro_batch`` (blocks until it arrives)."""
        return self._recv(self.prev, micro_batch, "the activations", self.stage - 1)

    def send_gradient(self, tensor: torch.Tensor, micro_batch: int) -> None:
        """Send the gradient of this stage's input for ``micro_batch`` back to the previous stage."""
        self._send(tensor, self.prev, micro_batch)

    def recv_gradient(self, micro_batch: int) -> torch.Tensor:
        """The gradient of this stage's output for ``micro_batch``, from the next stage."""
        return self._recv(self.next, micro_batch, "the gradient", self.stage + 1)

    def wait_sends(self) -> None:
        """Wait until every posted send has left (their buffers can then be freed)."""
        for work, _ in self.pending:
            work.wait()
        self.pending.clear()
