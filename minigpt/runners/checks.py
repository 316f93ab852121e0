"""Every lab's default ``--check``, timed and under every kernel set: the maintainers' measurements of
the checks themselves (the lab pages show their tables).

    python -m minigpt.runners.checks times --out lab/results            # make check-times
    python -m minigpt.runners.checks kernel-sets --out lab/results      # make kernel-sets
    python -m minigpt.runners.checks memory --out lab/results           # make check-memory
    python -m minigpt.runners.checks grades --out lab/results           # make check-grades
    python -m minigpt.runners.checks times --only 01,04 --repeats 1     # a part of it

``times`` runs each check :data:`CHECKS` lists ``--repeats`` times (default 3) as a learner does
(``torchrun --standalone --nproc_per_node=N lab/NN_script.py --check``, ``OMP_NUM_THREADS=1``) and
keeps the wall-clock seconds from the command to its exit: the median is what the guides quote.
Run it on a quiet machine: it is a benchmark, and a busy machine measures the other load.

``kernel-sets`` runs each check once under each kernel set the CPU supports (ATen, MKL and oneDNN
held together: see :mod:`minigpt.kernel_sets`) and keeps its rulers: every criterion
must hold on every kernel set, and the table shows by how much.

``memory`` runs each check once and keeps the peak of the resident memory of all its processes
together (torchrun and every rank: what a learner's machine must hold) and of the largest one.

``grades`` times ``make grade EX=N.M`` for the exercise each lab's grading section shows, the exercise
written (``--impl reference``: a learner's correct answer runs the same tests), and ``make grade`` on
the untouched stubs of ``lab/exercises/``, ``--repeats`` times each, and keeps the points each run
earned: full marks and zero are what they must score.

Each writes ``checks-{times,kernel-sets,memory,grades}-cpu.json`` and its tables (``-en.txt`` / ``-es.txt``,
one section per lab: :mod:`minigpt.pages.checks`).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from minigpt import cli, impl, kernel_sets

ROOT = Path(__file__).resolve().parent.parent.parent
PROG = "python -m minigpt.runners.checks"

# (lab, name, ranks, script and its arguments): the default check of every lab script
CHECKS: list[tuple[str, str, int, list[str]]] = [
    ("01", "ddp", 2, ["lab/01_ddp.py", "--check"]),
    ("02", "crosscheck", 2, ["lab/02_crosscheck.py"]),
    ("04", "fsdp", 2, ["lab/04_fsdp.py", "--check"]),
    ("04", "fsdp", 4, ["lab/04_fsdp.py", "--check"]),
    ("05", "tensor-parallel", 2, ["lab/05_tensor_parallel.py", "--check"]),
    ("05", "tensor-parallel-sp", 4, ["lab/05_tensor_parallel.py", "--check", "--sequence-parallel"]),
    ("05", "ring-attention", 2, ["lab/05_ring_attention.py", "--check"]),
    ("05", "ring-attention", 4, ["lab/05_ring_attention.py", "--check"]),
    ("06", "pipeline", 2, ["lab/06_pipeline.py", "--check"]),
    ("06", "pipeline-gpipe", 4, ["lab/06_pipeline.py", "--check", "--schedule", "gpipe"]),
    ("06", "mesh", 4, ["lab/06_mesh.py", "--check", "--shard", "2"]),
    ("07", "nd-parallel", 8, ["lab/07_nd_parallel.py", "--check"]),
]
# the runs the memory table adds: Lab 00's single process (plain python) and Lab 03's two scripts
MEMORY_ONLY: list[tuple[str, str, int, list[str]]] = [
    ("00", "train", 1, ["-m", "minigpt.train"]),
    ("03", "fsdp-prefetch", 2, ["lab/03_fsdp_prefetch.py"]),
    ("03", "fsdp-practice", 2, ["lab/03_fsdp_practice.py"]),
]
# (lab, exercise): the one-exercise grading each lab's "Grade yourself" section shows; None: make grade, every
# lab, on the untouched stubs (Lab 00's section shows it)
GRADES: list[tuple[str, str | None]] = [
    ("00", None),
    ("00", "0.2"),
    ("01", "1.3"),
    ("02", "2.5"),
    ("03", "3.1"),
    ("04", "4.3"),
    ("05", "5.2"),
    ("06", "6.1"),
    ("07", "7.1"),
]
ONE_THREAD = {"OMP_NUM_THREADS": "1"}  # a check's ranks, as the guides run them; make grade as it is
QUIET = {
    "lab/01_ddp.py",
    "lab/04_fsdp.py",
    "lab/05_tensor_parallel.py",
    "lab/06_pipeline.py",
    "lab/06_mesh.py",
    "lab/07_nd_parallel.py",
}


def environment(script: list[str], env: dict) -> dict:
    """A check's ranks on one thread each, as the guides run them; ``make grade`` as a learner types it,
    on this checkout's ``lab/exercises/``."""
    if script[:2] != ["-m", "minigpt.grader"]:
        return {**env, "PYTHONPATH": str(ROOT), **ONE_THREAD}
    return {**{k: v for k, v in env.items() if k != impl.DIR_ENV_VAR}, "PYTHONPATH": str(ROOT)}


