"""Lab 01's check on every CPU a learner may own: the drift check under each kernel set.

Float32 results at the level of one rounding depend on which machine code computes them; a *kernel
set* (:mod:`minigpt.kernel_sets`) holds PyTorch's, MKL's and oneDNN's kernels to one instruction set.
This module runs ``lab/01_ddp.py --check --full`` under each kernel set the machine supports (a set
is supported when PyTorch reports the capability it was asked for) and collects the reports:

    python lab/01_kernel_sets.py --out out                       # AdamW, the default run
    python lab/01_kernel_sets.py --out out --config sgd           # SGD at learning rate 0.1
    python lab/01_kernel_sets.py --render lab/results/01-kernel-sets-cpu.json

The table on the Lab 01 page (kernel set x worst step drift x step) comes from its JSON.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from minigpt import cli, kernel_sets

ROOT = Path(__file__).resolve().parent.parent.parent
PROG = "lab/01_kernel_sets.py"

CONFIGS: dict[str, list[str]] = {
    "adamw": [],
    "sgd": ["--optimizer", "sgd", "--lr", "0.1", "--min-lr", "0"],
    "float64": ["--dtype", "float64"],
}


def run_check(kernel_set: str, report: Path, extra: list[str], timeout_s: float) -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc_per_node=2 lab/01_ddp.py --check --report REPORT *extra``
    under ``kernel_set``."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "lab/01_ddp.py",
        "--check",
        "--full",  # the float32 probe and the trajectory the page's table shows
        "--quiet",
        "--report",
        str(report),
        *extra,
    ]
    return subprocess.run(
        command,
        cwd=ROOT,
        env={**kernel_sets.environment(kernel_set), "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def summary(kernel_set: str, report: dict) -> dict:
    """The numbers the page's table shows, from one check's report."""
    v = report["variants"]["bucketed"]
    return {
        "kernel_set": kernel_set,
        "cpu_capability": report["cpu_capability"],
        "passed": report["criterion_pass"],
        "max_step_drift": report["max_logit_drift"],
        "worst_step": v["step_drift"]["worst_step"],
        "max_step_drift_float32_probe": v["step_drift_float32_probe"]["max"],
        "worst_step_float32_probe": v["step_drift_float32_probe"]["worst_step"],
        "max_micro_batch_drift": report["max_micro_batch_drift"],
        "bit_identical_to_micro_batches": report["bit_identical_to_micro_batches"],
        "trajectory_first_step_above_tolerance": v["trajectory_drift"]["first_step_above_tolerance"],
        "ranks_bit_identical": report["ranks_bit_identical"],
        "tutor_accuracy": report["tutor_accuracy"],
        "final_loss": report["final_loss"],
    }


def main(argv: list[str] | None = None) -> int:
    p = cli.ArgumentParser(
        prog=f"python {PROG}",
        name=PROG,
        description=__doc__.split("\n")[0],
        formatter_class=cli.HelpFormatter,
    )
    p.add_argument("--config", choices=tuple(CONFIGS), default="adamw", help="which Lab 01 run to check")
    p.add_argument(
        "--kernel-sets",
        default=",".join(kernel_sets.KERNEL_SETS),
        help=f"comma list of {', '.join(kernel_sets.KERNEL_SETS)} (those the CPU does not support are left out)",
    )
    p.add_argument("--out", default="out", help="folder for 01-kernel-sets-<config>-cpu.json and its tables")
    p.add_argument("--render", metavar="JSON", help="only write the tables of an existing result")
    p.add_argument("--timeout", type=cli.SECONDS, default=1800.0, help="seconds one check may take")
    args = p.parse_args(argv)
    from minigpt.pages import lab01_check

    try:
        if args.render:
            source = cli.input_json(
                args.render, "--render", ("config", "rows"), "lab/results/01-kernel-sets-adamw-cpu.json"
            )
            for path in lab01_check.render(source):
                print(f"wrote {path}")
            return 0
        names = [n.strip() for n in args.kernel_sets.split(",") if n.strip()]
        unknown = [n for n in names if n not in kernel_sets.KERNEL_SETS]
        if unknown or not names:
            raise cli.BadInput(
                f"--kernel-sets {args.kernel_sets!r}: unknown {', '.join(unknown) or '(none)'}; "
                f"choose from {', '.join(kernel_sets.KERNEL_SETS)}"
            )
        out = cli.output_dir(args.out, "--out")
    except (cli.BadInput, ValueError) as exc:
        return cli.refuse(PROG, str(exc))
    rows, skipped = [], []
    native = kernel_sets.native_capability()
    for name in names:
        if not kernel_sets.supported(name, native):
            skipped.append(name)
            print(f"{name}: not supported by this CPU, left out")
            continue
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            proc = run_check(name, Path(tmp) / "report.json", CONFIGS[args.config], args.timeout)
            if not (Path(tmp) / "report.json").exists():
                print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n", file=sys.stderr)
                return cli.refuse(PROG, f"the check under kernel set {name} wrote no report (exit {proc.returncode})")
            rows.append(summary(name, json.loads((Path(tmp) / "report.json").read_text())))
        print(
            f"{name}: step drift {rows[-1]['max_step_drift']:.2e} (step {rows[-1]['worst_step']}), float32 probe "
            f"{rows[-1]['max_step_drift_float32_probe']:.2e}, {time.perf_counter() - t0:.0f} s",
            flush=True,
        )
    import torch

    result = {
        "config": args.config,
        "arguments": CONFIGS[args.config],
        "rows": rows,
        "not_supported": skipped,
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "cpu_model": kernel_sets.cpu_model(),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
    }
    path = cli.make_parents(out / f"01-kernel-sets-{args.config}-cpu.json")
    path.write_text(json.dumps(result, indent=2) + "\n")
    for written in [path, *lab01_check.render(path)]:
        print(f"wrote {written}")
    return 0
