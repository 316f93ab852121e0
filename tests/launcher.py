"""Start N worker processes the way torchrun would (RANK, WORLD_SIZE, MASTER_ADDR/PORT), without
torchrun's agent process (one torch import less), and collect what each rank wrote.

Importing torch, FSDP2, DTensor and dynamo is most of what a short rank costs (about 2 s of CPU; a
grading of every lab starts 16 ranks). On Linux the ranks are therefore forked from
:mod:`multiprocessing`'s fork server, which imports them once per process that starts ranks
(``set_forkserver_preload``): each rank gets its own environment, arguments, output files and thread
count, then runs the script as ``python script`` would (``runpy``, ``__name__ == "__main__"``).
Elsewhere (macOS, where forking after some system libraries is unsafe), with ``MINIGPT_FORK_RANKS=0``,
or under a kernel set (the CPU's kernels are chosen once, from the environment the process started
with), each rank is a fresh ``python`` process."""

from __future__ import annotations

import json
import os
import random
import runpy
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path

from minigpt import kernel_sets
from tests.limits import HINT

ROOT = Path(__file__).resolve().parent.parent


# a run on the suite's second lane (tests/background.py) sets ``environ`` here: the session's environment
# as it was when the lane started, not os.environ, which a test on the first lane changes for its own
# processes meanwhile (monkeypatch.setenv: a start-up timeout of 3 s, a rank started late)
LANE = threading.local()


def environ() -> Mapping[str, str]:
    """The environment a process started now inherits: the lane's (see ``LANE``) on the second
    lane, this process's everywhere else."""
    return getattr(LANE, "environ", None) or os.environ


def record(results: dict[str, dict], out: Path, rank: int, name: str, fn: Callable[[], dict | None]) -> None:
    """For a worker rank: run scenario ``fn``, keep what it returns (or the error it raised, with
    the end of its traceback) as ``results[name]``, and rewrite ``out/rank<r>.json`` at once, so
    that a rank that dies later still leaves what it measured."""
    try:
        results[name] = {"ok": True, **(fn() or {})}
    except BaseException as exc:  # noqa: BLE001 - a learner's bug is a result, not a crash
        message = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        results[name] = {"ok": False, "error": message, "trace": traceback.format_exc()[-1500:]}
    (out / f"rank{rank}.json").write_text(json.dumps(results))


LATE_VARIABLE = "MINIGPT_LATE_RANK"
CONNECT_EXIT = 3  # a worker that could not join the process group (tests/ranks.py: not graded)


def join(timeout_s: float) -> None:
    """For a worker rank: join the gloo group the launcher described, with the labs' own start-up
    (:func:`minigpt.parallel.launch.connect`: a long wait for the other ranks, then ``timeout_s`` for
    every collective). A rank that cannot connect in time says so in one line and exits
    :data:`CONNECT_EXIT`: a busy machine, not the learner's code."""
    from minigpt.parallel import launch

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    try:
        launch.connect("gloo", rank, world, timeout_s)
    except launch.ConnectTimeout as exc:
        sys.stderr.write(f"[rank {rank}] error: {exc}\n")
        sys.stderr.flush()
        os._exit(CONNECT_EXIT)


def ephemeral_ports() -> range:
    """The ports the kernel hands out to outgoing connections (Linux's default if unreadable)."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return range(low, high + 1)


def free_port() -> int:
    """A port no one listens on, for a rendezvous store that binds it a moment later. It is chosen
    outside the ephemeral range: the ports of outgoing connections (gloo opens many) come from that
    range, so none of them can take this one in between. (Asking the kernel for port 0 would hand
    out an ephemeral port, free now but fair game for the next outgoing connection.)"""
    taken = ephemeral_ports()
    candidates = [p for p in range(20000, 32000) if p not in taken]
    random.SystemRandom().shuffle(candidates)
    for port in candidates:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port between 20000 and 32000 outside the ephemeral range")


FORK_VARIABLE = "MINIGPT_FORK_RANKS"  # "0": every rank a fresh python process
# imported once, in multiprocessing's fork server, before any rank is forked: at import they read only their
# own variables (sympy's, TORCH*, TORCHINDUCTOR_*), none that a rank sets
PRELOAD = ["torch", "torch.distributed", "torch.distributed.fsdp", "torch.distributed.tensor", "torch._dynamo"]
_FORK_LOCK = threading.Lock()


def forks(env: Mapping[str, str]) -> bool:
    """Whether a rank with environment ``env`` is forked from the fork server (Linux, no kernel set in
    ``env``, not switched off): otherwise it is a fresh python process."""
    if sys.platform != "linux" or env.get(FORK_VARIABLE, "1") == "0":
        return False
    return not any(k in env for k in kernel_sets.VARIABLES)


def fork_context():
    """:mod:`multiprocessing`'s forkserver context for this process, its server preloading torch."""
    import multiprocessing

    with _FORK_LOCK:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(PRELOAD)
        return context


def start_fork_server() -> None:
    """Start the fork server now (its imports run meanwhile), from this process's environment as it is
    before any test changes it: called when the suite's second lane starts."""
    if forks(os.environ):
        import multiprocessing.forkserver

        fork_context()
        multiprocessing.forkserver.ensure_running()


