"""One server per suite that forks the ranks of every process of the suite (Linux).

Importing torch with FSDP2, DTensor and dynamo is about 4 s of CPU, which every process that starts
ranks (the suite's pytest process, and each of the grader's pytest processes: 28 gradings in a whole
run) would pay again for a server of its own (:mod:`multiprocessing`'s forkserver). So the first
process that needs ranks starts this server, and its address goes down to every process it starts
(``MINIGPT_FORK_HUB``): the gradings' ranks are forked from the same warm server, one import of
torch per suite.

A rank is asked for over a Unix socket: one JSON line (the command, its environment, its two output
files). The server forks; the child becomes the rank (:func:`rank_main`); the server answers the
child's pid, then its exit code when it ends (as ``subprocess``'s ``returncode``: minus the signal for a
rank killed by one). A client that goes away before its rank ends takes its rank with it. The server
ends when the process that started it ends (it reads a pipe that only that process holds open).

Nothing of ours is imported before the fork (only torch's modules), so every module of ours that reads
the environment at import reads the rank's. This module itself imports only the standard library.
"""

from __future__ import annotations

import contextlib
import json
import os
import runpy
import selectors
import signal
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VARIABLE = "MINIGPT_FORK_HUB"  # the server's socket, for the processes the starter starts
PRELOAD = ("torch", "torch.distributed", "torch.distributed.fsdp", "torch.distributed.tensor", "torch._dynamo")


def rank_main(command: list[str], env: dict[str, str], out_path: str, err_path: str, cwd: str | None = None) -> None:
    """In a forked rank: become ``python *command`` (a script and its arguments, or ``-m module ...``)
    with environment ``env``, in folder ``cwd`` (default: the repository), stdin empty, stdout and
    stderr into the two files, and exit with its status."""
    os.environ.clear()
    os.environ.update(env)
    cwd = cwd or str(ROOT)
    os.chdir(cwd)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115
    for fd, path in ((1, out_path), (2, err_path)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    sys.stdout = open(1, "w", encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
    code = 0
    try:
        import torch

        torch.set_num_threads(int(env.get("OMP_NUM_THREADS", "1")))  # the server read its own at import
        paths = env.get("PYTHONPATH", "").split(os.pathsep)
        if command[0] == "-m":  # python -m module args
            sys.path[:0] = [cwd, *paths]
            sys.argv = [command[1], *command[2:]]
            runpy.run_module(command[1], run_name="__main__", alter_sys=True)
        else:
            script = str(Path(ROOT, command[0]))
            sys.argv = [script, *command[1:]]
            sys.path[:0] = [str(Path(script).parent), *paths]
            runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        if isinstance(exc.code, int) or exc.code is None:
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 - as python prints an uncaught exception
        traceback.print_exc()
        code = 1
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


# ---------------------------------------------------------------------------------------------- server


def serve(address: str, starter_fd: int) -> None:
    for module in PRELOAD:
        __import__(module)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address + ".tmp")
    listener.listen(64)
    os.rename(address + ".tmp", address)  # clients wait for this name: the server is ready
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "listener")
    selector.register(starter_fd, selectors.EVENT_READ, "starter")
    selector.register(wake_r, selectors.EVENT_READ, "wake")
    children: dict[int, socket.socket] = {}  # pid -> the client's connection

    def reap() -> None:
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = children.pop(pid, None)
            if conn is not None:
                with contextlib.suppress(OSError):
                    conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
                with contextlib.suppress(KeyError, ValueError):
                    selector.unregister(conn)
                conn.close()

    while True:
        for key, _ in selector.select():
            if key.data == "starter":
                for pid in children:
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
                with contextlib.suppress(OSError):
                    os.unlink(address)
                os._exit(0)
            if key.data == "wake":
                with contextlib.suppress(BlockingIOError):
                    while os.read(wake_r, 512):
                        pass
                reap()
            elif key.data == "listener":
                conn, _ = listener.accept()
                conn.settimeout(30)  # a client sends its request at once: one that does not cannot hold the server
                try:
                    request = _read_line(conn)
                except OSError:
                    request = None
                if request is None:
                    conn.close()
                    continue
                job = json.loads(request)
                pid = os.fork()
                if job.get("group"):  # a process group of its own (set on both sides: no race)
                    with contextlib.suppress(OSError):
                        os.setpgid(0 if pid == 0 else pid, 0 if pid == 0 else pid)
                if pid == 0:  # the rank
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    for fd in (wake_r, wake_w, starter_fd):
                        os.close(fd)
                    listener.close()
                    for other in children.values():
                        other.close()
                    conn.close()
                    selector.close()
                    rank_main(job["command"], job["env"], job["out"], job["err"], job.get("cwd"))
                children[pid] = conn
                conn.sendall(f"{pid}\n".encode())
                selector.register(conn, selectors.EVENT_READ, "client")
                reap()  # a child may have ended before it was registered
            else:  # a client went away (it sends nothing more): its rank goes too
                conn = key.fileobj
                if conn.fileno() == -1:  # its rank ended and was reaped in this round
                    continue
                pid = next((p for p, c in children.items() if c is conn), None)
                selector.unregister(conn)
                if pid is not None:
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
                    children[pid] = conn  # its exit is reaped (and not sent) as usual
                else:
                    conn.close()


