"""Checkpoints are never lost (:mod:`minigpt.checkpoints`): fault drills and consistency checks.

* The folder swap, interrupted after each of its file-system steps in turn (in this process,
  an exception raised by a patched ``os.rename`` / ``os.fsync`` / ``shutil.rmtree``): the
  previous or the new checkpoint is always readable, and the next save cleans up.
* The trainer killed (SIGKILL) in the middle of writing a checkpoint (one subprocess whose
  ``torch.save`` writes half the file, says so, and waits to be killed): the previous checkpoint
  is untouched, ``--resume`` works, the next save removes the temporary file, and the resumed
  run's checkpoint is byte-identical to an uninterrupted run's.
* Two same-seed trainer runs, in two processes, write byte-identical checkpoints.
* Inconsistent trainer checkpoints: the tutor and ``--resume`` refuse each with exit status 2
  and one line naming the file and the fault (in this process, plus one real tutor process).
* Lab 03: three 2-rank launches of the checkpoint demonstration into one ``--out-dir`` (a good
  save; a save whose rank 1 is killed after writing its shard, by ``tests/checkpoint_fault.py``;
  the next run), then ``--load-resharded`` on the previous checkpoint and on damaged copies of
  the last one (in this process).
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import Future
from pathlib import Path

import pytest
import torch

from minigpt import checkpoints, train, tutor
from minigpt.runners import lab03_fsdp_practice as lab03
from tests import background, launcher
from tests.launcher import ROOT, start_ranks
from tests.limits import HINT, limit

TINY = ["--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--batch-size", "16", "--eval-every", "0", "--quiet"]
TINY += ["--warmup", "2", "--steps", "6"]  # runs stop at step 2 or 4: no final evaluation (seconds)


def subprocess_env() -> dict:
    """This process's environment for a child that must compute what this process computes: the
    same package, and the same number of threads (another count may pick other float32 kernels)."""
    return {**launcher.environ(), "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(torch.get_num_threads())}


def one_error_line(err: str, prog: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), err
    return lines[0]


# ----------------------------------------------------------------------------------------------
# The module: leftovers, and the folder swap interrupted at every step


def test_write_file_removes_only_its_own_leftovers(tmp_path):
    path = tmp_path / "minigpt.pt"
    ours = [tmp_path / "minigpt.pt.k2j_x9a0.tmp", tmp_path / "minigpt.pt.0123abcd.old"]
    theirs = [tmp_path / n for n in ("minigpt.pt.backup.tmp", "minigpt.pt.bak", "other.pt.k2j_x9a0.tmp", "notes.tmp")]
    for p in ours + theirs:
        p.write_text("x")
    (tmp_path / "minigpt.pt.abcdefgh.tmp.d").mkdir()
    checkpoints.write_file(path, lambda f: f.write(b"new"))
    assert path.read_bytes() == b"new"
    assert checkpoints.leftovers(path) == []
    assert all(p.exists() for p in theirs) and (tmp_path / "minigpt.pt.abcdefgh.tmp.d").is_dir()


class Crash(BaseException):
    """What the drill raises in place of a kill (a BaseException: no ``except Exception`` eats it)."""


def save_folder(path: Path, version: str) -> None:
    tmp = checkpoints.new_folder(path)
    (tmp / "shards").mkdir()
    for rank in range(2):
        (tmp / "shards" / f"rank{rank}.bin").write_text(f"{version} of rank {rank}\n" * (1 + rank))
    (tmp / "whole.bin").write_text(version)
    checkpoints.commit_folder(tmp, path)


def crash_at(k: int, count, name: str, real):
    """``real``, except that the k-th call of any step (counted by the shared iterator ``count``)
    raises Crash instead."""

    def step(*args, **kwargs):
        if next(count) == k:
            raise Crash(name)
        return real(*args, **kwargs)

    return step


def test_folder_swap_interrupted_at_every_step(tmp_path, monkeypatch):
    """Save v1; then save v2, crashing at the k-th file-system step (k = 1, 2, ...) until a save
    runs through. After every crash a complete checkpoint (v1 or v2) is found at the path, and
    the next save (v3) succeeds and leaves nothing beside it."""
    path = tmp_path / "ckpt"
    steps = {"rename": os.rename, "fsync": os.fsync, "rmtree": shutil.rmtree}
    seen = set()
    for k in range(1, 100):
        shutil.rmtree(tmp_path)
        tmp_path.mkdir()
        save_folder(path, "v1")
        with monkeypatch.context() as m:
            count = iter(range(1, 1000))
            for name, real in steps.items():
                m.setattr(shutil if name == "rmtree" else os, name, crash_at(k, count, name, real))
            try:
                save_folder(path, "v2")
                crashed = None
            except Crash as exc:
                crashed = str(exc)
        found = checkpoints.recover(path)
        assert found == path, f"crash {k} ({crashed}): no checkpoint found"
        checkpoints.check_folder(path, required=["whole.bin", "shards/rank1.bin"])
        seen.add((path / "whole.bin").read_text())
        save_folder(path, "v3")
        assert (path / "whole.bin").read_text() == "v3" and checkpoints.leftovers(path) == []
        if crashed is None:
            break
    assert k > 5 and seen == {"v1", "v2"}, (k, seen)  # the drill crossed the swap


def test_replaceable_refuses_a_folder_of_other_files(tmp_path):
    path = tmp_path / "ckpt"
    save_folder(path, "v1")
    (path / "report.json").write_text("{}")
    checkpoints.replaceable(path, also=["report.json"])
    (path / "notes.txt").write_text("mine")
    with pytest.raises(checkpoints.CheckpointError, match=r"notes\.txt\); a new checkpoint replaces"):
        checkpoints.replaceable(path, also=["report.json"])
    old = tmp_path / "old-layout"
    (old / "shards").mkdir(parents=True)
    (old / "shards" / "a.bin").write_text("x")
    checkpoints.replaceable(old, also=["shards/*.bin"])  # no marker: only the layout it names


# ----------------------------------------------------------------------------------------------
# The trainer: killed in the middle of a save


SLOW_SAVE = """
import io, sys, time
import torch
from minigpt import train

