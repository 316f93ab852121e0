"""The profiler's trace (minigpt/profiler.py): which steps are recorded, what a Chrome trace file must
hold, and the overlap read from its events, on a trace written here with known times; and the real
trace of a short run of every lab that writes one (--trace), read back: valid gzipped Chrome trace
JSON with the collectives where the lab says they are."""

from __future__ import annotations

import gzip
import json

import pytest

from minigpt import profiler


def test_the_recorded_steps_come_after_the_first_ones():
    assert profiler.traced_steps(450) == range(5, 8)
    assert profiler.traced_steps(6) == range(3, 6)
    assert profiler.traced_steps(2) == range(0, 2)
    assert profiler.traced_steps(450, steps=1) == range(5, 6)


def event(name: str, ts: float, dur: float, tid: int = 1, **extra) -> dict:
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "pid": 7, "tid": tid, **extra}


# one step of 100 ms from t = 1000 us: backward from 40 to 90 ms on the training thread (tid 1); two
# all-reduces on gloo's thread (tid 2): 50-60 ms (under backward) and 85-95 ms (half under it); a
# loss all-reduce after the step's bar (not the step's); another system's step after it
STEP = [
    event("bucketed step 5", 1000, 100_000),
    event("aten::mm", 2000, 5000),
    event(profiler.BACKWARD + "MmBackward0", 41_000, 20_000),
    event(profiler.BACKWARD + "EmbeddingBackward0", 70_000, 21_000),
    event("gloo:all_reduce", 51_000, 10_000, tid=2),
    event("gloo:all_reduce", 86_000, 10_000, tid=2),
    event("gloo:all_reduce", 102_000, 1000, tid=2),
    event("torch-ddp step 5", 110_000, 50_000),
    event(profiler.BACKWARD + "MmBackward0", 130_000, 10_000),
]


def test_the_overlap_is_read_from_the_events():
    (step,) = profiler.steps(sorted(STEP, key=lambda e: e["ts"]), "bucketed")
    assert step["step"] == 5 and step["step_ms"] == 100.0
    assert step["backward_ms"] == [40.0, 90.0]
    assert [(c["start_ms"], c["end_ms"], c["under_backward_ms"]) for c in step["collectives"]] == [
        (50.0, 60.0, 10.0),
        (85.0, 95.0, 5.0),
    ]
    assert step["collective_ms"] == 20.0 and step["hidden_ms"] == 15.0 and step["exposed_ms"] == 5.0
    assert step["hidden_share"] == 0.75
    (other,) = profiler.steps(sorted(STEP, key=lambda e: e["ts"]), "torch-ddp")
    assert other["backward_ms"] == [20.0, 30.0] and other["collectives"] == []


def test_overlapping_collectives_are_counted_once():
    """Two collectives in flight at once (gloo has two threads) are one stretch of communication."""
    events = [
        event("fsdp step 0", 0, 100_000),
        event(profiler.BACKWARD + "X", 0, 50_000),
        event("gloo:all_gather", 10_000, 20_000, tid=2),
        event("gloo:all_reduce", 20_000, 20_000, tid=3),
    ]
    (step,) = profiler.steps(events, "fsdp")
    assert step["collective_ms"] == 30.0 and step["hidden_ms"] == 30.0 and step["exposed_ms"] == 0.0


def test_nccl_kernels_are_collectives():
    assert profiler.is_collective({"name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "cat": "kernel"})
    assert profiler.is_collective({"name": "nccl:all_reduce"}) and profiler.is_collective({"name": "gloo:barrier"})
    assert not profiler.is_collective({"name": "aten::mm", "cat": "cpu_op"})


def test_a_file_that_is_not_a_trace_is_refused_with_why(tmp_path):
    (tmp_path / "a.json").write_text("not json")
    (tmp_path / "b.json").write_text('{"events": []}')
    (tmp_path / "c.json").write_text(json.dumps({"traceEvents": [{"ph": "X", "name": "x", "ts": 1}]}))
    (tmp_path / "d.json.gz").write_bytes(b"not gzip")
    for name, why in (
        ("a.json", "not a Chrome trace JSON file"),
        ("b.json", "no traceEvents list"),
        ("c.json", "without a name, ts or dur"),
        ("d.json.gz", "not a Chrome trace JSON file"),
    ):
        with pytest.raises(ValueError, match=why):
            profiler.read(tmp_path / name)


def test_a_gzipped_trace_reads_as_its_events_sorted(tmp_path):
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": [*STEP[::-1], {"ph": "M", "name": "meta"}]}).encode()))
    events = profiler.read(path)
    assert [e["ts"] for e in events] == sorted(e["ts"] for e in STEP)


def check_trace(path, world_size: int, *whats: str) -> dict[str, list[dict]]:
    """A trace a lab wrote: gzipped Chrome trace JSON (what Perfetto opens: a traceEvents list of complete
    events with names, ts and dur, and the processes' metadata), with a labelled bar per traced step of
    each of ``whats``; returns, for each, those steps as :func:`minigpt.profiler.steps` reads them. The
    file is read once for all of them (a lab's trace is a few megabytes of JSON)."""
    data = json.loads(gzip.decompress(path.read_bytes()))
    assert isinstance(data["traceEvents"], list) and data["traceEvents"], path
    assert any(e.get("ph") == "M" and e.get("name") == "thread_name" for e in data["traceEvents"]), path
    assert data.get("distributedInfo", {}).get("world_size") == world_size, data.get("distributedInfo")
    events = profiler.read(path)
    found = {what: profiler.steps(events, what) for what in whats}
    assert all(found.values()), f"{path}: no bar named '<what> step N' for {[w for w, s in found.items() if not s]}"
    return found
