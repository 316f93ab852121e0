"""lab/01_ddp.py as a learner runs it: torchrun's multi-node launch (two launches on one machine),
a rank killed mid-training, bad input, and the learner's implementation switch."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from minigpt.parallel import proof
from minigpt.runners import lab01_ddp
from tests.launcher import ROOT, free_port
from tests.limits import limit
from tests.test_profiler import check_trace

TINY = ["--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--warmup", "1", "--quiet"]


def torchrun_node(node_rank: int, port: int, args: list[str], rendezvous: str = "static", **popen) -> subprocess.Popen:
    """One "machine" of a two-machine run, one process each: torchrun --nnodes=2 with the static
    rendezvous (--node_rank, --master_addr/--master_port) or the c10d one (--rdzv-backend=c10d,
    --rdzv-endpoint, --rdzv-id: torchrun numbers the machines itself)."""
    if rendezvous == "static":
        launch = [f"--node_rank={node_rank}", "--master_addr=127.0.0.1", f"--master_port={port}"]
    else:
        launch = ["--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id=lab01-{port}"]
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1", *launch]
    return start(command + ["lab/01_ddp.py", *args], **popen)


def one_torchrun(args: list[str], **popen) -> subprocess.Popen:
    """The way every learner runs the lab: one torchrun --standalone --nproc_per_node=2."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    return start(command + ["lab/01_ddp.py", *args], **popen)


def start(command: list[str], **popen) -> subprocess.Popen:
    from tests import launcher

    # the lane's environment on the second lane; a rank that aborts shows its Python stacks (faulthandler)
    env = {**launcher.environ(), "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "PYTHONFAULTHANDLER": "1"}
    return subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen
    )


@pytest.mark.timeout(180)
@pytest.mark.parametrize("rendezvous", ["static", "c10d"])
def test_two_node_launch_checks_and_reports(rendezvous, tmp_path):
    report, traces = tmp_path / "lab01.json", tmp_path / "traces"
    port = free_port()
    common = ["--check", "--steps", "6", "--accum", "2", *TINY]  # --accum: all but the last micro-batch in no_sync
    common += ["--bucket-cap-mb", "0.02", "--trace", str(traces)]  # a few buckets; the profiler's trace
    nodes = [
        torchrun_node(0, port, [*common, "--report", str(report)], rendezvous),
        torchrun_node(1, port, [*common, "--report", str(tmp_path / "other.json")], rendezvous),
    ]
    outputs = [n.communicate(timeout=limit(150)) for n in nodes]
    for node, (out, err) in zip(nodes, outputs):
        # with its output: a rank that aborted after its check (once in a warm run of da93f2f, rank 0 under
        # c10d: "terminate called without an active exception") shows how far it got, and, under
        # PYTHONFAULTHANDLER (``start``), every Python thread's stack at the abort
        assert node.returncode == 0, f"stdout:\n{out[-1500:]}\nstderr:\n{err[-6000:]}"
    out0 = outputs[0][0]
    if rendezvous == "c10d":  # torchrun picks which launch holds rank 0
        report = report if report.exists() else tmp_path / "other.json"
        out0 = out0 if "check PASS" in out0 else outputs[1][0]
    assert "check PASS" in out0 and "world size 2" in out0, out0
    assert [report.exists(), (tmp_path / "other.json").exists()].count(True) == 1, "only rank 0 writes the report"
    data = json.loads(report.read_text())
    for key in ("max_logit_drift", "ranks_bit_identical", "tutor_accuracy", "world_size", "steps", *proof.REPORT_KEYS):
        assert key in data, key
    assert data["world_size"] == 2 and data["steps"] == 6 and data["ranks_bit_identical"] is True
    assert 0 < data["max_logit_drift"] <= 1e-5
    assert set(data["variants"]) == {"bucketed", "torch-ddp"}  # --full adds the ring
    assert data["variants_bit_identical_to_each_other"] is True  # 2 ranks: a+b whichever way it is reduced
    assert data["same_as_pytorch"] and data["pytorch_max_diff"] == 0.0 and data["fp64_max_step_drift"] <= 1e-12
    assert len(data["last_step_timeline"]) == len(data["buckets"]) >= 1
    assert data["synchronised_backward_passes"] == 6, "with --accum 2, only the last micro-batch synchronises"
    # the profiler's trace: one gzipped Chrome trace per rank, written by each machine's rank; in each traced
    # step one all-reduce per bucket on gloo's thread, the first ones started while backward still ran
    assert sorted(p.name for p in traces.iterdir()) == ["lab01-rank0.json.gz", "lab01-rank1.json.gz"]
    buckets = len(data["buckets"])
    assert buckets >= 3, data["buckets"]
    started_under_backward = 0
    for rank in (0, 1):
        steps = check_trace(traces / f"lab01-rank{rank}.json.gz", 2, "bucketed")["bucketed"]
        assert [s["step"] for s in steps] == [3, 4, 5], steps
        for step in steps:  # --accum 2: the step's bar holds both micro-batches, and the last one's all-reduces
            assert [c["name"] for c in step["collectives"]] == ["gloo:all_reduce"] * buckets, step
            ulp = 1e-9  # the times are differences of microsecond timestamps, divided by 1000
            assert all(0 <= c["under_backward_ms"] <= c["end_ms"] - c["start_ms"] + ulp for c in step["collectives"])
            assert 0 <= step["hidden_ms"] <= step["collective_ms"] + ulp, step
            started_under_backward += sum(c["start_ms"] < step["backward_ms"][1] for c in step["collectives"])
    assert started_under_backward > 0, "no bucket's all-reduce started before backward ended, in 6 traced steps"


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (read from /proc: no psutil, no procps needed)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == pid:
                found.append(int(entry))
    return found


