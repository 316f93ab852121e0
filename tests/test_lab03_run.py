"""Lab 03's machinery: the real lab run on two ranks, every variant, checked against what the
model's shapes and FSDP's rules imply (no points; the graded checks live elsewhere).

One launch (tests/launcher.py + tests/fsdp_worker.py: the lab's own ``main`` on two ranks)
trains every variant a few steps and writes the report and the trace files; the tests read them.
The expected counts and bytes are computed here from MiniGPT's parameter shapes and the world
size, not taken from the code under test.
"""

from __future__ import annotations

import json
import math
from concurrent.futures import Future
from pathlib import Path

import pytest

from minigpt.fsdp.variants import VARIANTS, predict_all_gather_order, predict_event_order
from minigpt.model import MiniGPT
from minigpt.runners.lab03_fsdp_prefetch import main
from minigpt.train import TrainConfig
from tests import background
from tests.launcher import ROOT, run_ranks
from tests.limits import limit

WORLD, STEPS = 2, 3
FLOAT32 = 4
FORWARD_PREFETCH = {"fsdp2-explicit-forward", "fsdp2-async-explicit", "fsdp1-forward-prefetch"}
BACKWARD_DEPTH_2 = {"fsdp2-explicit-backward", "fsdp2-async-explicit"}
BACKWARD_PRE_DEPTH_1 = {
    "fsdp2-implicit",
    "fsdp2-explicit-forward",
    "fsdp2-async-unshard",
    "fsdp1-backward-pre",
    "fsdp1-forward-prefetch",
}
ASYNC = {"fsdp2-async-unshard", "fsdp2-async-explicit"}


def run_variants(out: Path) -> dict:
    """The report of one 2-rank run of every variant, and where its trace files are: on the suite's
    second lane (tests/background.py), from collection on; the tests that read it run last."""
    report, traces = out / "report.json", out / "traces"
    results, errors = run_ranks(
        ROOT / "tests" / "fsdp_worker.py",
        WORLD,
        out,
        timeout_s=limit(240),
        args=[
            "--variants",
            "all",
            "--steps",
            str(STEPS),
            "--report",
            str(report),
            "--trace-dir",
            str(traces),
            "--trace",
            str(out / "profiler"),
            "--quiet",
        ],
    )
    for rank, (result, error) in enumerate(zip(results, errors)):
        assert result.get("exit_code") == 0, f"rank {rank}: {result} {error}"
    return {"report": json.loads(report.read_text()), "traces": traces, "json": report, "profiler": out / "profiler"}


def submit(config: pytest.Config) -> Future:
    return background.launch(config, "lab03_variants", "lab03 variants", run_variants)


@pytest.fixture(scope="module")
def lab03_variants(request) -> dict:
    return submit(request.config).result(timeout=limit(600))


def units_of_minigpt() -> dict[str, list[tuple[int, ...]]]:
    """Parameter shapes per FSDP unit: each block, and the root (everything else; the tied
    output matrix is the embedding matrix, counted once)."""
    model = MiniGPT(TrainConfig().model_config())
    units: dict[str, list[tuple[int, ...]]] = {}
    for name, p in model.named_parameters():
        unit = ".".join(name.split(".")[:2]) if name.startswith("blocks.") else "root"
        units.setdefault(unit, []).append(tuple(p.shape))
    return units


def gathered_numel(api: str, shapes: list[tuple[int, ...]], world: int) -> int:
    """Elements one all-gather of a unit produces. FSDP2 shards every parameter on its first
    dimension, padded to a multiple of the world size; FSDP1 concatenates the unit's parameters
    into one flat parameter padded to a multiple of the world size."""
    if api == "fsdp2":
        return sum(math.ceil(s[0] / world) * world * math.prod(s[1:]) for s in shapes)
    # FSDP1 (use_orig_params) also starts each parameter at a 16-byte boundary: MiniGPT's sizes
    # are all multiples of 4 floats, so that adds nothing here
    assert all(math.prod(s) % 4 == 0 for s in shapes)
    return math.ceil(sum(math.prod(s) for s in shapes) / world) * world


def events_of(result: dict, rank: int) -> list[dict]:
    return result["last_step_events"][rank]


def time_of(events: list[dict], what: str, unit: str, phase: str | None = None) -> float:
    found = [e["t"] for e in events if e["what"] == what and e["unit"] == unit and phase in (None, e["phase"])]
    assert len(found) == 1, f"{what} {unit} ({phase}) recorded {len(found)} times"
    return found[0]


