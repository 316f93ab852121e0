"""The one switch between the reference and the learner's exercises (minigpt/impl.py), as a notebook
uses it: an edit of an exercise file is what the next call runs, without restarting the kernel."""

from __future__ import annotations

import os

from minigpt import impl


def test_an_edited_exercise_file_is_imported_again(tmp_path, monkeypatch):
    stub = (impl.EXERCISES_DIR / "lab00_baseline.py").read_text()
    path = tmp_path / "lab00_baseline.py"
    path.write_text(stub + "\n\ndef causal_mask(size):\n    return 'first version'\n")
    monkeypatch.setenv(impl.DIR_ENV_VAR, str(tmp_path))
    assert impl.load("lab00_baseline", "causal_mask", "exercises")(3) == "first version"
    path.write_text(stub + "\n\ndef causal_mask(size):\n    return 'saved again'\n")
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1_000_000))  # a later save
    assert impl.load("lab00_baseline", "causal_mask", "exercises")(3) == "saved again"
    # an unchanged file is not imported again: the same module, the same function object
    assert impl.load("lab00_baseline", "causal_mask", "exercises") is impl.load(
        "lab00_baseline", "causal_mask", "exercises"
    )
