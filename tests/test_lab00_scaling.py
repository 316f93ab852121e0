"""Lab 00's batch-scaling run (lab/00_batch_scaling.py): the plan worked out from the defaults by hand,
and theory page 02's table and sentences held to the committed run (four trainings take a few
minutes, so the suite reads it: ``python lab/00_batch_scaling.py --report lab/results/00-batch-scaling-cpu.json``).
"""

from __future__ import annotations

import json
from pathlib import Path

from minigpt.pages import lab00_scaling
from minigpt.runners.lab00_batch_scaling import plan

ROOT = Path(__file__).resolve().parent.parent
RESULT = ROOT / "lab" / "results" / "00-batch-scaling-cpu.json"


def test_the_plan_keeps_the_sentences_and_scales_the_rate():
    # 450 steps of 64 = 28,800 sentences = 112.5 steps of 256; warm-up 40 x 64 / 256 = 10
    assert [(r["rule"], r["batch"], r["steps"], r["warmup"], r["lr"]) for r in plan()] == [
        ("default", 64, 450, 40, 3e-3),
        ("kept", 256, 112, 10, 3e-3),
        ("linear", 256, 112, 10, 1.2e-2),
        ("sqrt", 256, 112, 10, 6e-3),
    ]


def test_theory_02_shows_the_committed_run_and_its_sentences_hold():
    report = json.loads(RESULT.read_text())
    assert [(r["rule"], r["batch"], r["steps"], r["lr"]) for r in report["runs"]] == [
        (r["rule"], r["batch"], r["steps"], r["lr"]) for r in plan()
    ]
    by = {r["rule"]: r for r in report["runs"]}
    assert by["default"]["accuracy"] > max(r["accuracy"] for r in report["runs"][1:])  # "neither rule brings it back"
    assert by["kept"]["accuracy"] > by["sqrt"]["accuracy"] > by["linear"]["accuracy"]
    en = (ROOT / "theory" / "02-parallelism-flavours.md").read_text(encoding="utf-8")
    es = (ROOT / "theory" / "02-parallelism-flavours.es.md").read_text(encoding="utf-8")
    kept, sqrt, loss = (
        f"{100 * by['kept']['accuracy']:.1f}",
        f"{100 * by['sqrt']['accuracy']:.1f}",
        f"{by['linear']['final_train_loss']:.1f}",
    )
    assert f"does best ({kept}% of the corrections" in en and f"reaches {sqrt}%" in en and f"stays at {loss})" in en
    spanish = " ".join(es.split())
    assert f"es la mejor ({kept} % de correcciones".replace(".", ",") in spanish
    for lang in ("en", "es"):
        assert (RESULT.parent / f"00-batch-scaling-cpu-{lang}.txt").read_text() == lab00_scaling.table(report, lang)
