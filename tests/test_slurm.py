"""The Slurm recipes of lab/slurm/: the one the README shows is the one that runs.

* Lab 01's recipe is submitted with ``sbatch --wait`` to a Slurm cluster of two nodes on this machine (Debian's
  Slurm 22.05: munged, slurmctld and two slurmd, n1 and n2, started here with a configuration of their own and
  stopped by their PIDs): it exits 0, says ``check PASS`` for a world of 4, leaves a log per rank (2 nodes x 2
  ranks) and is ``COMPLETED`` in Slurm's job-completion file (``sacct -c``).
* A job a recipe cannot run (a task count that is not one per node, a world size the lab refuses) stops with
  exit status 2 and one line, before anything starts; a job it can run becomes one torchrun per node with the
  extra arguments appended (both with a faked Slurm environment and fake ``srun``/``scontrol``: no Slurm needed).
* Every recipe parses (``bash -n``); README.md and README.es.md show Lab 01's recipe exactly as the file is.
* ``make install``'s slurm step never fails the install: an ``apt-get`` that fails is one WARNING line and a
  note, which this module's skip reason (the score table's NOT RUN line) quotes.

Where Slurm is not installed (``make install`` installs it where apt and root allow), the cluster test is not
run, and says why. These tests check the course's own machinery and carry no points.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests import launcher
from tests.launcher import ROOT, free_port
from tests.limits import limit

RECIPES = sorted((ROOT / "lab" / "slurm").glob("*.sbatch"))
LAB01 = ROOT / "lab" / "slurm" / "01_ddp.sbatch"
READMES = [ROOT / "README.md", ROOT / "README.es.md"]
# what make install's slurm step looks for (make's SLURM_PROGRAMS), and its note saying why it could not install them
PROGRAMS = os.environ.get(
    "MINIGPT_SLURM_PROGRAMS", "/usr/bin/sbatch /usr/sbin/slurmctld /usr/sbin/slurmd /usr/sbin/munged"
).split()
SLURM_NOTE = Path(os.environ.get("MINIGPT_SLURM_NOTE", ROOT / ".venv" / "slurm-not-installed.txt"))
# Lab 01's check, short: a one-block model, 6 steps (PyTorch's DDP beside ours for all 6), 20 test sentences.
# On the two-core machine the job takes about 24 s, most of it six processes importing torch.
SHORT = ["--steps", "6", "--ddp-steps", "6", "--test-sentences", "20", "--n-layer", "1", "--n-embd", "32"]
SHORT += ["--n-head", "2", "--warmup", "1", "--quiet"]
# what the recipes read from the environment (lab/slurm/common.sh): a test sets them itself or leaves them unset
RECIPE_VARIABLES = ("VENV_BIN", "LOGS", "RANKS_PER_NODE", "HEAD_ADDR", "RDZV_PORT", "MINIGPT_DEVICE")


def without_slurm(env) -> dict[str, str]:
    """``env`` without a Slurm job's variables (the suite may itself run inside a job) and the recipes' own."""
    return {k: v for k, v in env.items() if not k.startswith("SLURM_") and k not in RECIPE_VARIABLES}


# --- the recipes, without Slurm ------------------------------------------------------------------------------


@pytest.mark.parametrize("path", [*RECIPES, ROOT / "lab" / "slurm" / "common.sh"], ids=lambda p: p.name)
def test_every_recipe_parses(path):
    assert len(RECIPES) == 4, [p.name for p in RECIPES]
    check = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, timeout=limit(10))
    assert check.returncode == 0, check.stderr


def fenced_blocks(text: str) -> list[str]:
    """The content of every fenced code block of a Markdown page (without its fences)."""
    return [m.group(1) for m in re.finditer(r"^```[^\n]*\n(.*?)^```$", text, flags=re.M | re.S)]


@pytest.mark.parametrize("readme", READMES, ids=lambda p: p.name)
def test_the_readme_shows_the_recipe_that_runs(readme):
    """The README's recipe is the file the cluster test submits, character for character."""
    assert LAB01.read_text(encoding="utf-8") in fenced_blocks(readme.read_text(encoding="utf-8")), (
        f"{readme.name} must show {LAB01.relative_to(ROOT)} as it is, in one code block of its own"
    )


