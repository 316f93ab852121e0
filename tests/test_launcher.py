"""The suite's ranks (tests/launcher.py): what a rank forked from :mod:`multiprocessing`'s fork server
gets, and what a rank that outlives its time limit leaves."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest

from tests import launcher

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="ranks are forked on Linux only (tests/launcher.py)")


def script(folder: Path, name: str, body: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(body))
    return path


def test_a_forked_rank_gets_its_command_environment_and_exit_code(tmp_path):
    shown = script(
        tmp_path,
        "show.py",
        """
        import os, sys
        print(os.environ["MINIGPT_SEEN"], "RANK" in os.environ, os.getcwd(), sys.argv[1:], sys.stdin.read() == "")
        print("to stderr", file=sys.stderr)
        sys.exit(3)
        """,
    )
    env = {"PATH": os.environ["PATH"], "MINIGPT_SEEN": "yes"}
    rank = launcher.ForkedRank([str(shown), "a", "b"], env, tmp_path, 0)
    out, err = rank.communicate(60)
    assert rank.returncode == 3
    assert out.split() == ["yes", "False", str(launcher.ROOT), "['a',", "'b']", "True"]
    assert err == "to stderr\n"
    module = launcher.ForkedRank(["-m", "json.tool", "--help"], env, tmp_path, 1)
    out, _ = module.communicate(60)
    assert module.returncode == 0 and "usage:" in out, out


def test_ranks_past_their_time_limit_are_killed_and_say_so(tmp_path):
    sleeper = script(tmp_path, "sleeper.py", "import os, time\nprint(os.environ['RANK'], flush=True)\ntime.sleep(60)\n")
    done = launcher.start_ranks([str(sleeper)], 2, timeout_s=3)
    assert [p.returncode for p in done] == [-9, -9]
    assert [p.stdout for p in done] == ["0\n", "1\n"]
    assert done[0].stderr.startswith("killed at its time limit of 3 s"), done  # the one waited for


def test_a_kernel_set_or_the_switch_starts_fresh_processes():
    assert launcher.forks({}) == (sys.platform == "linux")
    assert not launcher.forks({"ATEN_CPU_CAPABILITY": "avx2"})
    assert not launcher.forks({launcher.FORK_VARIABLE: "0"})
