"""Start-up and tear-down of a distributed run, from the environment ``torchrun`` sets.

``torchrun --nproc_per_node=2 script.py`` starts two copies of ``script.py`` and gives each one
``RANK`` (its number among all processes), ``LOCAL_RANK`` (its number on this machine),
``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` (where the rendezvous store lives). A script
started with plain ``python`` has none of them and runs as a world of one.

:func:`init` picks the backend (gloo on CPU, NCCL when the process has a GPU), sets the timeout
every collective obeys, and returns a :class:`DistContext`. :func:`log` prefixes every line with
the rank. :func:`fail` ends a rank with a message that names it, so a failure on one machine is
never a silent hang on another.

When a rank fails (killed, crashed, frozen), the others must say *which* one, in one line, under
every launcher. A survivor learns it from the failed collective only as "connection closed by
peer 127.0.0.1:port" or a timeout, so :func:`init` has every rank note where its peers run
(host and process id) and :func:`failed_peers` looks at them when something goes wrong: a peer on
this machine whose process is gone (or a zombie) died; one whose process is stopped is frozen; a
peer on another machine is asked through the rendezvous store (:func:`peers_answering`). Two
rules keep torchrun's own report honest (its "Root Cause" is the first rank *it* saw fail):

* a survivor that sees a peer on its machine die prints its line and then waits a few seconds
  for torchrun to stop it, instead of exiting with an error that torchrun would blame on it;
* a survivor stopped by torchrun (SIGTERM) says so in one line, naming the rank that failed
  first when it can tell.

Where each rank runs is decided once, by :func:`place`: a pure function of what the process sees
(:class:`Seen`: a CUDA build, GPUs, ranks on this machine) and the learner's ``--device``.
"""

from __future__ import annotations

import datetime
import gc
import json
import os
import re
import signal
import socket
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import torch
import torch.distributed as dist

from minigpt import cli, divergence

DEFAULT_TIMEOUT_S = 30.0
T = TypeVar("T")
STOP_GRACE_S = 5.0  # how long a survivor waits for torchrun to stop it after a local peer died

# where every rank of this run lives: [(host, pid)] by rank, filled by init() (world size > 1)
_PEERS: list[tuple[str, int]] = []
_CTX: DistContext | None = None
_REPORTED = False  # this rank has already printed why it stops
_OWN_STORE: Path | None = None  # a world of one's store file: os._exit skips the destructor that removes it


@dataclass(frozen=True)
class DistContext:
    rank: int
    local_rank: int
    world_size: int
    backend: str
    device: torch.device
    timeout_s: float

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def torchrun_env() -> tuple[int, int, int]:
    """``(rank, local_rank, world_size)`` from torchrun's environment, or ``(0, 0, 1)`` for a
    plain ``python`` start. A half-set environment, a rank that is not below the world size, a
    port that is not one...: :class:`minigpt.cli.BadInput` (a ValueError) naming the variable and
    its value (:func:`minigpt.cli.launcher_env`), before any process group exists."""
    return cli.launcher_env()


# ----------------------------------------------------------------------------------------------
# Where each rank runs: one decision, from what the process sees

DEVICES, DEVICE_VARIABLE = cli.DEVICES, cli.DEVICE_VARIABLE


@dataclass(frozen=True)
class Seen:
    """What a process sees that decides where its rank runs (:func:`seen_here` reads it)."""

    cuda_build: bool  # this torch was built with CUDA (torch.version.cuda); a CPU build never sees a GPU
    cuda_available: bool  # torch.cuda.is_available(): a CUDA build, a driver and at least one visible GPU
    gpu_count: int  # torch.cuda.device_count(): the GPUs visible to this process (CUDA_VISIBLE_DEVICES)
    local_ranks: int  # the ranks torchrun starts on this machine (LOCAL_WORLD_SIZE; 1 for plain python)
    nvidia_present: bool = False  # an NVIDIA driver's device file exists: a GPU a CPU build cannot use
    torch_version: str = torch.__version__


