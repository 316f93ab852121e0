"""The suite's fork server (tests/forkhub.py): what a process forked from it gets, and that nothing it
forked outlives the process that asked for it or the process that started the server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests import forkhub, launcher

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="ranks are forked on Linux only (tests/launcher.py)")


def script(folder: Path, name: str, body: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(body))
    return path


def gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


@pytest.fixture(scope="module")
def hub() -> str:
    found = launcher.fork_hub(os.environ)
    assert found is not None
    return found


def test_a_forked_process_gets_its_command_environment_folder_and_exit_code(hub, tmp_path):
    shown = script(
        tmp_path,
        "show.py",
        """
        import os, sys
        print(os.environ["MINIGPT_SEEN"], os.getcwd(), sys.argv[1:], sys.stdin.read() == "")
        print("to stderr", file=sys.stderr)
        sys.exit(3)
        """,
    )
    env = {"PATH": os.environ["PATH"], "MINIGPT_SEEN": "yes"}
    rank = forkhub.HubRank(hub, [str(shown), "a", "b"], env, tmp_path, 0, 60)
    out, err = rank.communicate(60)
    assert rank.returncode == 3
    assert out.split() == ["yes", str(launcher.ROOT), "['a',", "'b']", "True"]
    assert err == "to stderr\n"
    # python -m, in a folder of its own
    module = forkhub.HubRank(hub, ["-m", "json.tool", "--help"], env, tmp_path, 1, 60, cwd=str(tmp_path))
    assert module.wait(60) == 0
    assert "usage" in module.out.read_text()


def test_a_signal_is_a_negative_exit_code_as_in_subprocess(hub, tmp_path):
    killed = script(tmp_path, "killed.py", "import os, signal\nos.kill(os.getpid(), signal.SIGTERM)\n")
    rank = forkhub.HubRank(hub, [str(killed)], dict(os.environ), tmp_path, 0, 60)
    rank.communicate(60)
    assert rank.returncode == -signal.SIGTERM
    sleeper = script(tmp_path, "sleeper.py", "import time\ntime.sleep(600)\n")
    rank = forkhub.HubRank(hub, [str(sleeper)], dict(os.environ), tmp_path, 1, 60)
    assert rank.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        rank.communicate(0.2)
    rank.kill()
    assert rank.wait(60) == -signal.SIGKILL


def test_a_process_group_of_its_own_when_asked_from_the_first_moment(hub, tmp_path):
    sleeper = script(tmp_path, "sleeper.py", "import time\ntime.sleep(600)\n")
    grouped = forkhub.HubRank(hub, [str(sleeper)], dict(os.environ), tmp_path, 0, 60, group=True)
    plain = forkhub.HubRank(hub, [str(sleeper)], dict(os.environ), tmp_path, 1, 60)
    try:
        assert os.getpgid(grouped.pid) == grouped.pid  # jupyter_client signals the kernel's group
        assert os.getpgid(plain.pid) != plain.pid
    finally:
        grouped.kill()
        plain.kill()
    assert grouped.wait(60) == plain.wait(60) == -signal.SIGKILL


CLIENT = """
import os, sys, time
from pathlib import Path
from tests import forkhub
folder = Path(sys.argv[1])
(folder / "sleeper.py").write_text("import os, time\\nprint(os.getpid(), flush=True)\\ntime.sleep(600)\\n")
rank = forkhub.HubRank(forkhub.address(), [str(folder / "sleeper.py")], dict(os.environ), folder, 0, 120)
while not (rank.out.exists() and rank.out.read_text()):
    time.sleep(0.05)
print(rank.pid, os.environ[forkhub.VARIABLE], flush=True)
os._exit(0)  # without waiting for its rank
"""


def test_a_rank_ends_with_the_process_that_asked_for_it(hub, tmp_path):
    env = {**os.environ, forkhub.VARIABLE: hub}
    done = subprocess.run(
        [sys.executable, "-c", CLIENT, str(tmp_path)], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    pid = int(done.stdout.split()[0])
    assert gone(pid, 10), f"rank {pid} outlived its client"


def test_the_server_and_its_ranks_end_with_the_process_that_started_it(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != forkhub.VARIABLE}
    done = subprocess.run(
        [sys.executable, "-c", CLIENT, str(tmp_path)], env=env, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr
    pid, address = done.stdout.split()
    assert gone(int(pid), 10), f"rank {pid} outlived the process that started its server"
    deadline = time.monotonic() + 10
    while Path(address).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(address).exists(), "the server outlived the process that started it"