def run_check(
    ranks: int, script: list[str], report: Path, env: dict, timeout_s: float, memory: dict | None = None
) -> tuple[int, float, str]:
    """One check as a learner runs it: its exit status, wall-clock seconds and the end of its output.
    With ``memory`` (a dict), the peak resident memory of the whole run is kept in it (:class:`MemoryWatch`)."""
    if script[:2] == ["-m", "minigpt.grader"]:  # make grade: its results saved where the report goes
        command = [sys.executable, *script, "--save", str(report)]
    elif script[0] == "-m":  # a plain python module (Lab 00's trainer): one process, its checkpoint beside the report
        command = [sys.executable, *script, "--quiet", "--out", str(report.with_suffix(".pt"))]
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}", *script]
        command += ["--report", str(report)] + (["--quiet"] if script[0] in QUIET else [])
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as output:
        proc = subprocess.Popen(
            command,
            cwd=ROOT,
            env=environment(script, env),
            stdout=output,
            stderr=subprocess.STDOUT,
            text=True,
        )
        watch = MemoryWatch(proc.pid) if memory is not None else None
        deadline = time.monotonic() + timeout_s
        while proc.poll() is None:
            if time.monotonic() > deadline:
                proc.kill()
                raise subprocess.TimeoutExpired(command, timeout_s)
            if watch is not None:
                watch.look()
            time.sleep(MemoryWatch.EVERY_S)
        if memory is not None:
            memory.update(watch.peaks())
        output.seek(0)
        return proc.returncode, time.perf_counter() - t0, output.read()[-2000:]


class MemoryWatch:
    """The resident memory of a process and every process under it, looked at every quarter second
    (Linux's /proc): the peak of their sum (what the machine must hold at once) and of the largest one."""

    EVERY_S = 0.25

    def __init__(self, pid: int):
        self.pid, self.total, self.largest = pid, 0, 0

    @staticmethod
    def rss(pid: int) -> int:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 0

    def tree(self) -> list[int]:
        children: dict[int, list[int]] = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
                children.setdefault(ppid, []).append(int(entry.name))
        found, todo = [], [self.pid]
        while todo:
            pid = todo.pop()
            found.append(pid)
            todo += children.get(pid, [])
        return found

    def look(self) -> None:
        sizes = [self.rss(pid) for pid in self.tree()]
        self.total, self.largest = max(self.total, sum(sizes)), max(self.largest, max(sizes, default=0))

    def peaks(self) -> dict:
        return {"peak_total_bytes": self.total, "peak_largest_process_bytes": self.largest}


def rulers_of(report: dict) -> dict:
    """The numbers a kernel-set row shows: the harness's keys and the verdict."""
    keys = ("fp64_max_step_drift", "fp32_first_step_logit_diff", "fp32_first_step_grad_diff", "fp32_max_step_drift")
    out = {k: report.get(k) for k in keys}
    out.update(
        criterion_pass=report.get("criterion_pass"),
        broken_rulers=report.get("broken_rulers", []),
        pytorch_max_diff=report.get("pytorch_max_diff"),
        same_as_pytorch=report.get("same_as_pytorch"),
        cpu_capability=report.get("cpu_capability"),
    )
    return out