@pytest.fixture
def fake_slurm(tmp_path) -> dict[str, str]:
    """A Slurm job's environment on two nodes, n1 and n2, without Slurm: ``scontrol show hostnames`` lists the
    nodes, ``srun`` runs its command here once, as node 0 (for the head's address, ``hostname -I``, which lists
    an IPv6 address first; for the launch, the node's torchrun), and torchrun is a script that prints its
    arguments. Each call of srun is one line of ``srun.calls``, so that a test can tell whether anything started."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "scontrol").write_text('#!/bin/sh\n[ "$1 $2" = "show hostnames" ] && printf "n1\\nn2\\n"\n')
    (fake / "srun").write_text(
        "#!/bin/bash\n"
        f"{{ printf srun; printf ' %s' \"$@\" | tr '\\n' ' '; echo; }} >> {tmp_path}/srun.calls\n"  # one line a call
        'while [ "${1#-}" != "$1" ]; do [ "$1" = -w ] && shift; shift; done\n'  # srun's own options
        'SLURM_NODEID=0 exec "$@"\n'
    )
    (fake / "torchrun").write_text('#!/bin/sh\necho "torchrun $*"\n')
    (fake / "hostname").write_text('#!/bin/sh\n[ "$1" = -I ] && echo "fd00::7 10.1.2.3 192.168.0.9"\n')
    for tool in fake.iterdir():
        tool.chmod(0o755)
    return {
        "PATH": f"{fake}{os.pathsep}{os.environ['PATH']}",
        "VENV_BIN": str(fake),
        "SLURM_SUBMIT_DIR": str(ROOT),
        "SLURM_JOB_ID": "7",
        "SLURM_JOB_NAME": "lab-job",
        "SLURM_JOB_NODELIST": "n[1-2]",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_NTASKS": "2",
    }


def run_recipe(name: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """A recipe run by bash, as the batch script Slurm would run, in a job described by ``env`` alone."""
    return subprocess.run(
        ["bash", str(ROOT / "lab" / "slurm" / name), *args],
        cwd=ROOT,
        env={**without_slurm(os.environ), **env},
        capture_output=True,
        text=True,
        timeout=limit(20),
    )


@pytest.mark.parametrize(
    "name, job, message",
    [
        (
            "01_ddp.sbatch",
            {"SLURM_NTASKS": "4"},
            "lab-job: error: 4 tasks on 2 nodes: the recipe starts one torchrun per node (which starts the node's "
            "ranks itself); submit with --ntasks-per-node=1",
        ),
        (
            "01_ddp.sbatch",
            {"SLURM_JOB_NUM_NODES": "3", "SLURM_NTASKS": "3", "RANKS_PER_NODE": "2"},
            "lab-job: error: 3 nodes x 2 per node = 6 ranks, which do not divide the global batch of 64 rows; use a "
            "world size that divides it: 2 4 8 16 ranks",
        ),
        (
            "06_mesh.sbatch",
            {"RANKS_PER_NODE": "3"},
            "lab-job: error: 2 nodes x 3 per node = 6 ranks; the lab needs 4: 2 nodes x 2 ranks, or 1 node x 4",
        ),
        (  # the node's GPUs set the ranks per node: 2 nodes of 2 GPUs are 4 ranks, not Lab 07's 8
            "07_nd_parallel.sbatch",
            {"SLURM_GPUS_ON_NODE": "2", "RANKS_PER_NODE": "4"},
            "lab-job: error: 2 nodes x 2 per node = 4 ranks; the lab needs 8: 2 nodes x 4 ranks, or 1 node x 8",
        ),
        ("03_fsdp_prefetch.sbatch", {"RANKS_PER_NODE": "many"}, "lab-job: error: many ranks per node on 2 nodes"),
    ],
    ids=["tasks", "01-world", "06-world", "07-gpus", "03-ranks"],
)
def test_a_job_the_recipe_cannot_run_is_refused_before_anything_starts(name, job, message, fake_slurm, tmp_path):
    done = run_recipe(name, {**fake_slurm, **job})
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == "" and len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith(message), done.stderr
    assert not (tmp_path / "srun.calls").exists(), "srun started before the job was refused"


@pytest.mark.parametrize("given", [{}, {"HEAD_ADDR": "192.0.2.1", "RDZV_PORT": "23456"}], ids=["found", "given"])
def test_a_job_becomes_one_torchrun_per_node_with_the_extra_arguments(given, fake_slurm, tmp_path):
    """n1 does not resolve here (nor on the test's cluster): the recipe asks the head node for its address,
    unless HEAD_ADDR gives it."""
    done = run_recipe("01_ddp.sbatch", {**fake_slurm, **given}, "--steps", "30")
    assert done.returncode == 0, done.stderr
    calls = (tmp_path / "srun.calls").read_text().splitlines()
    assert calls[-1].startswith("srun --kill-on-bad-exit=1 bash -c "), calls
    assert calls[:-1] == ([] if given else ["srun --nodes=1 --ntasks=1 -w n1 hostname -I"]), calls
    where = "192.0.2.1:23456" if given else "10.1.2.3:29507"  # the fake hostname -I's first IPv4 address
    assert done.stdout.splitlines() == [
        f"lab-job: 2 nodes (n[1-2]) x 2 ranks; rendezvous on n1 at {where}; each rank's log in out/slurm/7/",
        f"torchrun --nnodes=2 --nproc_per_node=2 --rdzv-backend=c10d --rdzv-endpoint={where} --rdzv-id=7 "
        "--rdzv-conf=is_host=1 --log-dir=out/slurm/7/node0 --tee=3 lab/01_ddp.py --check --device auto --steps 30",
    ]


# --- make install's slurm step ----------------------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_a_failing_apt_get_is_one_warning_and_the_slurm_test_says_why_it_did_not_run(tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "apt-get").write_text(  # as while another process holds Debian's package lock
        "#!/bin/sh\n"
        'echo "E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 4242 (apt-get)" >&2\n'
        "exit 100\n"
    )
    (fake / "id").write_text("#!/bin/sh\necho 0\n")
    for tool in fake.iterdir():
        tool.chmod(0o755)
    venv, missing = tmp_path / "venv", tmp_path / "missing" / "sbatch"
    proc = subprocess.run(
        ["make", "--no-print-directory", "slurm", f"SLURM_PROGRAMS={missing}", f"VENV={venv}"],
        cwd=ROOT,
        env={**os.environ, "PATH": f"{fake}{os.pathsep}{os.environ['PATH']}"},
        capture_output=True,
        text=True,
        timeout=limit(60),
    )
    assert proc.returncode == 0 and proc.stderr == "", proc.stdout + proc.stderr
    warnings = [line for line in proc.stdout.splitlines() if "WARNING" in line]
    assert len(warnings) == 1, proc.stdout
    assert warnings[0].startswith(
        "WARNING: Slurm is missing and apt-get failed (exit status 100: E: Could not get lock"
    )
    note = venv / "slurm-not-installed.txt"
    assert "Could not get lock" in note.read_text(encoding="utf-8")
    # the reason this module's cluster test is skipped with (conftest prints it as the NOT RUN line)
    reason = why_not_run([str(missing)], note, ci="")
    assert reason.startswith(f"Slurm is missing ({missing}), so Lab 01's recipe was not run on a cluster: make ")
    assert "make install could not install it, apt-get failed (exit status 100: E: Could not get lock" in reason


# --- a cluster of two nodes on this machine -------------------------------------------------------------------


def why_not_run(programs: list[str], note: Path, ci: str | None = None) -> str | None:
    """Why the cluster cannot be started here (None: it can). Under CI (``CI`` set), a missing Slurm is a failure:
    CI's machine installs it."""
    missing = [p for p in programs if not os.access(p, os.X_OK)]
    ci = os.environ.get("CI") if ci is None else ci
    if missing and ci:
        pytest.fail(f"{' '.join(missing)} missing: `make install` (run by `make test`) installs Debian's Slurm")
    if missing:
        why = note.read_text(encoding="utf-8").strip() if note.is_file() else ""
        return (
            f"Slurm is missing ({' '.join(missing)}), so Lab 01's recipe was not run on a cluster"
            + (f": make install could not install it, {why}" if why else "")
            + "; `make install` as root (or `sudo apt-get install slurmctld slurmd slurm-client munge`) installs it"
        )
    if os.geteuid() != 0:
        return "starting Slurm's daemons (and munged as the munge user) needs root, so Lab 01's recipe was not run"
    return None


@dataclass
class Cluster:
    folder: Path  # slurm.conf, the daemons' logs, state and spool
    env: dict[str, str]  # for Slurm's commands: SLURM_CONF names this cluster's configuration
    daemons: list[tuple[str, subprocess.Popen]] = field(default_factory=list)

    def command(self, *args: str, timeout: float = 20, **kwargs) -> subprocess.CompletedProcess:
        env = {**self.env, **kwargs.pop("env", {})}
        return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=limit(timeout), **kwargs)

    def logs(self) -> str:
        """The end of every daemon's log, for a failure message."""
        return "\n".join(f"--- {p.name}:\n{p.read_text(errors='replace')[-1500:]}" for p in self.folder.glob("*.log"))