@dataclass(frozen=True)
class Placement:
    """Where every rank of this machine runs: ``backend`` ("gloo" or "nccl"), ``device_type`` ("cpu"
    or "cuda": rank ``LOCAL_RANK`` takes ``cuda:LOCAL_RANK``), and ``note``, the one line said at start
    when the choice is not the plain one (None on a machine without a GPU)."""

    backend: str
    device_type: str
    note: str | None = None


def requested_device(flag: str | None, environ=None) -> tuple[str, str]:
    """The device asked for and who asked: ``--device`` when given, else ``MINIGPT_DEVICE``, else
    ``"auto"``. A value that is none of :data:`DEVICES` is :class:`minigpt.cli.BadInput` naming it."""
    environ = os.environ if environ is None else environ
    if flag is not None:
        value, source = flag, "--device"
    elif environ.get(DEVICE_VARIABLE, "").strip():
        value, source = environ[DEVICE_VARIABLE].strip(), DEVICE_VARIABLE
    else:
        return "auto", "default"
    if value not in DEVICES:
        shown = f"--device {value}" if source == "--device" else f"{DEVICE_VARIABLE}={value}"
        raise cli.BadInput(f"{shown}: not a device; choose from {', '.join(DEVICES)}")
    return value, source


def place(requested: str, seen: Seen, gpu_command: str | None = None, source: str = "--device") -> Placement:
    """Where the ranks of this machine run, from what the process sees and what the learner asked.

    * ``cpu``: gloo on the CPU, always (said when GPUs stay idle).
    * ``auto``: NCCL with one GPU per rank when there are as many GPUs as ranks on this machine;
      otherwise gloo on the CPU, said in one line with why and, when the lab can run on that many
      ranks (``gpu_command``, built by the caller), the command that would use the GPUs. Two NCCL
      ranks cannot share one GPU, and gloo on the CPU runs every lab on any number of ranks.
    * ``cuda``: NCCL with one GPU per rank, or :class:`minigpt.cli.BadInput` naming the counts.

    A CPU build of torch sees no GPU (``cuda_available`` is False): the CPU case, said when a GPU's
    driver is there.
    """
    if requested not in DEVICES:
        raise cli.BadInput(f"{source} {requested}: not a device; choose from {', '.join(DEVICES)}")
    n, g = seen.local_ranks, seen.gpu_count if seen.cuda_available else 0
    ranks = f"{n} rank{'s' if n != 1 else ''} on this machine"
    gpus = f"{g} GPU{'s' if g != 1 else ''}"
    if requested == "cuda":
        if not seen.cuda_build:
            raise cli.BadInput(
                f"{source} cuda: this torch ({seen.torch_version}) is a CPU build and cannot use a GPU; install "
                "PyTorch's CUDA build (README, Platforms) or give --device auto"
            )
        if g == 0:
            raise cli.BadInput(
                f"{source} cuda: torch {seen.torch_version} sees no GPU (torch.cuda.is_available() is False: no "
                "driver, or CUDA_VISIBLE_DEVICES hides them); give --device auto or cpu"
            )
        if g < n:
            raise cli.BadInput(
                f"{source} cuda: {ranks} need {n} GPUs, one each, and torch sees {gpus}; start torchrun with "
                f"--nproc_per_node={g}, or give --device auto (every rank on the CPU with gloo)"
            )
        return Placement("nccl", "cuda", f"device: NCCL, one GPU per rank ({n} of the {gpus} here)")
    if requested == "cpu":
        note = f"device: CPU with gloo, as {source} cpu asks (the {gpus} here stay idle)" if g else None
        return Placement("gloo", "cpu", note)
    if g >= n:
        return Placement("nccl", "cuda", f"device: NCCL, one GPU per rank ({n} of the {gpus} here)")
    if g > 0:
        how = (
            f"to use the {'GPU' if g == 1 else 'GPUs'}: {gpu_command}"
            if gpu_command
            else f"this lab needs more ranks than the {gpus} here, so it runs on the CPU"
        )
        return Placement("gloo", "cpu", f"device: CPU with gloo: {ranks} but {gpus} (NCCL needs a GPU per rank); {how}")
    if not seen.cuda_build and seen.nvidia_present:
        return Placement(
            "gloo",
            "cpu",
            f"device: CPU with gloo: this torch ({seen.torch_version}) is a CPU build, so the NVIDIA GPU here "
            "is not used; PyTorch's CUDA build uses it (README, Platforms)",
        )
    return Placement("gloo", "cpu")