def rank_main(command: list[str], env: dict[str, str], out_path: str, err_path: str) -> None:
    """In a forked rank: become ``python *command`` (a script and its arguments, or ``-m module ...``)
    run from the repository with environment ``env``, stdin empty, stdout and stderr into the two files;
    exit with its status, through :mod:`multiprocessing`'s own exit (its finalizers run). Nothing of
    the course is imported before ``env`` is in place, so every module that reads the environment at
    import reads the rank's."""
    os.environ.clear()
    os.environ.update(env)
    os.chdir(ROOT)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    for fd, path in ((1, out_path), (2, err_path)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115
    sys.stdout = open(1, "w", encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
    code = 0
    try:
        import torch

        torch.set_num_threads(int(env.get("OMP_NUM_THREADS", "1")))  # the server read its own at import
        sys.path[:0] = env.get("PYTHONPATH", "").split(os.pathsep)
        if command[0] == "-m":
            sys.argv = [command[1], *command[2:]]
            runpy.run_module(command[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = [str(ROOT / command[0]), *command[1:]]
            sys.path.insert(0, str(Path(sys.argv[0]).parent))
            runpy.run_path(sys.argv[0], run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
        if not isinstance(exc.code, int | None):
            print(exc.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - as python prints an uncaught exception
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    raise SystemExit(code)  # multiprocessing's exit runs its finalizers (tqdm's lock), as python's would


class ForkedRank:
    """A rank forked by :func:`fork_context`'s server, with the part of ``subprocess.Popen``'s interface
    that :func:`_collect` uses: its output is read from its two files once it has ended."""

    def __init__(self, command: list[str], env: dict[str, str], folder: Path, rank: int):
        self.args = [sys.executable, *command]
        self.out, self.err = folder / f"stdout{rank}.txt", folder / f"stderr{rank}.txt"
        self.process = fork_context().Process(target=rank_main, args=(command, env, str(self.out), str(self.err)))
        self.process.start()

    @property
    def returncode(self) -> int | None:
        return self.process.exitcode

    def kill(self) -> None:
        self.process.kill()

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        self.process.join(timeout)
        if self.process.exitcode is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        read = lambda p: p.read_text(encoding="utf-8", errors="replace") if p.exists() else ""  # noqa: E731
        return read(self.out), read(self.err)


def start_ranks(
    command: list[str], world_size: int, timeout_s: float, extra_env: dict | None = None
) -> list[subprocess.CompletedProcess]:
    """Run ``python *command`` as ranks 0..world_size-1 (the environment torchrun would give);
    every rank still running at ``timeout_s`` is killed. Returns each rank's exit code and output."""
    import tempfile

    port = free_port()
    procs = []
    late = environ().get(LATE_VARIABLE, "")  # "RANK:SECONDS": start that rank late (a test of start-up)
    late_rank, _, late_s = late.partition(":")
    folder = Path(tempfile.mkdtemp(prefix="minigpt-ranks-"))
    for rank in range(world_size):
        if late and rank == int(late_rank):
            time.sleep(float(late_s))
        env = {
            **environ(),
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": str(world_size),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": str(ROOT),
            **(extra_env or {}),
        }
        if forks(env):
            procs.append(ForkedRank(command, env, folder, rank))
            continue
        procs.append(
            subprocess.Popen(
                [sys.executable, *command], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    try:
        return _collect(procs, timeout_s)
    finally:
        import shutil

        shutil.rmtree(folder, ignore_errors=True)


def _collect(procs: list, timeout_s: float) -> list[subprocess.CompletedProcess]:
    done, deadline = [], time.monotonic() + timeout_s
    for p in procs:
        try:
            out, err = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            out, err = p.communicate()
            err = f"killed at its time limit of {timeout_s:g} s ({HINT})\n{err}"
        done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    return done


def run_script(args: list[str], nproc: int, timeout_s: float) -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc_per_node=<nproc> *args`` (a lab script and its flags) without
    torchrun's agent: the ranks of :func:`start_ranks`, on one node. One result: the exit code of the
    first rank that failed (0 when none did), and the ranks' outputs one after the other in rank order.
    For a test that reads what a lab's check proves; each lab script's own torchrun launch, as a
    learner types it, stays tested elsewhere (CONTRIBUTING, "Where the CPU goes")."""
    done = start_ranks([str(a) for a in args], nproc, timeout_s)
    code = next((p.returncode for p in done if p.returncode), 0)
    return subprocess.CompletedProcess(args, code, "".join(p.stdout for p in done), "".join(p.stderr for p in done))


def run_ranks(
    script: Path,
    world_size: int,
    outdir: Path,
    timeout_s: float,
    extra_env: dict | None = None,
    args: list[str] | None = None,
) -> tuple[list[dict], list[str]]:
    """Run ``python script outdir *args`` as ranks 0..world_size-1; every rank writes
    ``outdir/rank<r>.json``. Returns the per-rank results (``{}`` for a rank that wrote nothing)
    and each rank's stderr tail. A rank still running at ``timeout_s`` is killed."""
    outdir.mkdir(parents=True, exist_ok=True)
    done = start_ranks([str(script), str(outdir), *(args or [])], world_size, timeout_s, extra_env)
    errors = [p.stderr[-3000:] for p in done]
    results = []
    for rank in range(world_size):
        path = outdir / f"rank{rank}.json"
        results.append(json.loads(path.read_text()) if path.exists() else {})
    return results, errors
