"""Every lab's default ``--check``, timed and under every kernel set: the maintainers' measurements of
the checks themselves (the lab pages show their tables).

    python -m minigpt.runners.checks times --out lab/results            # make check-times
    python -m minigpt.runners.checks kernel-sets --out lab/results      # make kernel-sets
    python -m minigpt.runners.checks times --only 01,04 --repeats 1     # a part of it

``times`` runs each check :data:`CHECKS` lists ``--repeats`` times (default 3) as a learner does
(``torchrun --standalone --nproc_per_node=N lab/NN_script.py --check``, ``OMP_NUM_THREADS=1``) and
keeps the wall-clock seconds from the command to its exit: the median is what the guides quote.
Run it on a quiet machine: it is a benchmark, and a busy machine measures the other load.

``kernel-sets`` runs each check once under each kernel set the CPU supports (ATen, MKL and oneDNN
held together: see :mod:`minigpt.runners.lab01_kernel_sets`) and keeps its rulers: every criterion
must hold on every kernel set, and the table shows by how much.

Both write ``checks-{times,kernel-sets}-cpu.json`` and their tables (``-en.txt`` / ``-es.txt``, one
section per lab: :mod:`minigpt.pages.checks`).
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

from minigpt import cli
from minigpt.runners import lab01_kernel_sets as kernel_sets

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
QUIET = {
    "lab/01_ddp.py",
    "lab/04_fsdp.py",
    "lab/05_tensor_parallel.py",
    "lab/06_pipeline.py",
    "lab/06_mesh.py",
    "lab/07_nd_parallel.py",
}


def run_check(ranks: int, script: list[str], report: Path, env: dict, timeout_s: float) -> tuple[int, float, str]:
    """One check as a learner runs it: its exit status, wall-clock seconds and the end of its output."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}", *script]
    command += ["--report", str(report)] + (["--quiet"] if script[0] in QUIET else [])
    t0 = time.perf_counter()
    proc = subprocess.run(
        command,
        cwd=ROOT,
        env={**env, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    return proc.returncode, time.perf_counter() - t0, (proc.stdout + proc.stderr)[-2000:]


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
    p.add_argument("what", choices=("times", "kernel-sets"), help="time the checks, or run them under each kernel set")
    p.add_argument("--only", default=None, help="comma list of labs (01, 02, 04, 05, 06, 07); default: all")
    p.add_argument("--repeats", type=cli.POSITIVE_INT, default=3, help="times: runs of each check (the median is kept)")
    p.add_argument("--out", default="out", help="folder for checks-<what>-cpu.json and its tables")
    p.add_argument("--timeout", type=cli.SECONDS, default=1800.0, help="seconds one check may take")
    p.add_argument("--render", metavar="JSON", help="only write the tables of an existing result")
    args = p.parse_args(argv)
    from minigpt.pages import checks as page

    labs = sorted({lab for lab, *_ in CHECKS})
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
    sets = [None] if args.what == "times" else [k for k in kernel_sets.ORDER if kernel_sets.supported(k, native)]
    for lab, name, ranks, script in CHECKS:
        if lab not in only:
            continue
        for kernel_set in sets:
            env = dict(os.environ) if kernel_set is None else kernel_sets.environment(kernel_set)
            runs, report = [], {}
            for _ in range(args.repeats if args.what == "times" else 1):
                with tempfile.TemporaryDirectory() as tmp:
                    path = Path(tmp) / "report.json"
                    code, seconds, tail = run_check(ranks, script, path, env, args.timeout)
                    report = json.loads(path.read_text()) if path.exists() else {}
                runs.append({"exit": code, "seconds": round(seconds, 1)})
                label = f"{lab} {name}, {ranks} ranks" + (f", {kernel_set}" if kernel_set else "")
                print(f"{label}: exit {code} in {seconds:.0f} s", flush=True)
                if code != 0:
                    print(tail, file=sys.stderr)
            row = {"lab": lab, "name": name, "ranks": ranks, "command": " ".join(script), "runs": runs}
            if args.what == "times":
                row["median_seconds"] = statistics.median(r["seconds"] for r in runs)
            else:
                row.update(kernel_set=kernel_set, **rulers_of(report))
            rows.append(row)
    result = {"what": args.what, "machine": machine(), "repeats": args.repeats, "rows": rows}
    path = cli.make_parents(out / f"checks-{args.what}-cpu.json")
    path.write_text(json.dumps(result, indent=2) + "\n")
    for written in [path, *page.render(path)]:
        print(f"wrote {written}")
    return 0 if all(r["exit"] == 0 for row in rows for r in row["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