def _read_line(conn: socket.socket) -> bytes | None:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(1 << 16)
        if not chunk:
            return None
        data += chunk
    return data


# ---------------------------------------------------------------------------------------------- client

_started: subprocess.Popen | None = None


def address() -> str:
    """The socket of this suite's server, starting one (in the background) if no process above this one
    did; the address also goes into ``os.environ`` for the processes started from now on."""
    global _started
    if os.environ.get(VARIABLE):
        return os.environ[VARIABLE]
    import tempfile

    path = str(Path(tempfile.mkdtemp(prefix="minigpt-forkhub-")) / "hub")
    read_end, write_end = os.pipe()  # this process holds the write end (not inherited): the server's life
    _started = subprocess.Popen(
        [sys.executable, "-c", f"from tests import forkhub; forkhub.serve({path!r}, {read_end})"],
        cwd=ROOT,
        pass_fds=(read_end,),
        env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")},
    )
    os.close(read_end)
    _keep.append(write_end)
    os.environ[VARIABLE] = path
    return path


_keep: list[int] = []


class HubRank:
    """A rank forked by the server, with the part of ``subprocess.Popen``'s interface that
    ``tests.launcher.start_ranks`` uses."""

    stdin = stdout = stderr = None  # as a Popen whose output goes to files

    def __init__(
        self,
        hub: str,
        command: list[str],
        env: dict[str, str],
        folder: Path,
        rank: int,
        wait_s: float,
        *,
        err: Path | None = None,
        cwd: str | None = None,
        group: bool = False,
    ):
        self.args = [sys.executable, *command]
        self.out, self.err = folder / f"stdout{rank}.txt", err or folder / f"stderr{rank}.txt"
        self.returncode: int | None = None
        self.conn = _connect(hub, wait_s)
        request = {
            "command": command,
            "env": env,
            "out": str(self.out),
            "err": str(self.err),
            "cwd": cwd,
            "group": group,
        }
        self.conn.sendall(json.dumps(request).encode() + b"\n")
        self.conn.settimeout(wait_s)
        self.buffer = b""
        self.pid = int(self._line())

    def _line(self) -> str:
        while b"\n" not in self.buffer:
            chunk = self.conn.recv(64)
            if not chunk:
                raise RuntimeError("the suite's fork server went away")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode()

    def poll(self) -> int | None:
        if self.returncode is None:
            self.conn.setblocking(False)
            try:
                self.returncode = int(self._line())
                self.conn.close()
            except BlockingIOError:
                pass
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self.communicate(timeout)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        if self.returncode is None:
            with contextlib.suppress(OSError):
                os.kill(self.pid, signal.SIGKILL)

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        if self.returncode is None:
            self.conn.settimeout(timeout)
            try:
                self.returncode = int(self._line())
            except TimeoutError:
                raise subprocess.TimeoutExpired(self.args, timeout) from None
            self.conn.close()
        read = lambda p: p.read_text(encoding="utf-8", errors="replace") if p.exists() else ""  # noqa: E731
        return read(self.out), read(self.err)


def _connect(hub: str, wait_s: float) -> socket.socket:
    """A connection to the server, waiting (up to ``wait_s``) for one that is still importing torch."""
    deadline = time.monotonic() + wait_s
    while True:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(hub)
            return conn
        except (FileNotFoundError, ConnectionRefusedError):
            conn.close()
            if _started is not None and _started.poll() is not None:
                raise RuntimeError(
                    f"the suite's fork server ended at start-up (exit code {_started.returncode})"
                ) from None
            if time.monotonic() > deadline:
                raise RuntimeError(f"the suite's fork server at {hub} did not answer within {wait_s:g} s") from None
            time.sleep(0.05)
