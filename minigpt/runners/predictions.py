"""What the code measures for each prediction of :mod:`minigpt.predictions`, run on this machine.

Each measurement runs the course's own code and counts what the question asks: a ring of the numpy
simulator (Lab 02's, the same chunks and order as Lab 01's ring), the real DDP's buckets, ZeRO's simulated
workers, FSDP2's event order, our FSDP and tensor- and context-parallel MiniGPT on a pretend process group of
PyTorch (``fake``: every collective is called and counted, nothing is sent, so what is counted is exact), the
pipeline's schedule simulator, Lab 07's mesh. :func:`answer` is what the graded tests compare with it.
"""

from __future__ import annotations

from functools import cache

from minigpt.predictions import QUESTIONS, NotAnswered, name_of, task

TWO_RANKS, FOUR_RANKS, EIGHT_WORKERS = 2, 4, 8


def _ring_bytes_on_four() -> int:
    """Lab 01's ring all-reduce of MiniGPT's float32 gradients (507,552 numbers, one buffer) on 4 ranks,
    run by the numpy simulator's ring (the same chunks and order as ``minigpt/parallel/ring.py``): what
    rank 0 sends."""
    import numpy as np

    from minigpt.zero import mlp, simulate

    cluster = simulate.Cluster(FOUR_RANKS, mlp.MLPSpec((63_443, 8)))  # one unit of 63,443 x 8 + 8 = 507,552
    buffers = [np.ones(cluster.padded[0], np.float32) for _ in range(FOUR_RANKS)]
    cluster.all_reduce(buffers, 0)
    return cluster.workers[0].sent


def _buckets_at_quarter_mib() -> int:
    from minigpt.parallel.ddp import assign_buckets
    from minigpt.train import TrainConfig, build_model

    return len(assign_buckets(build_model(TrainConfig()), int(0.25 * 2**20)))


def _zero_bytes(stage: int) -> int:
    from minigpt.zero import simulate

    return simulate.simulate(stage, EIGHT_WORKERS, steps=1).bytes_sent_per_step[0]


def _fsdp2_all_gathers(variant: str) -> int:
    from minigpt.fsdp.variants import predict_event_order

    return sum(e.startswith("all-gather") for e in predict_event_order(4, variant))


def _fake_world(world_size: int):
    """A pretend process group of ``world_size`` ranks in this process (rank 0), PyTorch's ``fake``
    backend: every collective is accepted and sends nothing, so the course's counters count exactly
    what a real run would send, without a second process."""
    import contextlib

    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    @contextlib.contextmanager
    def world():
        if dist.is_initialized():
            raise RuntimeError("a process group already exists in this process: the measurement needs its own")
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
        try:
            yield
        finally:
            dist.destroy_process_group()

    return world()


@cache
def _our_fsdp_step(reshard_after_forward: bool = True, world_size: int = FOUR_RANKS):
    """One forward and backward of MiniGPT under our FSDP (each block a unit, then the root) on
    ``world_size`` ranks: the step's record (bytes sent, peak of parameters and gradients held)."""
    from minigpt import grammar
    from minigpt.parallel import fsdp_by_hand as fsdp
    from minigpt.train import TrainConfig, build_model

    cfg = TrainConfig()
    with _fake_world(world_size):
        model, recorder = build_model(cfg), fsdp.Recorder()
        for block in model.blocks:
            fsdp.fully_shard(block, recorder=recorder, reshard_after_forward=reshard_after_forward)
        fsdp.fully_shard(model, recorder=recorder)
        x, y, mask = grammar.get_batch("train", 0, cfg.batch_size, 0, world_size, seed=0, block_size=cfg.block_size)
        recorder.begin()
        model(x, y, mask)[1].backward()
        return recorder.steps[-1]


def _blocks_more_held_without_resharding() -> float:
    """How much more one rank holds at the step's peak (4 ranks) when the blocks keep their gathered
    parameters after forward, in blocks: the two peaks' difference over one block's parameters gathered
    (111,456 float32 numbers, 445,824 bytes)."""
    from minigpt.train import TrainConfig, build_model

    block = 4 * sum(p.numel() for p in build_model(TrainConfig()).blocks[0].parameters())  # bytes
    return (_our_fsdp_step(False).peak_held - _our_fsdp_step(True).peak_held) / block


