"""Every learner's machine: the set-up works on the Pythons and systems learners own, or says plainly why not.

* a pin with no distribution for a supported Python is named by ``make check-pins`` (.ci/check_pins.py), with the
  Python and the system (this test asks PyPI: one Python, one system, the core dependencies only);
* the one-process world (``launch.init()`` without torchrun: every notebook's first cell) needs no store that
  Windows lacks, and leaves no file behind;
* gloo that cannot start because this machine's name does not resolve (a Mac, often) ends in one line naming the
  fix, ``GLOO_SOCKET_IFNAME``;
* make install's browser step never fails the install: an ``apt-get`` that fails is one WARNING line and exit
  status 0, and the score table's NOT RUN line says why the browser test did not run.

These tests check the course's own machinery and carry no points.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.limits import limit

ROOT = Path(__file__).resolve().parent.parent


def run(args: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **kwargs.pop("env", {})}
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env, **kwargs)


# --- make check-pins -------------------------------------------------------------------------------------------


def test_check_pins_names_a_pin_with_no_distribution_for_python_3_10(tmp_path):
    """numpy 2.4 has no wheel for Python 3.10: pinned, the check names it, the Python and the system, fails, and
    says what pip picks once it is left out. Asked of a one-package project (numpy alone, for Windows) so that pip's
    resolver answers in seconds: the same code path as make check-pins on the course's pins, which takes minutes."""
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "one"\nversion = "0"\ndependencies = ["numpy"]\n')
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("numpy==2.4.6\n", encoding="utf-8")
    proc = run(
        [sys.executable, ".ci/check_pins.py", "--python", "3.10", "--system", "windows-amd64", "--extras", ""]
        + ["--constraints", str(constraints), "--pyproject", str(tmp_path / "pyproject.toml")],
        timeout=limit(120),
    )
    if "cannot reach" in proc.stdout:
        pytest.skip(f"PyPI cannot be reached from here, so the pins were not checked: {proc.stdout.strip()[-300:]}")
    line = "numpy==2.4.6 (constraints.txt line 1) has no distribution for Python 3.10 on windows-amd64"
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"FAIL  Python 3.10 · windows-amd64: {line}" in proc.stdout, proc.stdout + proc.stderr
    assert "with those left out, pip picks numpy==2.2.6" in proc.stdout, proc.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["--system", "macos-x86_64"], "--system macos-x86_64: unknown system 'macos-x86_64'; use linux-x86_64,"),
        (["--python", "3.x"], "--python 3.x: give versions as 3.X, comma-separated"),
        (["--extras", "gpu"], "--extras gpu: pyproject.toml has no such extra"),
        (["--constraints", "no-such-file.txt"], "--constraints no-such-file.txt"),
    ],
)
def test_check_pins_refuses_bad_input_in_one_line(args, message):
    proc = run([sys.executable, ".ci/check_pins.py", *args], timeout=limit(60))
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_check_pins_refuses_pins_whose_markers_overlap(tmp_path):
    constraints = tmp_path / "constraints.txt"
    constraints.write_text('numpy==2.2.6; python_version < "3.12"\nnumpy==2.4.6; python_version >= "3.11"\n')
    proc = run([sys.executable, ".ci/check_pins.py", "--constraints", str(constraints)], timeout=limit(60))
    assert proc.returncode == 2, proc.stderr
    assert "lines 1 and 2 both pin numpy for Python 3.11" in proc.stderr, proc.stderr


# --- the one-process world and gloo's address -------------------------------------------------------------------


def test_the_world_of_one_needs_no_store_that_windows_lacks(tmp_path):
    """Windows' torch has no HashStore: taken away here, launch.init() still starts a world of one, its collectives
    run, and its store (a file in the temporary folder) is gone after teardown, and after a rank that stops with
    launch.fail (which exits without running the store's destructor)."""
    code = """
import os, sys
import torch
import torch.distributed as dist
del dist.HashStore
from minigpt.parallel import launch
ctx = launch.init()
t = torch.arange(4.0)
dist.all_reduce(t)
assert ctx.world_size == 1 and t.tolist() == [0.0, 1.0, 2.0, 3.0]
launch.teardown()
print("ok", os.listdir(sys.argv[1]))
ctx = launch.init()
assert len(os.listdir(sys.argv[1])) == 1
launch.fail(ctx, "stopped on purpose", code=2)
"""
    proc = run([sys.executable, "-c", code, str(tmp_path)], timeout=limit(120), env={"TMPDIR": str(tmp_path)})
    assert proc.returncode == 2 and proc.stdout.strip() == "ok []", (proc.stdout, proc.stderr)
    assert proc.stderr.strip() == "[rank 0] error: stopped on purpose", proc.stderr
    assert list(tmp_path.iterdir()) == [], "the world of one left its store behind"
    assert not [p for p in (ROOT / "minigpt").rglob("*.py") if "HashStore" in p.read_text(encoding="utf-8")]


