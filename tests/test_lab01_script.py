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

from minigpt.runners import lab01_ddp
from tests.launcher import ROOT, free_port
from tests.limits import limit

TINY = ["--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--warmup", "1", "--quiet"]


def torchrun_node(node_rank: int, port: int, args: list[str], **popen) -> subprocess.Popen:
    """One "machine" of a two-machine run: torchrun --nnodes=2 --node_rank=N, one process each."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        f"--node_rank={node_rank}",
        "--nproc_per_node=1",
        "--master_addr=127.0.0.1",
        f"--master_port={port}",
        "lab/01_ddp.py",
        *args,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen
    )


@pytest.mark.timeout(180)
def test_two_node_launch_checks_and_reports(tmp_path):
    report = tmp_path / "lab01.json"
    port = free_port()
    common = ["--check", "--steps", "6", "--accum", "2", *TINY]  # --accum: all but the last micro-batch in no_sync
    nodes = [
        torchrun_node(0, port, [*common, "--report", str(report)]),
        torchrun_node(1, port, [*common, "--report", str(tmp_path / "other.json")]),
    ]
    outputs = [n.communicate(timeout=limit(150)) for n in nodes]
    for node, (_, err) in zip(nodes, outputs):
        assert node.returncode == 0, err[-3000:]
    out0 = outputs[0][0]
    assert "check PASS" in out0 and "world size 2" in out0, out0
    assert not (tmp_path / "other.json").exists(), "only rank 0 writes the report"
    data = json.loads(report.read_text())
    for key in ("max_logit_drift", "ranks_bit_identical", "tutor_accuracy", "world_size", "steps"):
        assert key in data, key
    assert data["world_size"] == 2 and data["steps"] == 6 and data["ranks_bit_identical"] is True
    assert 0 < data["max_logit_drift"] <= 1e-5
    assert set(data["variants"]) == {"bucketed", "ring", "torch-ddp"}
    assert data["variants_bit_identical_to_each_other"] is True  # 2 ranks: a+b whichever way it is reduced
    assert len(data["last_step_timeline"]) == len(data["buckets"]) >= 1
    assert data["synchronised_backward_passes"] == 6, "with --accum 2, only the last micro-batch synchronises"


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


@pytest.mark.timeout(180)
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "frozen"])
def test_a_failed_rank_ends_the_others_with_a_message(how):
    """Rank 1's process is killed (its sockets close) or frozen (only the timeout can tell) in the
    middle of training; rank 0 must stop within 60 s with our message: its rank, that a collective
    failed, and the likely cause with the timeout (--timeout 10 bounds the wait for a frozen peer).
    What gloo itself says about the failure is printed too, but its wording is gloo's: not tested."""
    port = free_port()
    args = ["--steps", "100000", "--timeout", "10", *TINY[:-1]]  # progress bar on: we watch it
    node0, node1 = torchrun_node(0, port, args), torchrun_node(1, port, args)
    seen: list[str] = []
    threading.Thread(target=lambda: seen.extend(iter(lambda: node0.stdout.read(64), "")), daemon=True).start()
    try:
        deadline = time.monotonic() + limit(120)
        while "loss=" not in "".join(seen) and time.monotonic() < deadline and node0.poll() is None:
            time.sleep(0.5)
        assert "loss=" in "".join(seen), f"training never started: {''.join(seen)[-2000:]}"
        (worker,) = children(node1.pid)  # torchrun's one worker process on "machine" 1
        os.kill(worker, how)
        failed_at = time.monotonic()
        node0.wait(timeout=limit(90))
        seconds = time.monotonic() - failed_at
    finally:
        for node in (node0, node1):
            for pid in children(node.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            node.kill()
    err = node0.stderr.read()
    assert node0.returncode == 1, f"torchrun on node 0 exited {node0.returncode}"
    assert seconds < limit(60), f"rank 0 took {seconds:.0f} s to notice (limit {limit(60):g} s)"
    assert "[rank 0] error:" in err, err[-3000:]
    assert "a peer rank probably died or stopped answering (collective timeout 10 s)" in err, err[-3000:]


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


@pytest.mark.timeout(120)
def test_bad_input_under_torchrun_ends_with_our_line():
    """Under one torchrun of two ranks, every rank refuses with its rank, and torchrun's failure
    report (its traceback, then a box) ends with our line as the root cause, not with its empty
    'To enable traceback see: ...'."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            "lab/01_ddp.py",
            "--batch-size",
            "63",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=limit(100),
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)},
    )
    ours = "lab/01_ddp.py: error: --batch-size 63 is not divisible by the world size 2; use a multiple of 2"
    assert proc.returncode != 0
    assert f"] {ours}" in proc.stderr and "[rank " in proc.stderr, proc.stderr[-3000:]
    lines = [line.strip() for line in proc.stderr.splitlines() if line.strip().strip("=")]
    assert lines[-1].startswith("traceback : [rank ") and lines[-1].endswith(ours), lines[-12:]
    assert "Root Cause" in "\n".join(lines[-10:])
