"""The ZeRO model made exact for one rank of a real run: every byte a real DDP, ZeRO-1 or FSDP2 run
holds and sends, from the shapes of the parameters alone.

:mod:`minigpt.zero.memory` and :mod:`minigpt.zero.comm` count Ψ parameters of 4 + 4 + 8 bytes
(recipe ``fp32``). A real run differs from them by three terms, each of which this module adds:

* **AdamW's step counters**: one float32 ``step`` per parameter tensor the rank's AdamW updates
  (every tensor for DDP and FSDP2; for ZeRO-1, every *piece* of a parameter that overlaps the rank's
  chunk of the flat buffer);
* **padding**: FSDP2 cuts each parameter along its rows into N equal chunks, padding the rows to a
  multiple of N; the weight and gradient shards are padded, Adam's m and v (made like the rank's
  unpadded part) are not. ZeRO-1 pads nothing: the first ``S % N`` chunks of a flat buffer of S
  elements are one element longer;
* **what a stage holds at a moment**: at the end of forward FSDP2 holds, beside every shard, the
  gathered weights of the units it has not resharded (the root always; every unit with
  ``reshard_after_forward=False``, which is ZeRO-2's memory for the weights) and no gradient yet
  (``zero_grad(set_to_none=True)`` freed them); DDP's buckets and ZeRO-1's flat gradient live on.

Three census points of a step: ``start`` (before forward), ``end_of_forward`` and ``after_step``
(after the optimizer step, before ``zero_grad``). The bytes sent are exact when the ring's chunks are
equal (always on 2 ranks). ``lab/02_crosscheck.py --sizes`` holds real runs against it.
"""

from __future__ import annotations

from collections.abc import Sequence

from minigpt.zero import analytic as za, comm, memory

POINTS = ("start", "end_of_forward", "after_step")
FP32 = 4  # bytes of a weight, a gradient, a step counter


def _numel(shape: Sequence[int]) -> int:
    total = 1
    for d in shape:
        total *= d
    return total


def _local_elements(shape: Sequence[int], n: int, rank: int) -> int:
    """Elements of one parameter that FSDP2's shard ``rank`` holds, padding left out (``torch.chunk``
    of the rows: chunks of ceil(rows / N) rows, the last ones shorter or empty)."""
    rows = shape[0]
    per_chunk = -(-rows // n)
    return max(0, min(per_chunk, rows - rank * per_chunk)) * (_numel(shape) // rows)


def _zero1_chunk(shapes: Sequence[Sequence[int]], n: int, rank: int) -> tuple[int, int]:
    """(elements, pieces) of ZeRO-1's chunk ``rank``, over its two flat buffers: MiniGPT's AdamW
    groups, matrices (weight decay) then vectors (none), each in the order of ``parameters()``."""
    elements = pieces = 0
    for group in ([s for s in shapes if len(s) >= 2], [s for s in shapes if len(s) < 2]):
        sizes = [_numel(s) for s in group]
        base, extra = divmod(sum(sizes), n)
        lo = rank * base + min(rank, extra)
        hi = lo + base + (1 if rank < extra else 0)
        elements += hi - lo
        offset = 0
        for size in sizes:
            pieces += max(offset, lo) < min(offset + size, hi)
            offset += size
    return elements, pieces


def per_rank(stage: int, shapes: Sequence[Sequence[int]], units: Sequence[int], n: int, rank: int) -> dict:
    """Bytes rank ``rank`` of ``n`` sends per step and holds at each census point, at ``stage``.

    ``shapes``: every trainable parameter once (tied weights once), in ``parameters()`` order;
    ``units[i]``: the FSDP2 unit of parameter i (0: the root, which backward needs first, so FSDP2
    never reshards it after forward; 1, 2, ...: the blocks, in order). Stages 2 and 3 are FSDP2
    with and without ``reshard_after_forward``; 0 is a ring all-reduce DDP; 1 is a ZeRO-1 that
    all-reduces a one-byte mark per tensor and the squared norm (4 bytes) besides its gradients."""
    psi, tensors = sum(_numel(s) for s in shapes), len(shapes)
    out: dict = {"stage": stage, "params": psi, "zero_model_states": memory.device_memory(psi, n, stage, "fp32").device}
    if stage in (0, 1):
        m = memory.device_memory(psi, n, stage, "fp32")
        sent = comm.bytes_per_step(psi, stage, n, "fp32")
        if stage == 0:
            held = m.device + FP32 * tensors
        else:
            elements, pieces = _zero1_chunk(shapes, n, rank)
            held = m.params + m.grads + 8 * elements + FP32 * pieces
            sent += za.ring_bytes_per_worker(tensors, n) + za.ring_bytes_per_worker(FP32, n)
        return {**out, "bytes": round(sent), **{point: round(held) for point in POINTS}}
    if stage not in (2, 3):
        raise ValueError(f"stage {stage!r} does not exist; choose one of 0 (DDP), 1, 2, 3")
    n_units = max(units) + 1
    padded = [0] * n_units
    for shape, unit in zip(shapes, units):
        padded[unit] += comm.padded(shape[0], n) * (_numel(shape) // shape[0])
    psi_padded = sum(padded)
    reshard = [False] + [stage == 3] * (n_units - 1)
    sent = sum(c.bytes_sent for c in comm.unit_collectives(padded, stage, n, FP32, FP32, reshard, pad=False))
    shards = FP32 * psi_padded // n  # the weight shards (a gradient shard is the same size)
    moments = 8 * sum(_local_elements(s, n, rank) for s in shapes)
    start = shards + moments + FP32 * tensors
    gathered = FP32 * (psi_padded if stage == 2 else padded[0])
    return {
        **out,
        "padded_params": psi_padded,
        "bytes": round(sent),
        "start": start,
        "end_of_forward": start + gathered,
        "after_step": start + shards,
    }