def local_ranks(environ=None) -> int:
    """The ranks on this machine: torchrun's ``LOCAL_WORLD_SIZE`` (or ``WORLD_SIZE`` when a launcher
    sets only that; 1 for a plain ``python`` start). A value that is no positive integer is
    :class:`minigpt.cli.BadInput`."""
    environ = os.environ if environ is None else environ
    for name in ("LOCAL_WORLD_SIZE", "WORLD_SIZE"):
        text = environ.get(name, "").strip()
        if text:
            if not text.isdigit() or int(text) < 1:
                raise cli.BadInput(f"{name}={text}: not a positive integer; torchrun sets it to the ranks it starts")
            return int(text)
    return 1


def seen_here(environ=None) -> Seen:
    """What this process sees (:class:`Seen`). Nothing here starts CUDA: ``device_count`` asks the
    driver, so a rank that ends on the CPU never creates a CUDA context."""
    cuda_available = torch.cuda.is_available()
    return Seen(
        cuda_build=torch.version.cuda is not None,
        cuda_available=cuda_available,
        gpu_count=torch.cuda.device_count() if cuda_available else 0,
        local_ranks=local_ranks(environ),
        nvidia_present=Path("/dev/nvidiactl").exists(),
    )


def placement_here(flag: str | None = None, gpu_command: str | None = None) -> Placement:
    """:func:`place` for this process: ``flag`` (else ``MINIGPT_DEVICE``, else auto) against :func:`seen_here`."""
    requested, source = requested_device(flag)
    return place(requested, seen_here(), gpu_command, source)


def init(timeout_s: float = DEFAULT_TIMEOUT_S, placement: Placement | None = None) -> DistContext:
    """Join the process group torchrun described (a world of one without torchrun).

    ``placement`` says where the ranks run (default: :func:`placement_here`, from ``MINIGPT_DEVICE``
    or auto); with NCCL each process takes the GPU of its ``LOCAL_RANK``. ``timeout_s`` bounds every
    collective: a peer that died or hangs ends this rank with an error instead of a wait without end.
    """
    if timeout_s <= 0:
        raise ValueError(f"the collective timeout must be positive, got {timeout_s} s")
    rank, local_rank, world_size = torchrun_env()
    if placement is None:
        placement = placement_here()
    backend = placement.backend
    if placement.device_type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if world_size > 1 or "RANK" in os.environ:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29500")
        try:
            connect(backend, rank, world_size, timeout_s, **({"device_id": device} if backend == "nccl" else {}))
        except ConnectTimeout as exc:
            line = f"[rank {rank}] error: {exc}"
            cli.say_on_stderr(line)
            cli.tell_torchrun(line)
            raise SystemExit(1) from None
        _note_peers(rank, world_size)
    else:  # plain python: a world of one over a private store, so collectives still work
        # a FileStore (a file in the temporary folder, removed with the group): it exists on every
        # platform, where torch's in-memory store is not built on Windows
        global _OWN_STORE
        path = Path(tempfile.gettempdir()) / f"minigpt-store-{os.getpid()}-{uuid.uuid4().hex}"
        store = dist.FileStore(str(path), 1)
        _OWN_STORE = path
        _start_group(backend, store=store, rank=0, world_size=1, timeout=datetime.timedelta(seconds=timeout_s))
    ctx = DistContext(rank, local_rank, world_size, backend, device, timeout_s)
    global _CTX
    _CTX = ctx
    if world_size > 1:
        signal.signal(signal.SIGTERM, _stopped_by_launcher)
    return ctx


