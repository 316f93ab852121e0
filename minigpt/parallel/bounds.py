"""Every bound the course holds a run to, in one place: the rulers of :mod:`minigpt.parallel.proof`, the
kernels' comparisons and the comparisons with PyTorch's own implementations. No torch here: the page
modules read the same numbers to print each criterion beside its measurement."""

from __future__ import annotations

FP32_ONE_STEP_BOUND = 1e-5  # ruler 2: the course's promise, one float32 step against one process
FP64_DRIFT_BOUND = 1e-9  # ruler 1: the algorithm, the step drift in float64
FP32_DRIFT_BOUND = 1e-5  # ruler 3, for the data-parallel family: the float32 drift at every step
FP64_MIN_STEPS = 20  # ruler 1 runs at least this many steps
PYTORCH_ONE_STEP_BOUND = 1e-6  # model-parallel: our one-step logits against PyTorch's own implementation
PYTORCH_DRIFT_FACTOR = 2.0  # model-parallel: our float32 step drift at most twice PyTorch's on the same run
PYTORCH_DDP_BOUND = 1e-6  # DDP on other than 2 ranks: the weights one step from the same state, ours against PyTorch's
PYTORCH_ZERO1_BOUND = 1e-6  # ZeRO-1 with clipping against ZeroRedundancyOptimizer (bit-identical without)
KERNEL_BOUNDS = {"float32": 1e-5, "float64": 1e-12}  # one kernel or layer against one process, per dtype


def drift_bound(pytorch_drift: float) -> float:
    """Ruler 3 for the model-parallel family (Labs 05-07): our float32 step drift over the run is no
    further from one process than twice PyTorch's own implementation on the same run, or within the
    data-parallel family's 1e-5 (early in a run both are a few 1e-7 to 1e-6, dominated by the first
    step, and twice a small number says nothing: our first step cuts the vocabulary too, PyTorch's
    plan does not)."""
    return max(FP32_DRIFT_BOUND, PYTORCH_DRIFT_FACTOR * pytorch_drift)


def close_to_pytorch(logit_diff: float, drift: float, pytorch_drift: float) -> bool:
    """The model-parallel family against PyTorch's own implementation (Labs 05-07's ``same_as_pytorch``):
    the first step's logits within :data:`PYTORCH_ONE_STEP_BOUND` of PyTorch's, and our float32 step
    drift over the run within :func:`drift_bound` of PyTorch's on the same run."""
    return bool(logit_diff <= PYTORCH_ONE_STEP_BOUND and drift <= drift_bound(pytorch_drift))
