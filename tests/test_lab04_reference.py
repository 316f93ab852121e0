"""Lab 04: the course's own checks of the FSDP written by hand (no points; ``make grade`` never
runs them), on models it was not built for, in the same 2-rank launch as the graded tests
(tests/fsdp_scratch_worker.py, scenarios tagged "maintainer", the reference's code throughout).

A model with a frozen layer, a layer unused in forward, a block called twice in one forward and a
buffer trains like one process (float32 and float64, the same bits on 2 ranks); a parameter tied
across two units is refused with both names; float64 MiniGPT's gradients equal one process's; a
sharded checkpoint saved at 2 ranks loads at 1 rank and gives the same logits.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from minigpt.parallel import proof
from tests.ranks import scenario

pytestmark = pytest.mark.timeout(180)


def both(launch, name):
    return [scenario(launch, name, r) for r in range(2)]


@pytest.mark.parametrize("dtype", ["odd32", "odd64"])
def test_frozen_unused_twice_and_a_buffer_train_like_one_process(fsdp_scratch, dtype):
    for result in both(fsdp_scratch, f"{dtype}@maintainer"):
        assert result["max_diff"] == 0.0, result  # 2 ranks: the same float operations as one process
        assert result["grad_none"] == result["one_grad_none"], result
        assert result["grad_none"]["frozen.weight"] and result["grad_none"]["unused.weight"], result
        assert "frozen" not in result["reduced_units"] and "unused" not in result["reduced_units"], result
        assert result["frozen_unchanged"] and result["buffer"] == 0.5, result


def test_a_parameter_tied_across_two_units_is_refused_with_both_names(fsdp_scratch):
    for result in both(fsdp_scratch, "tie@maintainer"):
        assert result["raised"], result
        assert "wte.weight" in result["message"] and "lm_head.weight" in result["message"], result


def test_float64_gradients_equal_one_process(fsdp_scratch):
    for result in both(fsdp_scratch, "f64@maintainer"):
        assert result["max_diff"] <= 1e-12, result


def test_ignored_parameters_stay_whole_and_train_like_one_process(fsdp_scratch):
    """FSDP2's ``ignored_params``, in ours: every layer norm left whole on every rank. Three clipped
    float64 AdamW steps equal one process's to 1e-12, and the ignored gradients (averaged by the unit
    at the end of backward) are bit-identical on the two ranks after every backward."""
    r0, r1 = (scenario(fsdp_scratch, "ignored@maintainer", rank) for rank in range(2))
    assert r0["ignored"] == 2 * 2 * 2 + 2 and r0["whole_on_every_rank"], r0  # 2 blocks x 2 norms x (w, b), ln_f
    assert r0["max_diff"] <= 1e-12, f"{r0['max_diff']:.2e} from one process"
    assert r0["grad_digests"] == r1["grad_digests"], "the ignored gradients differ between the ranks"


def test_a_checkpoint_saved_at_two_ranks_loads_at_one(fsdp_scratch):
    result = scenario(fsdp_scratch, "ckpt@maintainer", 0)
    assert result["saved_world"] == 2 and result["logit_diff"] == 0.0, result
    scenario(fsdp_scratch, "ckpt@maintainer", 1)  # rank 1 saved its shard without error


@pytest.fixture(scope="module", params=[3, 4])
def more_ranks(request, tmp_path_factory):
    """tests/fsdp_ranks_worker.py on 3 and on 4 ranks (each rank's results, each rank's stderr)."""
    from tests.launcher import ROOT, run_ranks
    from tests.limits import limit

    out = tmp_path_factory.mktemp(f"fsdp-ranks-{request.param}")
    results, errors = run_ranks(ROOT / "tests" / "fsdp_ranks_worker.py", request.param, out, timeout_s=limit(120))
    return request.param, results, errors


def test_more_ranks_match_fsdp2_to_the_bit(more_ranks):
    """On 3 and 4 ranks, with padding everywhere on 3 (32 positions cut as 33 rows): a 2-layer
    MiniGPT and the model of odd parts take the same steps as FSDP2, to the bit, and the odd
    model stays within rounding of one process (its gradients summed over the ranks in another
    order)."""
    world, results, errors = more_ranks
    for rank in range(world):
        assert results[rank].get("finished"), f"rank {rank} did not finish: {errors[rank][-800:]}"
        minigpt, odd = results[rank]["minigpt"], results[rank]["odd"]
        assert minigpt["ok"] and odd["ok"], (minigpt, odd)
        assert minigpt["diffs"] == [0.0, 0.0], minigpt
        assert odd["vs_fsdp2"] == 0.0 and odd["vs_one_process"] < 1e-6, odd
    rows = -(-32 // world) if world == 3 else 32 // world
    assert results[0]["minigpt"]["shard_shapes"]["wpe.weight"] == [rows, 96]


def test_the_lab_script_passes_its_check_on_two_ranks(tmp_path):
    """lab/04_fsdp.py --check on two ranks (torchrun's, without its agent: ``launcher.run_script``; the
    check of a mistake below is a torchrun as a learner types it), short: every proof of the full run,
    on 2 training steps, passes and the report has the issue's keys."""
    from tests import launcher
    from tests.limits import limit
    from tests.test_profiler import check_trace

    report, traces = tmp_path / "lab04.json", tmp_path / "traces"
    args = ["lab/04_fsdp.py", "--check", "--steps", "2", "--short-steps", "1"]
    args += ["--rounds", "1", "--test-sentences", "5", "--quiet", "--report", str(report), "--trace", str(traces)]
    done = launcher.run_script(args, 2, limit(240))
    assert done.returncode == 0, done.stderr[-2000:]
    # the profiler's trace of both steps: each unit's all-gathers (forward, and again in backward) and its
    # reduce-scatter, which gloo runs as an all-reduce (the training thread asks c10d::_reduce_scatter_base_)
    traced = [check_trace(traces / f"lab04-rank{rank}.json.gz", 2, "fsdp-by-hand")["fsdp-by-hand"] for rank in (0, 1)]
    for steps in traced:
        for step in steps:
            names = [c["name"] for c in step["collectives"]]
            assert names.count("gloo:all_gather") >= 5 and names.count("gloo:all_reduce") >= 5, names
            assert any(c["under_backward_ms"] > 0 for c in step["collectives"]), step
    r = json.loads(report.read_text())
    keys = ("world_size", "ranks_bit_identical", "bytes_per_rank_per_step", "bytes_model", "event_order_matches_fsdp2")
    assert all(k in r for k in (*keys, *proof.REPORT_KEYS, "tutor_accuracy")), sorted(r)
    assert (
        r["criterion_pass"] and r["world_size"] == 2 and r["bytes_per_rank_per_step"] == r["bytes_model"] == 2_922_240
    )
    assert r["same_as_pytorch"] and r["pytorch_max_diff"] == 0.0 and r["fp64_max_step_drift"] <= 1e-12, r
    assert "speed" in r, "--rounds 1 times ours against FSDP2"
    assert r["training"]["trace"]["steps"] == traced[0]