START_UP_S = 120.0  # how long a rank waits for the others to join the group (see start_up_timeout)
START_UP_VARIABLE = "MINIGPT_START_UP_TIMEOUT"  # seconds: overrides the start-up timeout (a test sets it short)


class ConnectTimeout(RuntimeError):
    """The process group could not start: a rank did not join within the start-up timeout."""


def start_up_timeout(timeout_s: float) -> float:
    """Seconds a rank waits for every other rank to join the process group: its own, longer timeout
    than the collectives', since a rank starts only once it has imported torch and built what it
    needs, and on a busy laptop that alone can take a minute. ``START_UP_S`` (or the collective
    timeout, if longer) times ``MINIGPT_TIME_SCALE``; ``MINIGPT_START_UP_TIMEOUT`` sets it outright."""
    if os.environ.get(START_UP_VARIABLE):
        return cli.positive_from_env(START_UP_VARIABLE, START_UP_S, "120 (seconds)")
    return max(START_UP_S, timeout_s) * cli.time_scale()


def connect(backend: str, rank: int, world_size: int, timeout_s: float, **kwargs) -> None:
    """``dist.init_process_group`` with the start-up timeout (:func:`start_up_timeout`), then the
    collective timeout ``timeout_s`` for everything the group does afterwards. A rank that does not
    join in time ends in :class:`ConnectTimeout`, whose message says so: a busy machine, not a rank
    that skipped a collective (the test workers call this too)."""
    start_up = start_up_timeout(timeout_s)
    try:
        _start_group(backend, rank, world_size=world_size, timeout=datetime.timedelta(seconds=start_up), **kwargs)
    except (RuntimeError, ValueError) as exc:
        text = " ".join(str(exc).split())
        if not re.search(r"timed? ?out|timeout", text, re.IGNORECASE):
            raise
        joined = re.search(r"(\d+)/(\d+) clients joined", text)
        who = f" ({joined.group(1)} of {joined.group(2)} joined)" if joined else ""
        raise ConnectTimeout(
            f"could not connect to {'the other rank' if world_size == 2 else f'the other {world_size - 1} ranks'} within "
            f"{start_up:g} s{who}: the machine may be busy; raise --timeout or {cli.TIME_SCALE_VARIABLE} "
            f"(e.g. {cli.TIME_SCALE_VARIABLE}=3). gloo said: {text[:160]}"
        ) from None
    dist.distributed_c10d._set_pg_timeout(datetime.timedelta(seconds=timeout_s))


def ready(ctx: DistContext) -> None:
    """The end of start-up: every rank has built what it trains (model, optimizer, batches) and meets
    the others once more under the start-up timeout (:func:`start_up_timeout`) before its first step;
    the collective timeout ``ctx.timeout_s`` bounds everything after. On a busy machine one rank can
    finish building seconds after the others (the optimizer's first import alone is 1.4 s of CPU):
    a slow start, not a frozen peer, which a short ``--timeout`` must not take for one."""
    if ctx.world_size <= 1 or not dist.is_initialized():
        return
    dist.distributed_c10d._set_pg_timeout(datetime.timedelta(seconds=start_up_timeout(ctx.timeout_s)))
    try:
        dist.barrier()
    finally:
        dist.distributed_c10d._set_pg_timeout(datetime.timedelta(seconds=ctx.timeout_s))