def worker_of_rank(launcher_pid: int, rank: int) -> int:
    """The process of ``rank`` among a torchrun's workers, by the ``RANK`` torchrun gave it (not by
    process id: the ids wrap around at ``pid_max``, 32,768 on many machines, and a suite's threads
    use them up)."""
    for pid in children(launcher_pid):
        with open(f"/proc/{pid}/environ", "rb") as f:
            if f"RANK={rank}".encode() in f.read().split(b"\0"):
                return pid
    raise AssertionError(f"no worker of rank {rank} under torchrun {launcher_pid}: {children(launcher_pid)}")


def ended(pid: int) -> bool:
    """The process has exited: gone from /proc, or a zombie its parent has not collected yet."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.timeout(180)
@pytest.mark.parametrize("launcher", ["one torchrun", "two torchruns"])
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "frozen"])
def test_a_failed_rank_is_named_under_every_launcher(how, launcher):
    """Rank 1's process is killed (its sockets close) or frozen (only the timeout can tell) in the
    middle of training, under one torchrun of two processes (how a learner runs the lab) or under
    two torchruns of one process each (two machines). Rank 0 must stop within 60 s with one line of
    ours that names rank 1 and what happened to it, and torchrun's own report must not blame rank 0
    for a rank 1 that died: its "Root Cause" is rank 1, or, for a frozen rank 1 that torchrun cannot
    see, rank 0's line naming rank 1. --timeout 5 bounds the wait for a frozen peer (the start-up
    has its own, longer timeout: a loaded machine's slow start is not a frozen peer)."""
    port = free_port()
    timeout_s = f"{limit(5):g}"  # a collective of this tiny model takes milliseconds; a frozen peer, forever
    args = ["--steps", "100000", "--timeout", timeout_s, *TINY[:-1]]  # progress bar on: we watch it
    if launcher == "one torchrun":
        nodes = [one_torchrun(args)]
    else:
        nodes = [torchrun_node(0, port, args), torchrun_node(1, port, args)]
    watched, printed, seen = nodes[0], [], []  # rank 0's progress bar (stdout) and errors (stderr)
    threading.Thread(target=lambda: printed.extend(iter(lambda: watched.stdout.read(64), "")), daemon=True).start()
    threading.Thread(target=lambda: seen.extend(iter(lambda: watched.stderr.read(64), "")), daemon=True).start()
    try:
        deadline = time.monotonic() + limit(120)
        while "loss=" not in "".join(printed) and time.monotonic() < deadline and watched.poll() is None:
            time.sleep(0.5)
        assert "loss=" in "".join(printed), f"training never started: {''.join(seen)[-2000:]}"
        worker, rank0 = worker_of_rank(nodes[-1].pid, 1), worker_of_rank(nodes[0].pid, 0)
        os.kill(worker, how)
        failed_at = time.monotonic()
        while watched.poll() is None and time.monotonic() - failed_at < limit(60):
            # torchrun would wait 30 s for a frozen worker: kill it, but only once rank 0 has ended
            # (its line printed, its error file written), or torchrun could see rank 1 end first
            # and blame it
            if how == signal.SIGSTOP and "[rank 0] error:" in "".join(seen) and ended(rank0):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(worker, signal.SIGKILL)
            time.sleep(0.2)
        seconds = time.monotonic() - failed_at
        watched.wait(timeout=limit(60))
    finally:
        for node in nodes:
            for pid in children(node.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            node.kill()
    time.sleep(0.5)  # the reader thread takes the rest of stderr
    err = "".join(seen)
    ours = [line for line in err.splitlines() if line.startswith("[rank 0]")]
    root_cause = err[err.index("Root Cause") :] if "Root Cause" in err else ""
    assert watched.returncode == 1, f"torchrun exited {watched.returncode}: {err[-3000:]}"
    assert seconds < limit(60), f"rank 0 took {seconds:.0f} s to stop (limit {limit(60):g} s)"
    assert len(ours) == 1, err[-3000:]
    what = "died" if how == signal.SIGKILL else "is frozen (its process is stopped)"
    if how == signal.SIGKILL and launcher == "one torchrun":
        # whichever comes first: torchrun's stop (it checks its workers every 0.1 s) or rank 0's
        # failed collective; either way rank 0 waits for torchrun, whose report blames rank 1
        assert ours[0] == "[rank 0] stopped by torchrun: rank 1 died first" or ours[0].startswith(
            "[rank 0] error: rank 1 died; a collective failed ("
        ), err[-3000:]
        assert "rank      : 1 (local_rank: 1)" in root_cause and "SIGKILL" in root_cause, root_cause
    else:
        assert ours[0].startswith(f"[rank 0] error: rank 1 {what}; a collective failed ("), ours[0]
        assert ours[0].endswith("rank 0 stops too"), ours[0]
        assert f"traceback : {ours[0]}" in root_cause, root_cause


@pytest.mark.parametrize(
    "args, env, message",
    [
        (["--bucket-cap-mb", "-1"], {}, "--bucket-cap-mb -1: negative; give a positive number of MiB"),
        (["--timeout", "0"], {}, "--timeout 0: zero; give a positive number of seconds"),
        (
            ["--batch-size", "63"],
            {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2"},
            "--batch-size 63 is not divisible by the world size 2; use a multiple of 2",
        ),
        (["--steps", "0"], {}, "--steps 0: zero; give a positive integer"),
        (["--report", str(ROOT / "README.md" / "r.json")], {}, "README.md is a file, not a folder"),
        ([], {"RANK": "0"}, "RANK set but LOCAL_RANK, WORLD_SIZE missing"),
    ],
)
def test_bad_input_exits_2_with_a_message(args, env, message, monkeypatch, capsys):
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    try:
        code = lab01_ddp.main(args)  # our checks after parsing return 2 ...
    except SystemExit as exit_info:  # ... a value its type= refused exits with it
        code = exit_info.code
    assert code == 2
    assert message in capsys.readouterr().err


@pytest.mark.timeout(120)
def test_the_learners_stubs_stop_the_lab_with_the_exercise_message():
    proc = subprocess.run(
        [sys.executable, "lab/01_ddp.py", "--impl", "exercises", "--steps", "2", *TINY],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=limit(100),
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 1
    assert "[rank 0] error: Exercise 1.2" in proc.stderr and "not written yet" in proc.stderr, proc.stderr[-2000:]


def test_a_rank_that_starts_too_late_is_a_busy_machine_not_a_skipped_collective(monkeypatch):
    """The process group's start-up has its own, longer timeout than the collectives
    (minigpt.parallel.launch.start_up_timeout). Past it, the rank that waited says it could not connect,
    how long it waited and what to raise, in one line; never that a peer skipped a collective."""
    from tests.launcher import start_ranks

    monkeypatch.setenv("MINIGPT_LATE_RANK", "1:7")
    monkeypatch.setenv("MINIGPT_START_UP_TIMEOUT", "3")
    done = start_ranks(["lab/01_ddp.py", "--steps", "2", *TINY], 2, limit(60))
    assert done[0].returncode == 1, done[0].stderr[-2000:]
    lines = [line for line in done[0].stderr.splitlines() if line.startswith("[rank 0] error:")]
    assert len(lines) == 1, done[0].stderr[-2000:]
    assert "could not connect to the other rank within 3 s" in lines[0], lines[0]
    assert "the machine may be busy; raise --timeout or MINIGPT_TIME_SCALE" in lines[0], lines[0]
    assert "collective" not in lines[0], lines[0]


SLOW_BUILD = """
import sys, time
import torch, torch.distributed as dist
from minigpt.parallel import launch

ctx = launch.init(timeout_s=2.0)
if ctx.rank == 1:
    time.sleep(5.0)  # building its model and optimizer on a busy machine: 5 s after rank 0
if sys.argv[1] == "ready":
    launch.ready(ctx)
t = torch.ones(3)
try:
    dist.all_reduce(t)
    print("sum", t.tolist(), flush=True)
except RuntimeError as exc:
    print("failed", " ".join(str(exc).split())[:120], flush=True)
launch.teardown()
"""


def test_a_rank_slow_to_build_is_a_slow_start_not_a_frozen_peer(tmp_path):
    """launch.ready (lab/01_ddp.py calls it once its models and optimizers are built): the ranks meet
    under the start-up timeout, then the collective timeout (2 s here) bounds each collective. Rank 1
    builds 5 s after rank 0: with ready the first all-reduce succeeds; without it, rank 0's first
    collective waits 2 s and fails, which is what a busy machine did to a 5 s --timeout."""
    from tests import launcher

    script = tmp_path / "slow_build.py"
    script.write_text(SLOW_BUILD)
    with_ready = launcher.start_ranks([str(script), "ready"], 2, limit(120))
    without = launcher.start_ranks([str(script), "plain"], 2, limit(120))
    assert [p.stdout.strip() for p in with_ready] == ["sum [2.0, 2.0, 2.0]"] * 2, [p.stderr[-800:] for p in with_ready]
    assert without[0].stdout.startswith("failed"), (without[0].stdout, without[0].stderr[-800:])
