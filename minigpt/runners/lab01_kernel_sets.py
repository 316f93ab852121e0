"""Lab 01's check on every CPU a learner may own: the drift check under each kernel set.

Float32 results at the level of one rounding depend on which machine code computes them: the
same sum of 64 numbers added 16 at a time (AVX-512) or 8 at a time (AVX2) rounds differently.
PyTorch picks its kernels from the CPU at start-up, and three libraries can be held to a smaller
instruction set than the CPU has, so one machine can run as older CPUs would:

* ``ATEN_CPU_CAPABILITY`` (``default``, ``avx2``, ``avx512``): PyTorch's own kernels (sums,
  softmax, layer norm, the element-wise ops, and small matrix products);
* ``MKL_ENABLE_INSTRUCTIONS`` (``SSE4_2``, ``AVX2``, ``AVX512``): Intel MKL's matrix products;
* ``ONEDNN_MAX_CPU_ISA`` (``SSE41``, ``AVX2``, ``AVX512_CORE``): oneDNN's kernels (GELU here).

A *kernel set* holds the three together. This module runs ``lab/01_ddp.py --check --full`` under each
kernel set the machine supports (a set is supported when PyTorch reports the capability it was
asked for) and collects the reports:

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

from minigpt import cli

ROOT = Path(__file__).resolve().parent.parent.parent
PROG = "lab/01_kernel_sets.py"

KERNEL_SETS: dict[str, dict[str, str]] = {
    "avx512": {
        "ATEN_CPU_CAPABILITY": "avx512",
        "MKL_ENABLE_INSTRUCTIONS": "AVX512",
        "ONEDNN_MAX_CPU_ISA": "AVX512_CORE",
    },
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "baseline": {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "ONEDNN_MAX_CPU_ISA": "SSE41"},
}
# what torch.backends.cpu.get_cpu_capability() answers when the set is in force
REPORTED = {"avx512": "AVX512", "avx2": "AVX2", "baseline": "DEFAULT"}

CONFIGS: dict[str, list[str]] = {
    "adamw": [],
    "sgd": ["--optimizer", "sgd", "--lr", "0.1", "--min-lr", "0"],
    "float64": ["--dtype", "float64"],
}


def environment(kernel_set: str) -> dict[str, str]:
    """The process environment that holds every library to ``kernel_set``."""
    return {**os.environ, **KERNEL_SETS[kernel_set], "OMP_NUM_THREADS": "1"}


ORDER = ("baseline", "avx2", "avx512")  # each needs the instructions of the ones before it


def native_capability() -> str:
    """What PyTorch picks on this CPU when nothing holds it back (a fresh process without the
    three variables, which it reads only at start-up)."""
    env = {k: v for k, v in os.environ.items() if k not in KERNEL_SETS["avx2"]}
    code = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    return proc.stdout.strip()


def supported(kernel_set: str, native: str | None = None) -> bool:
    """Can this CPU run ``kernel_set``? Yes when it is not above what PyTorch picks natively
    (a CPU with AVX-512 runs all three; an x86 CPU with AVX2 only, two; other CPUs the baseline)."""
    native = native_capability() if native is None else native
    reached = {"AVX512": "avx512", "AVX2": "avx2"}.get(native, "baseline")
    return ORDER.index(kernel_set) <= ORDER.index(reached)


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
        env={**environment(kernel_set), "PYTHONPATH": str(ROOT)},
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
        default=",".join(KERNEL_SETS),
        help=f"comma list of {', '.join(KERNEL_SETS)} (those the CPU does not support are left out)",
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
        unknown = [n for n in names if n not in KERNEL_SETS]
        if unknown or not names:
            raise cli.BadInput(
                f"--kernel-sets {args.kernel_sets!r}: unknown {', '.join(unknown) or '(none)'}; "
                f"choose from {', '.join(KERNEL_SETS)}"
            )
        out = cli.output_dir(args.out, "--out")
    except (cli.BadInput, ValueError) as exc:
        return cli.refuse(PROG, str(exc))
    rows, skipped = [], []
    native = native_capability()
    for name in names:
        if not supported(name, native):
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
        "cpu_model": cpu_model(),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
    }
    path = cli.make_parents(out / f"01-kernel-sets-{args.config}-cpu.json")
    path.write_text(json.dumps(result, indent=2) + "\n")
    for written in [path, *lab01_check.render(path)]:
        print(f"wrote {written}")
    return 0


def cpu_model() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo), or the platform's processor string."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


if __name__ == "__main__":
    sys.exit(main())