def _start_group(backend: str, rank: int, **kwargs) -> None:
    """``dist.init_process_group``, or one line naming the fix when gloo cannot start on a laptop whose
    name does not resolve to an address of its own (a Mac on a network whose DNS does not know it, often).

    gloo binds each rank to the address of this machine's name (``socket.gethostname()``) unless
    ``GLOO_SOCKET_IFNAME`` names a network interface; for ranks on one machine the loopback interface
    is enough: ``lo0`` on macOS, ``lo`` on Linux. Any other failure (a store or a peer that does not
    answer in time) is raised as it came."""
    try:
        dist.init_process_group(backend, rank=rank, **kwargs)
    except (RuntimeError, ValueError) as exc:  # gloo's errors are RuntimeErrors (DistError among them)
        hint = gloo_address_hint(backend, exc)
        if hint is None:
            raise
        line = f"[rank {rank}] error: {hint}"
        cli.say_on_stderr(line)
        cli.tell_torchrun(line)
        raise SystemExit(1) from None


def gloo_address_hint(backend: str, exc: BaseException) -> str | None:
    """The line :func:`_start_group` prints when gloo could not start because of this machine's
    address (None for any other failure): gloo's own words for a failed address lookup, or a name
    that does not resolve here, with ``GLOO_SOCKET_IFNAME`` not set."""
    text = " ".join(str(exc).split())
    if backend != "gloo" or os.environ.get("GLOO_SOCKET_IFNAME") or "timed out" in text.lower():
        return None
    host = socket.gethostname()
    try:
        socket.getaddrinfo(host, None)
        resolves = True
    except OSError:
        resolves = False
    lookup_failed = re.search(r"Unable to find address|getaddrinfo|nodename nor servname", text, re.IGNORECASE)
    if resolves and not lookup_failed:
        return None
    why = f"this machine's name {host!r} does not resolve to an address" if not resolves else "gloo found no address"
    return (
        f"the gloo process group could not start ({type(exc).__name__}: {text[:160]}): {why}; "
        "set GLOO_SOCKET_IFNAME=lo0 (macOS; lo on Linux) to run every rank over loopback, and run again"
    )


def _note_peers(rank: int, world_size: int) -> None:
    """Every rank learns every rank's (host, pid): one small all-gather at start-up."""
    global _PEERS
    peers: list = [None] * world_size
    dist.all_gather_object(peers, (socket.gethostname(), os.getpid()))
    _PEERS = [tuple(p) for p in peers]