def slurm_conf(folder: Path, munge_socket: Path, ports: list[int]) -> str:
    """Two nodes on this one host (Debian's build allows several slurmd per host: ``%n`` in their paths, a port
    each, ``slurmd -N``). No systemd and no cgroups here: processes are tracked through /proc (linuxproc) and not
    confined (task/none). With no accounting database, finished jobs go to a text file ``sacct -c`` reads."""
    host = socket.gethostname().split(".")[0]  # slurmctld checks that it runs on SlurmctldHost
    cpus = os.cpu_count() or 1
    return f"""\
ClusterName=minigpt
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ports[0]}
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool-%n
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd-%n.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc={folder}/jobcomp.txt
# a finished job's record is kept at least MinJobAge seconds (at least 2: slurmctld refuses 0, "MinJobAge must be
# at least 2", and keeps 2). sbatch --wait asks every 2 s unless 2 s is less than half of MinJobAge, then waits 8
# and 32 s between questions. At 4 it asks every 2 s and the record stays 4 s: a question finds the exit status,
# with 2 s to spare on a busy machine. At 2 a late question finds nothing; from 6 on, 8 s between questions
# outlast the record (the default, 300, adds about 14 s to a 28 s job): both give "Job 1 no longer found and
# exit code not found" and exit status 0
MinJobAge=4
NodeName=n1 NodeHostname=localhost Port={ports[1]} CPUs={cpus} State=UNKNOWN
NodeName=n2 NodeHostname=localhost Port={ports[2]} CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes=n[1-2] Default=YES MaxTime=INFINITE State=UP
"""


