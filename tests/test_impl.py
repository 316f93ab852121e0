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


def test_an_untouched_stub_is_read_from_the_file_and_any_edit_counts_as_written(tmp_path, monkeypatch):
    """impl.untouched (the notebooks ask it before starting ranks): every exercise of the untouched stubs
    is its stub's own message; written in any way (a new body, a later definition, an assignment), None."""
    for exercise, (_, names) in impl.EXERCISES.items():
        message = impl.untouched(exercise)
        assert (message or "").startswith(f"Exercise {exercise}: ") if names else message is None, (exercise, message)
    stub = (impl.EXERCISES_DIR / "lab01_ddp.py").read_text()
    monkeypatch.setenv(impl.DIR_ENV_VAR, str(tmp_path))
    path = tmp_path / "lab01_ddp.py"
    edits = {
        "a body": stub.replace(
            '    raise NotImplementedError("Exercise 1.1:', '    return tensor\n    raise NotImplementedError("', 1
        ),
        "a later definition": stub + "\n\ndef ring_all_reduce(tensor, op, group, counter):\n    return tensor\n",
        "an assignment": stub + "\n\nring_all_reduce = print\n",
    }
    for how, text in edits.items():
        path.write_text(text)
        assert impl.untouched("1.1") is None, how
        assert impl.untouched("1.4").startswith("Exercise 1.4: "), how  # the method is still its stub
    path.write_text(stub + "\n\nBucketedDDP.finish_gradient_synchronization = print\n")
    assert impl.untouched("1.4") is None and impl.untouched("1.1").startswith("Exercise 1.1: ")