def test_every_variant_ran_and_equals_one_process(lab03_variants):
    report = lab03_variants["report"]
    assert report["world_size"] == WORLD and report["steps"] == STEPS and report["passed"] is True
    assert set(report["variants"]) == set(VARIANTS)
    for name, r in report["variants"].items():
        assert len(r["step_drift"]) == STEPS, name
        assert all(0 <= d <= 1e-5 for d in r["step_drift"]), (name, r["step_drift"])
        assert r["max_step_drift"] > 0, f"{name}: two ranks sum in another order; a drift of exactly 0 is suspicious"
        assert r["passed"] is True and math.isfinite(r["final_loss"]), name


def test_counts_and_bytes_per_rank_follow_from_the_shard_sizes(lab03_variants):
    units = units_of_minigpt()
    blocks = [u for u in units if u != "root"]
    for name, r in lab03_variants["report"]["variants"].items():
        api = VARIANTS[name].api
        size = {u: gathered_numel(api, shapes, WORLD) for u, shapes in units.items()}
        gathered = list(units) + (blocks if VARIANTS[name].reshard_after_forward else [])  # forward, backward
        assert r["calls_per_step"] == {"all-gather": len(gathered), "reduce-scatter": len(units), "all-reduce": 0}, name
        assert r["calls_same_every_step_and_rank"] is True, name
        sends = (WORLD - 1) / WORLD * FLOAT32  # a ring sends all chunks but one
        for rank in range(WORLD):
            assert r["sent_bytes_per_step"][rank] == {
                "all-gather": sends * sum(size[u] for u in gathered),
                "reduce-scatter": sends * sum(size.values()),
                "all-reduce": 0,
            }, (name, rank)
            assert r["output_bytes_per_step"][rank]["all-gather"] == FLOAT32 * sum(size[u] for u in gathered)
            assert r["input_bytes_per_step"][rank]["all-gather"] == FLOAT32 * sum(size[u] for u in gathered) / WORLD
            assert r["input_bytes_per_step"][rank]["reduce-scatter"] == FLOAT32 * sum(size.values())
    # the padding is visible: FSDP2 pads the 609-row embedding to 610 rows on 2 ranks
    root = lab03_variants["report"]["variants"]["fsdp2-implicit"]["last_step_events"][0]
    gather = next(e for e in root if e["what"] == "all-gather issued" and e["unit"] == "root")
    assert gather["output_numel"] == sum(math.prod(s) for s in units["root"]) + 96


def test_recorded_order_is_the_predicted_order(lab03_variants):
    for name, r in lab03_variants["report"]["variants"].items():
        for rank in range(WORLD):
            assert r["all_gather_order"][rank] == predict_all_gather_order(4, name), (name, rank)
            assert r["schedule"][rank] == predict_event_order(4, name), (name, rank)
        assert r["prediction_matches"] is True


def test_the_trace_shows_each_prefetch(lab03_variants):
    for name, r in lab03_variants["report"]["variants"].items():
        for rank in range(WORLD):
            events = events_of(r, rank)
            gathers = [e for e in events if e["what"] == "all-gather issued"]

            def issued(unit: str, phase: str, events: list[dict] = events) -> float:
                return time_of(events, "all-gather issued", unit, phase)

            for i in range(3):  # forward: block i+1's all-gather against block i's computation
                t = issued(f"blocks.{i + 1}", "forward")
                if name in FORWARD_PREFETCH:
                    assert t < time_of(events, "forward start", f"blocks.{i}"), (name, rank, i)
                else:
                    assert t > time_of(events, "forward end", f"blocks.{i}"), (name, rank, i)
            if not VARIANTS[name].reshard_after_forward:
                assert not [e for e in gathers if e["phase"] == "backward"], name
                continue
            for i in range(1, 4):  # backward: block i-1's all-gather against block i's computation
                t, start = issued(f"blocks.{i - 1}", "backward"), time_of(events, "backward start", f"blocks.{i}")
                if name in BACKWARD_PRE_DEPTH_1 | BACKWARD_DEPTH_2:
                    assert t < start, (name, rank, i)
                else:  # no prefetch, or BACKWARD_POST: only once block i's backward has begun
                    assert start < t < time_of(events, "backward start", f"blocks.{i - 1}"), (name, rank, i)
            for i in range(2, 4):  # two blocks ahead only with a backward depth of 2
                t, start = issued(f"blocks.{i - 2}", "backward"), time_of(events, "backward start", f"blocks.{i}")
                assert (t < start) == (name in BACKWARD_DEPTH_2), (name, rank, i)
            prefetched = [e["unit"] for e in gathers if e["prefetch"]]
            assert bool(prefetched) == (name != "fsdp1-no-prefetch"), (name, prefetched)


