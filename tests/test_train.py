"""The single-process trainer and the tutor command: determinism, resume, bad input, learning.

Most runs here use a tiny model (one block of width 32) so that each takes a second or two; one
session-wide run trains the real default model once and the tutor tests use its checkpoint.

A run ends by scoring the tutor on every held-out sentence (1,241 val and 1,209 test), which says
nothing about the weights these tests compare and was most of their time: an untrained tiny model
writes to the longest answer each time (one 3-step run: 9 s alone, 53 s in a whole suite's run beside
the second lane). The tiny runs here score 20 sentences (``tiny_scores``); the default run, which
``test_default_run_learns_the_tutor_task`` holds to its accuracy, scores them all.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from minigpt import train, tutor
from tests.limits import limit

TINY = [
    "--n-layer",
    "1",
    "--n-embd",
    "32",
    "--n-head",
    "2",
    "--batch-size",
    "16",
    "--eval-every",
    "0",
    "--quiet",
    "--warmup",
    "2",
]


@pytest.fixture(autouse=True)
def tiny_scores(monkeypatch):
    """The final scores of a tiny run on 20 held-out sentences, not all of them (module docstring)."""
    from minigpt import grammar

    whole_score = grammar.score
    monkeypatch.setattr(
        grammar, "score", lambda model, split, max_sentences=None, **kw: whole_score(model, split, 20, **kw)
    )


def run_train(tmp_path: Path, name: str, *flags: str) -> dict:
    out = tmp_path / f"{name}.pt"
    train.main([*TINY, "--out", str(out), *flags])
    return torch.load(out, weights_only=False)


def same_parameters(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_same_seed_gives_bit_identical_parameters(tmp_path):
    """The same seed, the same bits; another seed, other bits."""
    a = run_train(tmp_path, "a", "--steps", "8", "--seed", "3")
    b = run_train(tmp_path, "b", "--steps", "8", "--seed", "3")
    c = run_train(tmp_path, "c", "--steps", "8", "--seed", "4")
    assert same_parameters(a["model"], b["model"])
    assert not same_parameters(a["model"], c["model"])


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_resume_continues_bit_identically(tmp_path, optimizer):
    """0 -> 100 in one go equals 0 -> 50, then resume 50 -> 100, parameter for parameter."""
    whole = run_train(tmp_path, "whole", "--steps", "100", "--optimizer", optimizer)
    half = run_train(tmp_path, "half", "--steps", "100", "--optimizer", optimizer, "--stop-at", "50")
    assert half["step"] == 50
    train.main(["--resume", str(tmp_path / "half.pt"), "--quiet"])
    resumed = torch.load(tmp_path / "half.pt", weights_only=False)
    assert resumed["step"] == 100
    assert same_parameters(whole["model"], resumed["model"])
    assert not same_parameters(half["model"], resumed["model"])
    for key in ("exp_avg", "exp_avg_sq") if optimizer == "adamw" else ("momentum_buffer",):
        for a, b in zip(whole["optimizer"]["state"].values(), resumed["optimizer"]["state"].values()):
            assert torch.equal(a[key], b[key]), f"optimizer state {key} differs"


def test_gradient_accumulation_matches_the_whole_batch(tmp_path):
    """Accumulating 4 micro-batches computes the gradient of the whole batch: the same weights
    up to summation-order rounding (not bit for bit)."""
    one = run_train(tmp_path, "one", "--steps", "5", "--accum", "1")
    four = run_train(tmp_path, "four", "--steps", "5", "--accum", "4")
    worst = max((one["model"][k] - four["model"][k]).abs().max().item() for k in one["model"])
    assert 0 < worst < 1e-5, worst


def test_checkpoint_holds_what_resume_needs(tmp_path):
    state = run_train(tmp_path, "ck", "--steps", "3")
    assert {"model", "optimizer", "step", "train_config", "rng", "vocabulary"} <= state.keys()
    assert state["train_config"]["steps"] == 3 and state["step"] == 3
    assert not list(tmp_path.glob("*.tmp")), "no temporary file left behind"


BAD_INPUT = [
    (["--steps", "-5"], "--steps -5: negative; give a positive integer"),
    (["--optimizer", "adam"], "--optimizer adam: not a choice; choose from adamw, sgd"),
    (["--batch-size", "64", "--accum", "5"], "--batch-size 64 is not divisible by --accum 5"),
    (["--resume", "nowhere/missing.pt"], "no checkpoint at nowhere/missing.pt"),
    (["--warmup", "500", "--steps", "100"], "--warmup 500: not less than --steps 100; give a warm-up in 0..99"),
    (["--n-embd", "100", "--n-head", "3"], "--n-embd 100 is not divisible by --n-head 3"),
    (["--stop-at", "0"], "--stop-at 0: zero; give a positive integer"),
]


@pytest.mark.parametrize("argv,message", BAD_INPUT, ids=[a[0] for a, _ in BAD_INPUT])
def test_bad_input_exits_2_with_a_message_and_writes_nothing(tmp_path, capsys, argv, message):
    out = tmp_path / "never" / "x.pt"
    with pytest.raises(SystemExit) as exit_info:
        train.main([*argv, "--out", str(out)])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
    assert not out.parent.exists(), "nothing half-written"


def test_resume_refuses_changed_settings(tmp_path, capsys):
    run_train(tmp_path, "r", "--steps", "4", "--stop-at", "2")
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--resume", str(tmp_path / "r.pt"), "--lr", "0.1"])
    assert exit_info.value.code == 2
    assert "--lr 0.1 differs from the checkpoint's 0.003" in capsys.readouterr().err


def test_resume_may_change_only_the_evaluation_settings(tmp_path):
    run_train(tmp_path, "e", "--steps", "4", "--stop-at", "2")
    train.main(["--resume", str(tmp_path / "e.pt"), "--quiet", "--eval-every", "1", "--eval-sentences", "5"])
    assert torch.load(tmp_path / "e.pt", weights_only=False)["train_config"]["eval_sentences"] == 5


def test_divergence_stops_with_a_message(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_train(tmp_path, "nan", "--steps", "30", "--optimizer", "sgd", "--lr", "1e6", "--grad-clip", "0")
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert "the loss is nan: training diverged" in err and "look at --lr 1e+06 with clipping off (--grad-clip 0)" in err


# The default run, trained once for the whole session -----------------------------------------


def test_default_run_learns_the_tutor_task(default_run):
    assert default_run["steps"] == train.TrainConfig().steps
    assert default_run["total"] > 1000
    accuracy = default_run["correct"] / default_run["total"]
    assert accuracy >= 0.90, f"tutor accuracy {default_run['correct']}/{default_run['total']}"
    assert default_run["val_loss"] < 0.1
    assert "MiniGPT: 507,552 parameters" in default_run["stdout"]


def test_tutor_corrects_sentences(default_run, capsys):
    checkpoint = default_run["checkpoint"]
    answers = tutor.main(
        [
            "--checkpoint",
            str(checkpoint),
            "nosotros habla español",
            "yesterday she cook the soups",
            "Los niños comen las manzanas.",
        ]
    )
    assert answers == ["nosotros hablamos español", "yesterday she cooked the soups", "los niños comen las manzanas"]
    printed = capsys.readouterr().out
    assert "habla -> hablamos" in printed and "already correct" in printed


def test_tutor_command_line(default_run):
    checkpoint = default_run["checkpoint"]
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
    ok = subprocess.run(
        [sys.executable, "-m", "minigpt.tutor", "--checkpoint", str(checkpoint), "la profesora escriben una carta"],
        capture_output=True,
        text=True,
        timeout=limit(60),
        env=env,
    )
    assert ok.returncode == 0, ok.stderr
    assert "-> la profesora escribe una carta" in ok.stdout


def test_tutor_without_a_checkpoint_exits_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        tutor.main(["--checkpoint", str(tmp_path / "none.pt"), "nosotros habla español"])
    assert exit_info.value.code == 2
    assert "no checkpoint at" in capsys.readouterr().err
