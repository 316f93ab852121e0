"""A third stated rule broken at a time (tests/test_grader.py grades this folder as it grades
tests/pitfalls/one_rule_each/: each test with only its own exercise the pitfall's).

Lab 00: the causal mask returned as 1.0 / 0.0 floats instead of a ``torch.bool`` tensor (0.1).
"""

from __future__ import annotations

import torch


def causal_mask(size: int) -> torch.Tensor:
    return torch.tril(torch.ones(size, size))  # Mistake: floats; the rule is a (size, size) torch.bool