def test_asynchronous_unshards_are_waited_for_and_blocking_ones_are_exposed_whole(lab03_variants):
    for name, r in lab03_variants["report"]["variants"].items():
        for rank in range(WORLD):
            events = events_of(r, rank)
            gathers = [e for e in events if e["what"] == "all-gather issued"]
            waits = [e["unit"] for e in events if e["what"] == "wait start"]
            if name in ASYNC:
                assert all(e["is_async"] for e in gathers), name
                assert waits == [e["unit"] for e in gathers], (name, waits)  # each waited once, in order
            else:
                assert not any(e["is_async"] for e in gathers) and not waits, name
            assert 0 <= min(r["exposed_s"][rank]) and r["median_exposed_s"] > 0


def test_trace_files_for_every_variant_in_both_languages(lab03_variants):
    for name in VARIANTS:
        log = (lab03_variants["traces"] / f"{name}-events.txt").read_text()
        assert f"rank 0, step {STEPS - 1}" in log and f"rank 1, step {STEPS - 1}" in log
        assert "all-gather issued" in log and "reduce-scatter issued" in log
        for lang in ("en", "es"):
            png = lab03_variants["traces"] / f"{name}-timeline-{lang}.png"
            assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000, png


def test_the_profilers_trace_holds_the_collectives_the_course_recorded(lab03_variants):
    """--trace: one gzipped Chrome trace per rank, one traced step (the last) of every variant. gloo's own
    events count what the course's tracer counted: each all-gather, and each reduce-scatter, which gloo runs
    as an all-reduce (one more all-reduce: the gradient clipping's norm)."""
    from tests.test_profiler import check_trace

    report = lab03_variants["report"]
    for rank in range(WORLD):
        traced = check_trace(lab03_variants["profiler"] / f"lab03-rank{rank}.json.gz", WORLD, *report["variants"])
        for name, r in report["variants"].items():
            (step,) = traced[name]
            names = [c["name"] for c in step["collectives"]]
            assert step["step"] == STEPS - 1 and names.count("gloo:all_gather") == r["calls_per_step"]["all-gather"]
            assert names.count("gloo:all_reduce") == r["calls_per_step"]["reduce-scatter"] + 1, (name, names)
            if rank == 0:
                assert report["trace"][name]["steps"] == [step], name


def test_render_writes_the_tables_and_figures_of_a_report(lab03_variants, tmp_path):
    report = dict(lab03_variants["report"])
    report["variants"] = {k: report["variants"][k] for k in ("fsdp2-implicit", "fsdp1-backward-post")}
    path = tmp_path / "03-prefetch-test.json"
    path.write_text(json.dumps(report))
    assert main(["--render", str(path)]) == 0
    english, spanish = (
        (tmp_path / "03-prefetch-test-en.txt").read_text(),
        (tmp_path / "03-prefetch-test-es.txt").read_text(),
    )
    assert "| fsdp1-backward-post | 9 | 5 | 0 |" in english and "| fsdp1-backward-post | 9 | 5 | 0 |" in spanish
    assert "deriva máxima por paso" in spanish and "R 0 1 2 3 \\| 3 2 1 0" in english
    for name in report["variants"]:
        for lang in ("en", "es"):
            assert (tmp_path / f"03-prefetch-test-timeline-{name}-{lang}.png").stat().st_size > 10_000


@pytest.mark.parametrize("flavour", ["fsdp2", "fsdp1"])
def test_the_tracer_puts_everything_back(flavour):
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.fsdp import _runtime_utils
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

    from minigpt.fsdp.trace import TRACED_COLLECTIVES, FSDPTracer

    def watched() -> dict:
        return {
            **{f: getattr(dist, f) for f in TRACED_COLLECTIVES},
            "Work.wait": dist.Work.__dict__["wait"],
            **{
                m: FSDPParamGroup.__dict__[m]
                for m in ("unshard", "wait_for_unshard", "post_backward", "_prefetch_unshard")
            },
            **{f: getattr(_runtime_utils, f) for f in ("_unshard", "_prefetch_handle", "_reduce_grad")},
        }

    block = nn.Linear(2, 2)
    before = watched()
    with FSDPTracer(block, flavour, [("blocks.0", block, block)]):
        during = watched()
        assert block._forward_pre_hooks and block._forward_hooks and block._backward_hooks
    assert any(during[k] is not before[k] for k in before)
    assert all(v is before[k] for k, v in watched().items()), [k for k, v in watched().items() if v is not before[k]]
    assert not block._forward_pre_hooks and not block._forward_hooks and not block._backward_hooks
