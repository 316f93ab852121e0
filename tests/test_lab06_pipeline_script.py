"""Lab 06's pipeline script (the course's own checks, no points): lab/06_pipeline.py --check on 2
stages (1F1B) and on 4 (GPipe), few steps each, as torchrun's ranks without its agent
(``launcher.run_script``), and one torchrun, as a learner types it, of a learner's 1F1B that deadlocks. Each report is held against numbers this file computes itself: the
bytes of the activations and of the tied matrix, the micro-batches GPipe and 1F1B hold, the bubble
formula.
"""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

from minigpt.model import GPTConfig
from minigpt.parallel import proof
from minigpt.runners import lab06_pipeline
from tests import launcher
from tests.limits import limit

pytestmark = pytest.mark.timeout(400)

BATCH, SEQ = 64, 32


def torchrun(args: list[str], nproc: int, timeout_s: float) -> tuple[int, str, str]:
    from tests.test_lab01_script import start

    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *args]
    process = start(command)
    out, err = process.communicate(timeout=limit(timeout_s))
    return process.returncode, out, err


def bytes_per_stage(stages: int, element_size: int = 4) -> list[int]:
    """Each stage sends the whole batch's activations (B, T, C) down, unless it is the last, their
    gradients up, unless it is the first; the first and the last swap the tied (V, C) gradient."""
    cfg = GPTConfig()
    activations = BATCH * SEQ * cfg.n_embd * element_size
    tied = cfg.vocab_size * cfg.n_embd * element_size
    out = []
    for s in range(stages):
        sent = (s < stages - 1) * activations + (s > 0) * activations
        out.append(sent + (tied if s in (0, stages - 1) else 0))
    return out


@pytest.mark.parametrize("stages, schedule, m", [(2, "1f1b", 8), (4, "gpipe", 4)])
def test_the_pipeline_script_passes_its_check(tmp_path, stages, schedule, m):
    """One step of both schedules equals one process and PyTorch's own pipeline, the bytes per stage equal the count above, the
    micro-batches held are GPipe's m and 1F1B's p - s, the bubble is measured for each m beside
    (p - 1) / (m + p - 1), and the step drift of a few training steps stays within 1e-5."""
    report = tmp_path / "pipe.json"
    args = ["lab/06_pipeline.py", "--check", "--schedule", schedule, "--micro-batches", str(m), "--steps", "4"]
    args += ["--bubble-micro-batches", "1", str(m), "--test-sentences", "5", "--quiet", "--report", str(report)]
    done = launcher.run_script(args, stages, limit(300))
    assert done.returncode == 0, done.stderr[-2000:]
    r = json.loads(report.read_text())
    assert {"stages", "micro_batches", "schedule", "max_grad_diff", "bubble_measured", "bubble_model"} <= set(r)
    assert set(proof.REPORT_KEYS) <= set(r), sorted(r)
    assert r["criterion_pass"] and r["stages"] == stages and r["schedule"] == schedule and r["micro_batches"] == m, r
    assert r["max_grad_diff"] <= 1e-5 and r["fp32_max_step_drift"] <= 1e-5 and r["fp64_max_step_drift"] <= 1e-12, r
    assert r["same_as_pytorch"] and r["fp32_first_step_logit_diff"] <= 1e-5, r
    assert r["one_step"]["float64"][schedule]["max_grad_diff"] <= 1e-12, r["one_step"]["float64"]
    # PyTorch's own pipeline (torch.distributed.pipelining) on the same stages and batch
    assert all(r["torch_pipelining"][s]["max_grad_diff"] <= 1e-5 for s in ("gpipe", "1f1b")), r["torch_pipelining"]
    assert r["bytes_per_stage_per_step"] == bytes_per_stage(stages), (r["bytes_per_stage_per_step"], stages)
    assert r["one_step"]["float64"]["gpipe"]["bytes_sent"] == bytes_per_stage(stages, 8)
    assert r["peak_activations"] == {"gpipe": [m] * stages, "1f1b": [min(stages - s, m) for s in range(stages)]}
    assert r["bubble_model"] == {str(k): (stages - 1) / (k + stages - 1) for k in (1, m)}
    # the wall clock: one micro-batch leaves every stage but one idle; more micro-batches, less idle
    assert r["bubble_measured"]["1"] >= r["bubble_measured"][str(m)] > 0, r["bubble_measured"]
    out = done.stdout
    assert "stage 0  F0" in out and f"stage {stages - 1}" in out, out[:2000]  # the chart


def test_a_schedule_that_deadlocks_is_named_before_anything_is_sent(tmp_path, monkeypatch):
    """A learner's 1F1B whose warm-up is counted from the wrong end (stage s warms up with s forwards,
    not p - 1 - s): the script checks the lists first and every rank ends with one line naming the
    stuck stages, instead of waiting for a timeout."""
    (tmp_path / "lab06_pipeline.py").write_text(
        textwrap.dedent(
            """
            from minigpt.parallel.pipeline.engine import backward_step, forward_step  # noqa: F401


            def one_f_one_b(stage, stages, micro_batches):
                warmup = min(stage, micro_batches)  # reversed: stage 0 wants a backward before stage 1 can start
                ops = [("F", i) for i in range(warmup)]
                for i in range(warmup, micro_batches):
                    ops += [("F", i), ("B", i - warmup)]
                return ops + [("B", i) for i in range(micro_batches - warmup, micro_batches)]
            """
        )
    )
    monkeypatch.setenv("MINIGPT_EXERCISES_DIR", str(tmp_path))
    code, out, err = torchrun(["lab/06_pipeline.py", "--impl", "exercises", "--steps", "1", "--quiet"], 3, 120)
    assert code != 0, out[-1000:]
    # every rank finds it; the first to exit is the one torchrun reports (it stops the others)
    assert "] error: Deadlock: the schedule deadlocks: stage 0 waits before B0 for B0 of stage 1" in err, err[-3000:]


def test_more_stages_than_blocks_is_refused():
    args = lab06_pipeline.parse_args([])
    with pytest.raises(ValueError, match="world size 5 is one stage per rank, but MiniGPT has 4 blocks"):
        lab06_pipeline.check_args(args, 5)
