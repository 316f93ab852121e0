"""What picks the CPU's kernels, and so the last bits of every float32 result.

The same sum of 64 numbers added 16 at a time (AVX-512) or 8 at a time (AVX2) rounds differently.
PyTorch picks its kernels from the CPU at start-up, and three libraries can be held to a smaller
instruction set than the CPU has, so that one machine runs as older CPUs would:

* ``ATEN_CPU_CAPABILITY`` (``default``, ``avx2``, ``avx512``): PyTorch's own kernels (sums,
  softmax, layer norm, the element-wise ops, and small matrix products);
* ``MKL_ENABLE_INSTRUCTIONS`` (``SSE4_2``, ``AVX2``, ``AVX512``): Intel MKL's matrix products;
* ``ONEDNN_MAX_CPU_ISA`` (``SSE41``, ``AVX2``, ``AVX512_CORE``): oneDNN's kernels (GELU here).

A *kernel set* holds the three together. Every lab's report records the three variables
(:mod:`minigpt.runners.entry`); ``lab/01_kernel_sets.py`` and ``make kernel-sets`` run the checks
under each set the machine supports; the suite's launcher starts a fresh process, not a fork, for
a rank under a kernel set, since the libraries read the variables only at start-up.
"""

from __future__ import annotations

import functools
import os
import platform
import subprocess
import sys
from pathlib import Path

VARIABLES = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")
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
ORDER = ("baseline", "avx2", "avx512")  # each needs the instructions of the ones before it


def environment(kernel_set: str) -> dict[str, str]:
    """The process environment that holds every library to ``kernel_set``."""
    return {**os.environ, **KERNEL_SETS[kernel_set], "OMP_NUM_THREADS": "1"}


@functools.cache
def native_capability() -> str:
    """What PyTorch picks on this CPU when nothing holds it back (a fresh process without the
    three variables, which it reads only at start-up; asked once per process)."""
    env = {k: v for k, v in os.environ.items() if k not in VARIABLES}
    code = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    return proc.stdout.strip()


def supported(kernel_set: str, native: str | None = None) -> bool:
    """Can this CPU run ``kernel_set``? Yes when it is not above what PyTorch picks natively
    (a CPU with AVX-512 runs all three; an x86 CPU with AVX2 only, two; other CPUs the baseline)."""
    native = native_capability() if native is None else native
    reached = {"AVX512": "avx512", "AVX2": "avx2"}.get(native, "baseline")
    return ORDER.index(kernel_set) <= ORDER.index(reached)


def cpu_model() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo), or the platform's processor string."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