def start(cluster: Cluster, name: str, args: list[str], **popen) -> subprocess.Popen:
    """One daemon in the foreground (its PID is the daemon's: nothing forks away), its output in NAME.out."""
    with open(cluster.folder / f"{name}.out", "wb") as out:
        proc = subprocess.Popen(args, env=cluster.env, stdout=out, stderr=subprocess.STDOUT, **popen)
    cluster.daemons.append((name, proc))
    return proc


def wait_for(what: str, ready, cluster: Cluster, seconds: float) -> None:
    deadline = time.monotonic() + limit(seconds)
    while not ready():
        dead = [name for name, proc in cluster.daemons if proc.poll() is not None]
        if dead or time.monotonic() > deadline:
            outputs = "\n".join(
                f"--- {p.name}:\n{p.read_text(errors='replace')[-1500:]}" for p in cluster.folder.glob("*.out")
            )
            pytest.fail(f"{what}: {'exited: ' + ', '.join(dead) if dead else 'timed out'}\n{outputs}\n{cluster.logs()}")
        time.sleep(0.2)


def ours(conf: Path) -> list[int]:
    """The processes that run with this cluster's configuration: the daemons and everything a job started (slurmd
    passes its environment to slurmstepd, and sbatch the submitter's to the job's processes)."""
    found, marker = [], f"SLURM_CONF={conf}".encode()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                if marker in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                    found.append(int(entry))
            except OSError:
                continue
    return found


def stop(cluster: Cluster, conf: Path) -> list[str]:
    """Cancel the jobs still there (a test that failed may leave one running), stop every daemon by its PID, the
    last started first, and kill what still carries this cluster's configuration. Returns what had to be killed."""
    killed = []
    if any(name == "slurmctld" and proc.poll() is None for name, proc in cluster.daemons):
        cluster.command("scancel", f"--user={pwd.getpwuid(os.getuid()).pw_name}")
        deadline = time.monotonic() + limit(20)
        while time.monotonic() < deadline and cluster.command("squeue", "--noheader").stdout.strip():
            time.sleep(0.5)
    for name, proc in reversed(cluster.daemons):
        if proc.poll() is None:
            proc.terminate()
        try:
            proc.wait(timeout=limit(15))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            killed.append(f"{name} (pid {proc.pid}, did not stop on SIGTERM)")
    for pid in ours(conf):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            os.kill(pid, signal.SIGKILL)
        except OSError:
            continue
        killed.append(f"pid {pid}: {command[:200]}")
    return killed