real_save = torch.save


def half_then_wait(obj, f, *args, **kwargs):
    buffer = io.BytesIO()
    real_save(obj, buffer, *args, **kwargs)
    data = buffer.getvalue()
    f.write(data[: len(data) // 2])
    f.flush()
    print("HALF-WRITTEN", flush=True)
    time.sleep(3600)


torch.save = half_then_wait
train.main(sys.argv[1:])
"""


def wait_for(proc: subprocess.Popen, word: bytes, seconds: float, log: Path) -> None:
    """Read ``proc``'s stdout (unbuffered) until ``word`` appears; fail at the time limit."""
    seen, deadline = b"", time.monotonic() + seconds
    while word not in seen:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or proc.poll() is not None:
            proc.kill()
            pytest.fail(f"no {word!r} within {seconds:g} s ({HINT}); exit {proc.poll()}\n{log.read_text()[-2000:]}")
        if select.select([proc.stdout], [], [], remaining)[0]:
            seen += os.read(proc.stdout.fileno(), 4096)


def test_trainer_killed_mid_save_keeps_the_previous_checkpoint(tmp_path):
    ckpt = tmp_path / "minigpt.pt"
    train.main([*TINY, "--stop-at", "2", "--out", str(ckpt)])
    before = ckpt.read_bytes()
    log = tmp_path / "killed.log"
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", SLOW_SAVE, "--resume", str(ckpt), "--stop-at", "4", "--quiet"],
            cwd=ROOT,
            env=subprocess_env(),
            stdout=subprocess.PIPE,
            stderr=err,
            bufsize=0,
        )
        try:
            wait_for(proc, b"HALF-WRITTEN", limit(120), log)
            proc.send_signal(signal.SIGKILL)
            assert proc.wait(timeout=limit(30)) == -signal.SIGKILL
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.stdout.close()
    # the kill came mid-write: half a checkpoint lies beside the untouched previous one
    assert ckpt.read_bytes() == before
    (stale,) = checkpoints.leftovers(ckpt)
    assert stale.name.startswith("minigpt.pt.") and stale.suffix == ".tmp" and 0 < stale.stat().st_size
    assert train.load_checkpoint(ckpt)["step"] == 2
    # the next run resumes from it, and its save removes the stale file
    train.main(["--resume", str(ckpt), "--stop-at", "4", "--quiet"])
    assert train.load_checkpoint(ckpt)["step"] == 4
    assert checkpoints.leftovers(ckpt) == [] and not stale.exists()
    # and it wrote the very bytes of a run that was never interrupted
    straight = tmp_path / "straight.pt"
    train.main([*TINY, "--stop-at", "4", "--out", str(straight)])
    assert ckpt.read_bytes() == straight.read_bytes()


def test_same_seed_runs_write_byte_identical_checkpoints(tmp_path):
    """One run in a new process, one here (whose global numpy and Python generators have been
    drawn from by other tests): the same bytes. Another seed: other bytes."""
    there, here, other = tmp_path / "there.pt", tmp_path / "here.pt", tmp_path / "other.pt"
    done = subprocess.run(
        [sys.executable, "-m", "minigpt.train", *TINY, "--stop-at", "4", "--seed", "5", "--out", str(there)],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=limit(120),
    )
    assert done.returncode == 0, done.stderr
    train.main([*TINY, "--stop-at", "4", "--seed", "5", "--out", str(here)])
    train.main([*TINY, "--stop-at", "4", "--seed", "6", "--out", str(other)])
    assert there.read_bytes() == here.read_bytes()
    assert here.read_bytes() != other.read_bytes()
    assert set(torch.load(here, weights_only=False)["rng"]) == {"torch"}  # no unused generator state


# ----------------------------------------------------------------------------------------------
# The trainer: inconsistent checkpoints, refused in one line


@pytest.fixture(scope="module")
def good_state(tmp_path_factory) -> dict:
    path = tmp_path_factory.mktemp("good") / "good.pt"
    train.main([*TINY, "--stop-at", "2", "--out", str(path)])
    return torch.load(path, weights_only=False)


def _set(d: dict, key: str, value) -> None:
    d[key] = value


BROKEN = {
    "wrong shape": (
        lambda s: _set(s["model"], "wte.weight", torch.zeros(10, 32)),
        "the model: 'wte.weight' has shape (10, 32), the model its config describes needs (609, 32)",
    ),
    "unknown config key": (lambda s: _set(s["train_config"], "colour", "blue"), "unknown config key 'colour'"),
    "missing config key": (lambda s: s["train_config"].pop("lr"), "the config key 'lr' is missing"),
    "missing key": (lambda s: s.pop("optimizer"), "the checkpoint has no 'optimizer'"),
    "missing tensor": (lambda s: s["model"].pop("ln_f.bias"), "lacks 1 of the model's tensors, first 'ln_f.bias'"),
    "unknown dtype": (
        lambda s: _set(s["train_config"], "dtype", "bfloat16"),
        "its config is not valid: --dtype bfloat16: unknown; choose from float32, float64",
    ),
    "tensor dtype": (
        lambda s: _set(s["model"], "wpe.weight", s["model"]["wpe.weight"].half()),
        "'wpe.weight' is float16, the model its config describes is float32",
    ),
    "optimizer shape": (
        lambda s: _set(s["optimizer"]["state"][0], "exp_avg", torch.zeros(3)),
        "the optimizer state: exp_avg of parameter 0 is (3,) float32",
    ),
    "step": (lambda s: _set(s, "step", 99), "its step 99 is not a step count in 0..6"),
    "truncated": (None, "is not a readable MiniGPT checkpoint (RuntimeError)"),
}


def write_broken(state: dict, case: str, folder: Path) -> Path:
    path = folder / f"{case.replace(' ', '-')}.pt"
    if BROKEN[case][0] is None:
        torch.save(state, path)
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    else:
        broken = {**state, "model": dict(state["model"]), "train_config": dict(state["train_config"])}
        broken["optimizer"] = {
            **state["optimizer"],
            "state": {k: dict(v) for k, v in state["optimizer"]["state"].items()},
        }
        BROKEN[case][0](broken)
        torch.save(broken, path)
    return path


@pytest.mark.parametrize("case", BROKEN)
def test_inconsistent_checkpoint_refused_in_one_line(good_state, case, tmp_path, capsys):
    path = write_broken(good_state, case, tmp_path)
    for prog, argv, entry in (
        ("minigpt.tutor", ["--checkpoint", str(path), "nosotros habla español"], tutor.main),
        ("minigpt.train", ["--resume", str(path), "--quiet"], train.main),
    ):
        with pytest.raises(SystemExit) as exit_info:
            entry(argv)
        line = one_error_line(capsys.readouterr().err, prog)
        assert exit_info.value.code == 2
        assert str(path) in line and BROKEN[case][1] in line, line


# ----------------------------------------------------------------------------------------------
# Lab 03: a rank killed in the middle of the sharded save

LAB = ["--only", "checkpoint", "--steps", "2", "--batch-size", "16", "--timeout", "30"]


def digests(folder: Path) -> dict[str, str]:
    """SHA-256 of every file of a Lab 03 checkpoint (the world-1 load's report aside)."""
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != "load-report.json"
    }


