"""Every option that names a file or folder to write: a missing parent folder is created, and a path
that cannot work is refused before any work starts (exit 2, one line naming the path and why,
nothing written). Each entry point's ``main`` is called in this process: no process group, no
model, no training may happen before the refusal.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import pytest
import torch.distributed as dist

# (module whose main() is called, the option, "file" or "dir", other arguments that make the call valid)
OUTPUTS = [
    ("minigpt.train", "--out", "file", ["--steps", "2", "--warmup", "1"]),
    ("minigpt.runners.lab01_ddp", "--report", "file", []),
    ("minigpt.runners.lab01_benchmark", "--out", "dir", []),
    ("minigpt.runners.lab01_links", "--out", "dir", []),
    ("minigpt.runners.lab02_crosscheck", "--report", "file", []),
    ("minigpt.runners.lab01_kernel_sets", "--out", "dir", []),
    ("minigpt.runners.lab01_drift", "--out", "dir", []),
    ("minigpt.runners.lab03_fsdp_prefetch", "--report", "file", []),
    ("minigpt.runners.lab03_fsdp_prefetch", "--trace-dir", "dir", []),
    ("minigpt.runners.lab03_fsdp_practice", "--report", "file", []),
    ("minigpt.runners.lab03_fsdp_options", "--report", "file", []),
    ("minigpt.runners.lab03_compile_budget", "--report", "file", []),
    ("minigpt.runners.lab00_batch_scaling", "--report", "file", []),
    ("minigpt.runners.lab03_fsdp_practice", "--out-dir", "dir", []),
    ("minigpt.runners.lab03_fsdp_reading", "--markdown", "file", []),
    ("minigpt.pages.site", "--tables-dir", "dir", []),
    ("minigpt.pages.site", "--figures-dir", "dir", []),
]


def read_only_folder(tmp_path: Path) -> Path:
    """A folder this process cannot create files in. Root ignores permission bits, so as root it is
    /sys (a file system the kernel does not let anyone create files in)."""
    if os.geteuid() == 0:
        return Path("/sys")
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    return folder


def bad_paths(kind: str, tmp_path: Path) -> list[tuple[str, str]]:
    """(path, what the message must say) for every way a path can be wrong for ``kind``."""
    a_file = tmp_path / "a-file.txt"
    a_file.write_text("not a folder\n")
    a_folder = tmp_path / "a-folder"
    a_folder.mkdir()
    cases = [
        (str(a_file / "below" / "x.json"), "is a file, not a folder"),
        (str(read_only_folder(tmp_path) / "new" / "x.json"), "is not writable"),
    ]
    if kind == "file":
        cases.append((str(a_folder), "is a folder; give a file name"))
    else:
        cases.append((str(a_file), "is a file; give a folder"))
    return cases


def exit_code(module: str, argv: list[str]) -> int:
    """Run ``module.main(argv)`` here; its exit status (``main`` returns it or raises SystemExit)."""
    try:
        result = importlib.import_module(module).main(argv)
    except SystemExit as exc:
        return exc.code
    return 0 if result is None or isinstance(result, dict) else result


@pytest.mark.parametrize(
    "module, option, kind, extra", OUTPUTS, ids=[f"{m.split('.')[-1]}{o}" for m, o, _, _ in OUTPUTS]
)
def test_a_path_that_cannot_work_is_refused_before_any_work(module, option, kind, extra, tmp_path, capsys, monkeypatch):
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "TORCHELASTIC_ERROR_FILE"):
        monkeypatch.delenv(name, raising=False)
    for path, why in bad_paths(kind, tmp_path):
        before = sorted(tmp_path.rglob("*"))
        code = exit_code(module, [*extra, option, path])
        lines = capsys.readouterr().err.strip().splitlines()
        assert code == 2, f"{module} {option} {path}: exit {code}"
        assert len(lines) == 1 and f": error: {option} {path}: " in lines[0] and why in lines[0], lines
        assert sorted(tmp_path.rglob("*")) == before, f"{module} {option} {path} left files behind"
        assert not dist.is_initialized(), f"{module} started a process group before refusing {path}"


def test_missing_parent_folders_are_created(tmp_path):
    from minigpt import cli

    report = tmp_path / "some" / "new" / "folder" / "x.json"
    assert cli.output_file(report, "--report") == report
    assert not (tmp_path / "some").exists(), "checking a path must not create anything"
    cli.make_parents(report)
    assert report.parent.is_dir()
    folder = tmp_path / "deep" / "trace"
    cli.output_dir(folder, "--trace-dir")
    assert cli.make_parents(folder, is_dir=True).is_dir()


def test_a_report_in_a_new_folder_is_written(tmp_path):
    """The trainer writes its checkpoint into folders that did not exist (one tiny run; the lab
    scripts' reports go into new folders in their own tests)."""
    from minigpt import train

    out = tmp_path / "new" / "folder" / "minigpt.pt"
    train.main(
        [
            "--steps",
            "2",
            "--warmup",
            "1",
            "--n-layer",
            "1",
            "--n-embd",
            "16",
            "--n-head",
            "2",
            "--eval-every",
            "0",
            "--quiet",
            "--out",
            str(out),
            "--stop-at",
            "1",
        ]
    )
    assert out.is_file()