def mistake_check(folder: Path) -> dict:
    """lab/04_fsdp.py --check with tests/pitfalls/unpadded_fsdp/ as the learner's exercises: its exit
    status, output and report, on the suite's second lane (tests/background.py)."""
    from tests import launcher
    from tests.limits import limit
    from tests.test_lab01_script import start

    report = folder / "lab04.json"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    command += ["lab/04_fsdp.py", "--check", "--impl", "exercises", "--steps", "3", "--short-steps", "1"]
    command += ["--fsdp2-steps", "2", "--test-sentences", "5", "--quiet", "--report", str(report)]
    env = {**launcher.environ(), "MINIGPT_EXERCISES_DIR": str(Path(__file__).parent / "pitfalls" / "unpadded_fsdp")}
    launcher.LANE.environ, before = env, getattr(launcher.LANE, "environ", None)
    try:
        process = start(command)
    finally:
        launcher.LANE.environ = before
    out, err = process.communicate(timeout=limit(240))
    return {"code": process.returncode, "out": out, "err": err, "report": report}


def submit_mistake(config: pytest.Config):
    from tests import background

    return background.launch(config, "fsdp_mistake_check", "lab04 check of a mistake", mistake_check)


@pytest.fixture(scope="module")
def fsdp_mistake_check(request) -> dict:
    from tests.limits import limit

    return submit_mistake(request.config).result(timeout=limit(600))


def test_a_learners_mistake_fails_the_check_naming_its_rulers(fsdp_mistake_check):
    """lab/04_fsdp.py --check with tests/pitfalls/unpadded_fsdp/ as the learner's exercises (the
    reduce-scatter buffer not padded parameter by parameter, so rank r's chunk is not its rows):
    exit 1, and the lines name the float64 ruler (the algorithm) and FSDP2's (bit for bit)."""
    found = fsdp_mistake_check
    out, err = found["out"], found["err"]
    assert found["code"] == 1, (out[-2000:], err[-2000:])
    r = json.loads(found["report"].read_text())
    assert not r["criterion_pass"] and {"fp64_max_step_drift", "same_as_pytorch"} <= set(r["broken_rulers"]), r
    assert r["fp64_max_step_drift"] > 1e-3, r["fp64_max_step_drift"]
    assert "broken ruler fp64_max_step_drift: measured" in out and "check FAIL" in out, out[-2000:]