@pytest.fixture
def threads_kept():
    """The world-1 load sets this process to one thread (the saving ranks' kernels); restore it."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def load_here(out_dir: Path, monkeypatch, capsys) -> tuple[int, str]:
    """``python lab/03_fsdp_practice.py --load-resharded OUT_DIR``, run in this process."""
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "TORCHELASTIC_ERROR_FILE"):
        monkeypatch.delenv(name, raising=False)
    code = lab03.main(["--load-resharded", str(out_dir)])
    return code, capsys.readouterr().err


def drill(tmp: Path) -> dict:
    """A good save; a save whose rank 1 dies after writing its shard (what is on disk then is
    recorded); the next run into the same --out-dir. Three 2-rank launches, on the suite's second
    lane (tests/background.py): the tests that read them run at the end of the session."""
    out_dir = tmp / "checkpoints"
    script, fault = str(ROOT / "lab" / "03_fsdp_practice.py"), str(ROOT / "tests" / "checkpoint_fault.py")
    facts = {"out_dir": out_dir}
    first = start_ranks([script, *LAB, "--out-dir", str(out_dir)], 2, limit(180))
    facts["first_codes"] = [r.returncode for r in first]
    facts["first_digests"] = digests(out_dir) if out_dir.is_dir() else {}
    killed = start_ranks([fault, "1", *LAB, "--out-dir", str(out_dir)], 2, limit(180))
    facts["killed_codes"] = [r.returncode for r in killed]
    facts["killed_stderr"] = killed[0].stderr[-2000:]
    facts["after_kill_digests"] = digests(out_dir) if out_dir.is_dir() else {}
    facts["leftovers"] = {
        p.name: sorted(f.relative_to(p).as_posix() for f in p.rglob("*") if f.is_file())
        for p in checkpoints.leftovers(out_dir)
    }
    # the previous checkpoint is read now, before the next run replaces it
    shutil.copytree(out_dir, tmp / "previous")
    facts["previous"] = tmp / "previous"
    again = start_ranks([script, *LAB, "--out-dir", str(out_dir)], 2, limit(180))
    facts["again_codes"] = [r.returncode for r in again]
    facts["again_stderr"] = again[0].stderr[-2000:]
    facts["again_leftovers"] = checkpoints.leftovers(out_dir)
    return facts


def submit_drill(config: pytest.Config) -> Future:
    return background.launch(config, "lab03_drill", "lab03 checkpoint drill", drill)


@pytest.fixture(scope="module")
def lab03_drill(request) -> dict:
    return submit_drill(request.config).result(timeout=limit(600))


@pytest.mark.timeout(600)
def test_lab03_rank_killed_mid_save_leaves_the_previous_checkpoint(lab03_drill, monkeypatch, capsys, threads_kept):
    d = lab03_drill
    assert d["first_codes"] == [0, 0]
    assert d["killed_codes"] == [1, -signal.SIGKILL], d["killed_stderr"]
    assert "[rank 0] error: " in d["killed_stderr"]  # rank 0 saw its peer die and stopped
    # the interrupted save wrote shards but no index, beside the checkpoint, not into it
    ((name, files),) = d["leftovers"].items()
    assert name.startswith("checkpoints.") and name.endswith(".tmp")
    assert any(f.endswith(".distcp") for f in files) and "sharded/.metadata" not in files, files
    assert checkpoints.MARKER not in files and "full.pt" not in files
    assert d["after_kill_digests"] == d["first_digests"] and checkpoints.MARKER in d["first_digests"]
    # the previous checkpoint loads as the lab loads it
    code, err = load_here(d["previous"], monkeypatch, capsys)
    assert code == 0, err
    assert json.loads((d["previous"] / "load-report.json").read_text())["max_logit_difference"] == 0.0


@pytest.mark.timeout(600)
def test_lab03_next_run_after_a_killed_save_proceeds(lab03_drill):
    d = lab03_drill
    assert d["again_codes"] == [0, 0], d["again_stderr"]
    assert d["again_leftovers"] == []
    checkpoints.check_folder(d["out_dir"], required=["sharded/.metadata", "full.pt", "probe-logits.pt"])
    assert json.loads((d["out_dir"] / "load-report.json").read_text())["max_logit_difference"] == 0.0


def reseal(folder: Path) -> None:
    """Rewrite the marker for the files as they are now: a consistent marker over bad content."""
    marker = json.loads((folder / checkpoints.MARKER).read_text())
    for name, entry in marker["files"].items():
        data = (folder / name).read_bytes()
        entry.update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    (folder / checkpoints.MARKER).write_text(json.dumps(marker))


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def wrong_full(folder: Path) -> None:
    full = torch.load(folder / "full.pt", weights_only=False)
    full["model"]["wpe.weight"] = torch.zeros(5, 96)
    torch.save(full, folder / "full.pt")
    reseal(folder)


def wrong_probe(folder: Path) -> None:
    torch.save(torch.zeros(2, 3), folder / "probe-logits.pt")
    reseal(folder)


LAB03_BROKEN = {
    "missing marker": (lambda f: (f / "complete.json").unlink(), "{d}: no completion marker complete.json"),
    "truncated shard": (lambda f: truncate(f / "sharded" / "__1_0.distcp"), "{d}/sharded/__1_0.distcp: "),
    "missing full.pt": (lambda f: (f / "full.pt").unlink(), "{d}/full.pt: missing (the checkpoint's complete.json"),
    "truncated probe": (lambda f: truncate(f / "probe-logits.pt"), "{d}/probe-logits.pt: "),
    "resealed truncated shard": (
        lambda f: (truncate(f / "sharded" / "__0_0.distcp"), reseal(f)),
        "{d}/sharded: DCP cannot load it into MiniGPT and AdamW (",
    ),
    "resealed wrong full.pt": (
        wrong_full,
        "{d}/full.pt: the model: 'wpe.weight' has shape (5, 96), the lab's MiniGPT needs (32, 96)",
    ),
    "resealed wrong probe": (wrong_probe, "{d}/probe-logits.pt: not the probe logits of this model"),
    "no checkpoint": (lambda f: shutil.rmtree(f), "no checkpoint in {d}; save one first"),
}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("case", LAB03_BROKEN)
def test_lab03_inconsistent_checkpoint_refused_in_one_line(
    lab03_drill, case, tmp_path, monkeypatch, capsys, threads_kept
):
    folder = tmp_path / "checkpoints"
    shutil.copytree(lab03_drill["out_dir"], folder)
    damage, expected = LAB03_BROKEN[case]
    damage(folder)
    code, err = load_here(folder, monkeypatch, capsys)
    line = one_error_line(err, lab03.PROG)
    assert code == 2 and expected.format(d=folder) in line, line
    if case in ("truncated shard", "truncated probe"):
        assert "bytes where complete.json says" in line and "(truncated or overwritten)" in line


@pytest.mark.timeout(600)
def test_lab03_load_finishes_a_swap_killed_between_its_renames(
    lab03_drill, tmp_path, monkeypatch, capsys, threads_kept
):
    """Killed after the old folder was renamed aside and before the new one was renamed in:
    nothing at --out-dir, both complete beside it. The load takes the newer one into place."""
    out_dir = tmp_path / "checkpoints"
    shutil.copytree(lab03_drill["previous"], tmp_path / "checkpoints.0123abcd.old")
    shutil.copytree(lab03_drill["out_dir"], tmp_path / "checkpoints.zz_new99.tmp")
    code, err = load_here(out_dir, monkeypatch, capsys)
    assert code == 0, err
    assert digests(out_dir) == digests(lab03_drill["out_dir"])
    assert [p.name for p in checkpoints.leftovers(out_dir)] == ["checkpoints.0123abcd.old"]  # the next save removes it