@pytest.fixture(scope="module")
def slurm(tmp_path_factory) -> Iterator[Cluster]:
    """munged, slurmctld and two slurmd (n1, n2) on this machine, each on free ports and in folders of its own,
    until both nodes are idle; afterwards every daemon is stopped by its PID, also when a test failed."""
    reason = why_not_run(PROGRAMS, SLURM_NOTE)
    if reason:
        pytest.skip(reason)
    folder = tmp_path_factory.mktemp("slurm")
    conf = folder / "slurm.conf"
    cluster = Cluster(folder, {**without_slurm(launcher.environ()), "SLURM_CONF": str(conf)})
    # munged runs as the munge user, which cannot enter pytest's folders (root's, mode 0700): its own folder,
    # which others may enter (munged refuses a socket they cannot reach), holding a fresh key only munge reads
    user = pwd.getpwnam("munge")  # made by Debian's munge package
    munge = Path(tempfile.mkdtemp(prefix="minigpt-munge-"))
    key, sock = munge / "munge.key", munge / "munge.socket"
    try:
        os.chown(munge, user.pw_uid, user.pw_gid)
        munge.chmod(0o755)
        key.write_bytes(os.urandom(1024))
        os.chown(key, user.pw_uid, user.pw_gid)
        key.chmod(0o400)
        conf.write_text(slurm_conf(folder, sock, [free_port() for _ in range(3)]))
        files = [f"--key-file={key}", f"--socket={sock}", f"--pid-file={munge}/munged.pid"]
        files += [f"--log-file={munge}/munged.log", f"--seed-file={munge}/munged.seed"]
        # as the munge user, with none of root's groups (Popen sets the user, the group and the groups)
        start(
            cluster,
            "munged",
            ["/usr/sbin/munged", "--foreground", *files],
            user=user.pw_uid,
            group=user.pw_gid,
            extra_groups=[],
        )
        wait_for("munged", sock.exists, cluster, 10)
        start(cluster, "slurmctld", ["/usr/sbin/slurmctld", "-D"])
        for node in ("n1", "n2"):
            start(cluster, f"slurmd-{node}", ["/usr/sbin/slurmd", "-D", "-N", node])

        def idle() -> bool:
            nodes = cluster.command("sinfo", "--noheader", "--Node", "--format=%N %t").stdout.split()
            return nodes == ["n1", "idle", "n2", "idle"]

        wait_for("both nodes idle (sinfo)", idle, cluster, 30)
        yield cluster
    finally:
        killed = stop(cluster, conf)
        shutil.rmtree(munge, ignore_errors=True)
        alive = [f"{name} (pid {proc.pid})" for name, proc in cluster.daemons if proc.poll() is None]
        assert not alive and not ours(conf), f"still running after the cluster was stopped: {alive or ours(conf)}"
        assert not killed, f"had to be killed: {killed}"


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_lab01_recipe_runs_on_two_nodes(slurm, tmp_path):
    """``sbatch --wait lab/slurm/01_ddp.sbatch``: one torchrun per node, 2 ranks each (the recipe's default on 2
    nodes), gloo on CPU, the c10d rendezvous at the address n1 gives for itself (n1 does not resolve here)."""
    env = {
        # the suite's settings for a launch (tests/test_lab01_script.py), and the rank logs in this test's folder
        "OMP_NUM_THREADS": "1",
        "MINIGPT_DEVICE": "cpu",  # two "nodes" on one machine would share its GPUs
        "PYTHONPATH": str(ROOT),
        "PYTHONFAULTHANDLER": "1",
        "RDZV_PORT": str(free_port()),
        "LOGS": str(tmp_path / "logs"),
    }
    started = time.monotonic()
    recipe = str(LAB01.relative_to(ROOT))
    submit = slurm.command("sbatch", "--wait", f"--output={tmp_path}/job-%j.out", recipe, *SHORT, env=env, timeout=180)
    seconds = time.monotonic() - started
    job = re.search(r"Submitted batch job (\d+)", submit.stdout)
    assert job, submit.stdout + submit.stderr + slurm.logs()
    output_file = tmp_path / f"job-{job.group(1)}.out"
    output = output_file.read_text(errors="replace") if output_file.exists() else "(no output file)"
    # sbatch --wait's exit status is the job's, unless it lost the job (then 0, and a line on stderr)
    assert submit.returncode == 0 and submit.stderr == "", (
        f"sbatch --wait: {submit.returncode} {submit.stderr}\n{output[-4000:]}"
    )
    assert "lab01-ddp: 2 nodes (n[1-2]) x 2 ranks; rendezvous on n1 at " in output, output[-4000:]
    assert "world size 4 (gloo, cpu)" in output and "check PASS" in output, output[-4000:]

    logs = sorted((tmp_path / "logs").glob("node*/*/attempt_0/*/stdout.log"))
    assert sorted((p.parts[-5], p.parts[-2]) for p in logs) == [
        ("node0", "0"),
        ("node0", "1"),
        ("node1", "0"),
        ("node1", "1"),
    ], logs
    assert sum("check PASS" in p.read_text() for p in logs) == 1, "rank 0's log, and only its, has the verdict"

    state = slurm.command("sacct", "-c", "-j", job.group(1), "-P", "-n", "--format=JobID,State,ExitCode,NNodes")
    assert state.stdout.split() == [f"{job.group(1)}|COMPLETED|0:0|2"], state.stdout + state.stderr
    print(f"sbatch --wait took {seconds:.1f} s")