def _tp_bytes() -> int:
    """One forward and backward of MiniGPT with tensor parallelism (no sequence parallelism) on 2 ranks:
    what one rank sends, counted by the layers' own counter."""
    from minigpt import grammar
    from minigpt.parallel.ring import ByteCounter
    from minigpt.parallel.tensor_parallel.model import TPMiniGPT
    from minigpt.train import TrainConfig, build_model

    cfg = TrainConfig()
    with _fake_world(TWO_RANKS):
        counter = ByteCounter()
        model = TPMiniGPT(build_model(cfg), counter=counter)
        x, y, mask = grammar.get_batch("train", 0, cfg.batch_size, seed=0, block_size=cfg.block_size)
        counter.reset()
        model(x, y, mask)[1].backward()
        return counter.sent


def _cp_bytes() -> int:
    """One forward and backward of MiniGPT with context parallelism (ring attention, load-balanced) on 2
    ranks: what one rank sends through the ring, counted by ring attention's counter."""
    from minigpt import grammar
    from minigpt.parallel.ring import ByteCounter
    from minigpt.parallel.tensor_parallel.context_parallel import CPMiniGPT
    from minigpt.train import TrainConfig, build_model

    cfg = TrainConfig()
    with _fake_world(TWO_RANKS):
        counter = ByteCounter()
        model = CPMiniGPT(build_model(cfg), load_balanced=True, counter=counter)
        x, y, mask = grammar.get_batch("train", 0, cfg.batch_size, seed=0, block_size=cfg.block_size)
        counter.reset()
        model(x, y, mask)[1].backward()
        return counter.sent


def _pipeline(what: str) -> float:
    from minigpt.zero import pipeline

    ops = pipeline.simulate("1f1b", 4, 8)
    return pipeline.measured_bubble_fraction(ops) if what == "bubble" else pipeline.peak_in_flight(ops, 0)


def _mesh_group(dims: str) -> list[int]:
    from minigpt.parallel.mesh.nd import mesh_groups

    degrees = {"dp_replicate": 2, "dp_shard": 2, "cp": 1, "tp": 2}
    return list(next(g for g in mesh_groups(degrees, dims) if 5 in g))


MEASURES = {
    "P1.1": _ring_bytes_on_four,
    "P1.2": _buckets_at_quarter_mib,
    "P2.1": lambda: _zero_bytes(2),
    "P2.2": lambda: _zero_bytes(3),
    "P3.1": lambda: _fsdp2_all_gathers("fsdp2-implicit"),
    "P3.2": lambda: _fsdp2_all_gathers("fsdp2-no-reshard"),
    "P4.1": lambda: _our_fsdp_step().bytes_sent(),
    "P4.2": _blocks_more_held_without_resharding,
    "P5.1": _tp_bytes,
    "P5.2": _cp_bytes,
    "P6.1": lambda: _pipeline("bubble"),
    "P6.2": lambda: _pipeline("held"),
    "P7.1": lambda: _mesh_group("tp"),
    "P7.2": lambda: _mesh_group("dp_shard"),
}
assert set(MEASURES) == set(QUESTIONS)


@cache
def measure(question: str):
    """What the course's code measures for ``question`` on this machine; once per process: the measurements
    are deterministic (counts of bytes, calls and ranks)."""
    return MEASURES[question]()


def answer(question: str):
    """The answer to ``question``: the learner's, from ``lab/exercises/predictions.py`` (or the folder
    ``MINIGPT_EXERCISES_DIR`` names), or, for the reference (``MINIGPT_IMPL=reference``), what the code
    measures. :class:`NotAnswered` while it is None."""
    from minigpt import impl

    if impl.current() == "reference":
        return measure(question)
    value = getattr(impl.exercise_module("predictions"), name_of(question), None)
    if value is None:
        raise NotAnswered(task(question))
    return value