def machine() -> dict:
    import torch

    return {
        "cpu_model": kernel_sets.cpu_model(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
    }


def main(argv: list[str] | None = None) -> int:
    p = cli.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0], formatter_class=cli.HelpFormatter)
    p.add_argument(
        "what",
        choices=("times", "kernel-sets", "memory", "grades"),
        help="time the checks, run them under each kernel set, measure the memory each takes (once each), "
        "or time one exercise's grading per lab",
    )
    p.add_argument("--only", default=None, help="comma list of labs (e.g. 01,04); default: every lab the mode measures")
    p.add_argument(
        "--repeats", type=cli.POSITIVE_INT, default=3, help="times, grades: runs of each (the median is kept)"
    )
    p.add_argument("--out", default="out", help="folder for checks-<what>-cpu.json and its tables")
    p.add_argument("--timeout", type=cli.SECONDS, default=1800.0, help="seconds one check may take")
    p.add_argument("--render", metavar="JSON", help="only write the tables of an existing result")
    args = p.parse_args(argv)
    from minigpt.pages import checks as page

    if args.what == "grades":
        runs_of = [
            (lab, "grade", 1, ["-m", "minigpt.grader", "--exercise", ex, "--impl", "reference"])
            if ex
            else (lab, "grade-stubs", 1, ["-m", "minigpt.grader", "--impl", "exercises"])
            for lab, ex in GRADES
        ]
    else:
        runs_of = CHECKS + (MEMORY_ONLY if args.what == "memory" else [])
    labs = sorted({lab for lab, *_ in runs_of})
    timed = args.what in ("times", "grades")
    try:
        if args.render:
            source = cli.input_json(args.render, "--render", ("what", "rows"), "lab/results/checks-times-cpu.json")
            for path in page.render(source):
                print(f"wrote {path}")
            return 0
        only = labs if args.only is None else [x.strip() for x in args.only.split(",") if x.strip()]
        unknown = [x for x in only if x not in labs]
        if unknown or not only:
            raise cli.BadInput(
                f"--only {args.only!r}: unknown lab {', '.join(unknown) or '(none)'}; choose from {', '.join(labs)}"
            )
        out = cli.output_dir(args.out, "--out")
    except ValueError as exc:
        return cli.refuse(PROG, str(exc))
    rows = []
    native = kernel_sets.native_capability()
    sets = [None] if args.what != "kernel-sets" else [k for k in kernel_sets.ORDER if kernel_sets.supported(k, native)]
    for lab, name, ranks, script in sorted(runs_of, key=lambda c: c[0]):
        if lab not in only:
            continue
        for kernel_set in sets:
            env = dict(os.environ) if kernel_set is None else kernel_sets.environment(kernel_set)
            runs, report, memory = [], {}, ({} if args.what == "memory" else None)
            for _ in range(args.repeats if timed else 1):
                with tempfile.TemporaryDirectory() as tmp:
                    path = Path(tmp) / "report.json"
                    code, seconds, tail = run_check(ranks, script, path, env, args.timeout, memory)
                    report = json.loads(path.read_text()) if path.exists() else {}
                runs.append({"exit": code, "seconds": round(seconds, 1)})
                if args.what == "grades":  # its points: full marks written, zero on the stubs (scored_as_expected)
                    results = report.get("results", [])
                    runs[-1].update(
                        earned=sum(r["points"] for r in results if r["passed"]), total=sum(r["points"] for r in results)
                    )
                    runs[-1]["as_expected"] = scored_as_expected(name, runs[-1])
                label = f"{lab} {name}, {ranks} ranks" + (f", {kernel_set}" if kernel_set else "")
                if args.what == "grades":
                    label = f"{lab} {command_of(name, script)}"
                print(f"{label}: exit {code} in {seconds:.0f} s", flush=True)
                if code != 0:
                    print(tail, file=sys.stderr)
            command = command_of(name, script) if args.what == "grades" else " ".join(script)
            row = {"lab": lab, "name": name, "ranks": ranks, "command": command, "runs": runs}
            if timed:
                row["median_seconds"] = statistics.median(r["seconds"] for r in runs)
            elif args.what == "memory":
                row.update(memory)
            else:
                row.update(kernel_set=kernel_set, **rulers_of(report))
            rows.append(row)
    repeats = args.repeats if timed else 1
    result = {"what": args.what, "machine": machine(), "repeats": repeats, "rows": rows}
    path = cli.make_parents(out / f"checks-{args.what}-cpu.json")
    path.write_text(json.dumps(result, indent=2) + "\n")
    for written in [path, *page.render(path)]:
        print(f"wrote {written}")
    return 0 if all(r["exit"] == 0 and r.get("as_expected", True) for row in rows for r in row["runs"]) else 1


def command_of(name: str, script: list[str]) -> str:
    """The make command a learner types for a grading run."""
    return f"make grade EX={script[3]}" if name == "grade" else "make grade"


def scored_as_expected(name: str, run: dict) -> bool:
    """A grading run's score as it must be: full marks with the exercise written (``grade``), zero on the
    untouched stubs (``grade-stubs``)."""
    if name == "grade":
        return run["total"] > 0 and run["earned"] == run["total"]
    return run["total"] > 0 and run["earned"] == 0


if __name__ == "__main__":
    sys.exit(main())