def test_gloo_that_cannot_find_this_machine_says_to_set_gloo_socket_ifname(monkeypatch, capsys, tmp_path):
    """A Mac whose name does not resolve: gloo cannot start, and launch.init() ends in one line naming the fix."""
    import socket
    import tempfile

    from minigpt.parallel import launch

    def gloo_on_that_mac(*args, **kwargs):
        raise RuntimeError(
            "[enforce fail at ../third_party/gloo/gloo/transport/uv/device.cc:153] rp != nullptr. "
            "Unable to find address for: learners-macbook.invalid"
        )

    def no_address(host, *args, **kwargs):
        raise socket.gaierror(8, "nodename nor servname provided, or not known")

    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(launch.dist, "init_process_group", gloo_on_that_mac)
    monkeypatch.setattr(socket, "gethostname", lambda: "learners-macbook.invalid")
    monkeypatch.setattr(socket, "getaddrinfo", no_address)
    with pytest.raises(SystemExit) as stopped:
        launch.init()
    assert stopped.value.code == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("[rank 0] error: the gloo process group could not start"), lines[0]
    assert "'learners-macbook.invalid' does not resolve" in lines[0] and "GLOO_SOCKET_IFNAME=lo0" in lines[0]


def test_a_store_that_times_out_is_not_taken_for_gloos_address(monkeypatch):
    from minigpt.parallel import launch

    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    assert launch.gloo_address_hint("gloo", RuntimeError("Timed out after 31 seconds waiting for clients")) is None
    assert launch.gloo_address_hint("nccl", RuntimeError("Unable to find address for: x")) is None
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo0")
    assert launch.gloo_address_hint("gloo", RuntimeError("Unable to find address for: lo0")) is None


# --- make install's browser step -------------------------------------------------------------------------------


@pytest.fixture
def apt_get_that_fails(tmp_path) -> dict:
    """A PATH whose first apt-get fails as it does while another process holds Debian's package lock (exit 100),
    whose ``id -u`` says root, and a chromium path that does not exist."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "apt-get").write_text(
        "#!/bin/sh\n"
        'echo "E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 4242 (apt-get)" >&2\n'
        "exit 100\n"
    )
    (fake / "id").write_text("#!/bin/sh\necho 0\n")
    for tool in fake.iterdir():
        tool.chmod(0o755)
    return {"PATH": f"{fake}{os.pathsep}{os.environ['PATH']}", "chromium": str(tmp_path / "missing" / "chromium")}


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_a_failing_apt_get_is_one_warning_and_the_browser_test_says_why_it_did_not_run(apt_get_that_fails, tmp_path):
    venv = tmp_path / "venv"
    proc = run(
        ["make", "--no-print-directory", "browser", f"CHROMIUM={apt_get_that_fails['chromium']}", f"VENV={venv}"],
        timeout=limit(60),
        env={"PATH": apt_get_that_fails["PATH"]},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    warnings = [line for line in (proc.stdout + proc.stderr).splitlines() if "WARNING" in line]
    assert len(warnings) == 1, proc.stdout + proc.stderr
    assert warnings[0].startswith(f"WARNING: {apt_get_that_fails['chromium']} is missing and apt-get failed")
    assert "exit status 100: E: Could not get lock" in warnings[0] and proc.stderr == "", proc.stderr
    note = venv / "browser-not-installed.txt"
    assert "Could not get lock" in note.read_text(encoding="utf-8")

    # the suite then reports the browser test NOT RUN, with the reason, where the score table ends
    env = {"MINIGPT_CHROMIUM": apt_get_that_fails["chromium"], "MINIGPT_BROWSER_NOTE": str(note), "CI": ""}
    suite = run(
        [sys.executable, "-m", "pytest", "-q", "tests/test_site.py::test_site_in_a_real_browser"],
        timeout=limit(120),
        env=env,
    )
    assert suite.returncode == 0, suite.stdout[-2000:]
    not_run = [line for line in suite.stdout.splitlines() if line.startswith("NOT RUN: ")]
    assert len(not_run) == 1 and re.search(
        r"chromium is missing, so the website was not tested in a browser: make install could not install it, "
        r"apt-get failed \(exit status 100: E: Could not get lock",
        not_run[0],
    ), suite.stdout[-2000:]


# --- every make target the pages use, without make -------------------------------------------------------------

# the maintainers' targets (CONTRIBUTING names them): re-measuring the committed results and checking the pins
MAINTAINERS = re.compile(
    r"^(results(-\d\d.*)?|check-times|check-memory|check-grades|kernel-sets|check-pins|clean|format|browser|slurm)$"
)


def make_targets_used() -> set[str]:
    """The make targets the pages, READMEs and notebooks tell a learner to type (``make demo``, ``make grade``)."""
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([a-z][\w-]*):", makefile, flags=re.M))
    used = set()
    for pattern in ("README*.md", "lab/*.md", "theory/*.md", "docs/*.md", "notebooks/*.ipynb"):
        for path in ROOT.glob(pattern):
            used |= {t for t in re.findall(r"\bmake ([a-z][\w-]*)", path.read_text(encoding="utf-8")) if t in targets}
    return {t for t in used if not MAINTAINERS.match(t)}


@pytest.mark.parametrize("readme", ["README.md", "README.es.md"])
def test_every_make_command_a_page_uses_has_its_plain_equivalent(readme):
    """README "Platforms" (both languages) shows, in its set-up without make, the command behind every make
    target a learner is told to type, and LANG=es's variable."""
    text = (ROOT / readme).read_text(encoding="utf-8")
    heading = "### Set-up without make" if readme == "README.md" else "### Preparar el entorno sin make"
    block = text[text.index(heading) :]
    block = block[block.index("```bash") : block.index("```\n", block.index("```bash") + 7)]
    used = make_targets_used()
    assert {"demo", "test", "grade", "hint", "notebooks", "docs"} <= used, used
    missing = sorted(t for t in used if f"# make {t}" not in block)
    assert missing == [], f"{readme}'s set-up without make has no plain command for make {', make '.join(missing)}"
    assert "MINIGPT_LANG=es" in block and "--device cpu" in block