def _process_state(pid: int) -> str:
    """``"gone"``, ``"zombie"`` (exited, not yet collected by its launcher), ``"stopped"`` (SIGSTOP)
    or ``"running"``, from /proc (Linux); ``"running"`` where /proc cannot tell."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return "gone"
    except OSError:
        return "running"
    state = stat.rsplit(")", 1)[-1].split()[0]
    return {"Z": "zombie", "X": "gone", "T": "stopped", "t": "stopped"}.get(state, "running")


def peers_answering(ctx: DistContext, wait_s: float) -> set[int] | None:
    """The ranks that say "alive" through the rendezvous store within ``wait_s`` seconds (each
    survivor of a failed collective calls this, so the survivors find each other), or None when
    the store cannot be reached. Used for peers on other machines, whose processes we cannot see."""
    try:
        store = dist.TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            is_master=False,
            timeout=datetime.timedelta(seconds=max(wait_s, 1.0)),
        )
        prefix = f"minigpt/alive/{os.environ.get('TORCHELASTIC_RUN_ID', 'run')}/"
        store.set(f"{prefix}{ctx.rank}", "1")
        deadline = time.monotonic() + wait_s
        alive = {ctx.rank}
        while time.monotonic() < deadline and len(alive) < ctx.world_size:
            alive |= {r for r in range(ctx.world_size) if r not in alive and store.check([f"{prefix}{r}"])}
            time.sleep(0.1)
        return alive
    except (KeyError, ValueError, RuntimeError, dist.DistError):
        return None


def _local_failures(ctx: DistContext, here: str) -> dict[int, str]:
    failed = {}
    for rank, (host, pid) in enumerate(_PEERS):
        if rank == ctx.rank or host != here:
            continue
        state = _process_state(pid)
        if state in ("gone", "zombie"):
            failed[rank] = "died"
        elif state == "stopped":
            failed[rank] = "is frozen (its process is stopped)"
    return failed


def failed_peers(ctx: DistContext, ask_store_s: float = 0.0, settle_s: float = 0.0) -> dict[int, str]:
    """The peers that failed, as ``{rank: "died" | "is frozen" | "stopped answering"}``: the
    processes on this machine are looked at directly; with ``ask_store_s`` > 0 the peers on other
    machines that do not say "alive" through the store within that time are added too.

    A killed process closes its sockets before the kernel marks it a zombie, so a survivor can see
    the connection reset while /proc still says the peer runs: with ``settle_s`` > 0 the processes
    on this machine are looked at again for up to that long, until one of them shows its end."""
    here = socket.gethostname()
    failed = _local_failures(ctx, here)
    deadline = time.monotonic() + settle_s
    local = any(host == here for rank, (host, _) in enumerate(_PEERS) if rank != ctx.rank)
    while local and not failed and time.monotonic() < deadline:
        time.sleep(0.05)
        failed = _local_failures(ctx, here)
    remote = [r for r, (host, _) in enumerate(_PEERS) if host != here]
    if remote and ask_store_s > 0:
        alive = peers_answering(ctx, ask_store_s)
        if alive is not None:
            failed.update({r: "stopped answering" for r in remote if r not in alive})
    return failed


def _describe(failed: dict[int, str]) -> str:
    return ", ".join(f"rank {r} {why}" for r, why in sorted(failed.items()))


def _stopped_by_launcher(signum, frame) -> None:
    """SIGTERM from torchrun: another rank failed and torchrun is stopping the rest. Say so in one
    line (unless this rank already said why it stops) and exit at once."""
    if not _REPORTED and _CTX is not None:
        failed = failed_peers(_CTX)
        first = f"{_describe(failed)} first" if failed else "another rank failed first (torchrun's report names it)"
        cli.say_on_stderr(f"[rank {_CTX.rank}] stopped by torchrun: {first}")
    sys.stdout.flush()
    os._exit(128 + signum)


def log(ctx: DistContext | None, message: str, all_ranks: bool = False) -> None:
    """Print ``[rank r] message`` (only rank 0 unless ``all_ranks``)."""
    rank = 0 if ctx is None else ctx.rank
    if all_ranks or rank == 0:
        sys.stdout.write(f"[rank {rank}] {message}\n")  # one write, as cli.say_on_stderr: no glued lines
        sys.stdout.flush()


def fail(ctx: DistContext | None, message: str, code: int = 1) -> None:
    """End this rank with ``[rank r] error: message`` on stderr and exit code ``code``.

    The process group is not torn down politely (a peer may be gone, and a polite tear-down
    would wait for it); the process exits at once and its peers see the connection close.
    """
    global _REPORTED
    rank = "?" if ctx is None else ctx.rank
    line = f"[rank {rank}] error: {message}"
    _REPORTED = True
    cli.say_on_stderr(line)
    sys.stdout.flush()
    cli.tell_torchrun(line)
    _exit(code)


def fail_collective(ctx: DistContext | None, exc: BaseException, timeout_s: float) -> None:
    """End this rank after a collective failed, in one line that names the rank that failed (when
    it can be told) and the error, so that every surviving rank stops with a message, never a hang.

    If the failed peer is a process on this machine that died, torchrun will notice it within a
    fraction of a second and stop this rank too: this rank waits for that (at most
    :data:`STOP_GRACE_S`) rather than exit with an error of its own, so that torchrun's report blames
    the rank that really failed."""
    global _REPORTED
    line, failed = collective_failure_line(ctx, exc, timeout_s)
    _REPORTED = True
    cli.say_on_stderr(line)
    sys.stdout.flush()
    if ctx is not None and "TORCHELASTIC_RUN_ID" in os.environ:
        # the ranks this rank's own torchrun started (torchrun numbers each machine's ranks in a row)
        first = ctx.rank - ctx.local_rank
        same_launcher = range(first, first + int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
        if any(why == "died" and r in same_launcher for r, why in failed.items()):
            # No error file yet: torchrun's report blames the failure with the smallest timestamp,
            # in whole seconds, and an error file written now could be a second older than the
            # time torchrun notes for the dead rank (it has none of its own): rank 0 would be blamed.
            time.sleep(STOP_GRACE_S)  # torchrun's SIGTERM normally ends this rank long before
    cli.tell_torchrun(line)
    _exit(1)


def _exit(code: int) -> None:
    """``os._exit(code)``, after removing a world of one's store file, which only the store's
    destructor removes otherwise (and ``os._exit`` runs none)."""
    if _OWN_STORE is not None:
        _OWN_STORE.unlink(missing_ok=True)
    os._exit(code)


def collective_failure_line(
    ctx: DistContext | None, exc: BaseException, timeout_s: float
) -> tuple[str, dict[int, str]]:
    """The one line :func:`fail_collective` prints for a failed collective, and the failed peers
    it found (``{rank: why}``, empty when none can be told: a peer alive but not answering)."""
    text = re.sub(r"\[[^\]]*\.(?:cc|cpp|h):\d+\] ", "", " ".join(str(exc).split()))  # gloo's source location
    error = f"{type(exc).__name__}: {text[:160]}" if text else type(exc).__name__
    failed = failed_peers(ctx, ask_store_s=2.0, settle_s=1.0) if ctx is not None else {}
    rank = "?" if ctx is None else ctx.rank
    if failed:
        line = f"[rank {rank}] error: {_describe(failed)}; a collective failed ({error}); rank {rank} stops too"
    else:
        line = (
            f"[rank {rank}] error: a collective failed ({error}); a peer rank probably died or stopped "
            f"answering (collective timeout {timeout_s:g} s); rank {rank} stops too"
        )
    return line, failed


def run(ctx: DistContext, prog: str, work: Callable[[], T]) -> T:
    """This rank's part of a lab: ``work()``'s result, or an end in one line when it cannot finish.

    Every runner calls it right after :func:`init`, so that every lab ends a failed run the same
    way: a stub of the learner's not written yet (``NotImplementedError``: the exercise it names),
    a training that diverged (:mod:`minigpt.divergence`: the step, the value, the setting to look
    at; ``SystemExit`` with status 1 after a clean tear-down), a value error of this rank (its
    message), or a failed collective (:func:`fail_collective`: the rank that failed first)."""
    try:
        return work()
    except divergence.Diverged as exc:  # every rank sees the same values: all stop at the same step
        code = divergence.stop(prog, exc)
        teardown()
        raise SystemExit(code) from None
    except NotImplementedError as exc:  # before RuntimeError, which it is a kind of
        fail(ctx, f"{exc} (your code in lab/exercises/ is not written yet)")
    except ValueError as exc:
        fail(ctx, f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}")
    except (RuntimeError, dist.DistError) as exc:
        fail_collective(ctx, exc, ctx.timeout_s)


def write_report(path: str | Path, report: dict, indent: int = 2) -> None:
    """Write a run's JSON report atomically (a temporary file, then a rename): an interrupted run
    leaves the previous report or none, never half of one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(report, indent=indent) + "\n")
    os.replace(tmp, path)


def teardown() -> None:
    """Leave the process group. Garbage is collected first: wrapped modules (FSDP's hooks make
    reference cycles) can keep gloo work objects and their tensors alive, and if those are
    destroyed only during interpreter shutdown, gloo's threads abort the process ("terminate
    called without an active exception": Lab 03's practice script lost rank 1 so in 2 of 12 runs
    without this collection, in 0 of 30 with it)."""
    if dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()
