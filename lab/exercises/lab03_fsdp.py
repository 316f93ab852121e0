"""Lab 03 exercises: FSDP prefetch and FSDP in practice.

Fill in the three pieces, then grade yourself:

    make grade LAB=03          # this lab: points per exercise, one line per lost point
    make grade EX=3.1          # one exercise (the reference stands in for the others)
    make grade LAB=03 LANG=es  # el informe en español
    make hint EX=3.1           # stuck? the next hint of one exercise (one more on each call)

Read the lab guide first: ``lab/03-fsdp-prefetch.md``, and the annotated reading of PyTorch's
prefetch code (``python lab/03_fsdp_reading.py``). The reference is in
``minigpt/fsdp/variants.py``, ``minigpt/fsdp/sharded_state.py`` and ``minigpt/fsdp/practice.py``;
try not to peek. Each stub states its task: what it must achieve, its contract, and why it matters;
the steps are in the hints. Exercise 3.1 is checked against the event logs of real runs
(``lab/results/03-prefetch-cpu.json``), so your prediction must match what FSDP really did.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import nn

from minigpt.fsdp.variants import VARIANTS, Variant  # noqa: F401  (VARIANTS[name] says what a variant sets)
from minigpt.model import MiniGPT


def predict_event_order(n_blocks: int, variant: str) -> list[str]:
    """Exercise 3.1: the order in which the training thread of one step (after the first) issues
    ``"all-gather U"`` and ``"reduce-scatter U"`` and starts ``"forward B"`` / ``"backward B"``,
    for MiniGPT wrapped per block plus the root, under ``VARIANTS[variant]``.

    Units are ``"root"`` and ``"blocks.0"`` ... ; only blocks have forward/backward entries. The
    rules: a unit's pre-forward (pre-backward) all-gathers it unless it is already gathered or in
    flight, then all-gathers the ``forward_prefetch`` next (``backward_prefetch`` previous)
    blocks; after its forward a block is resharded unless ``reshard_after_forward`` is False;
    the root is not resharded after forward; backward starts with the root's pre-backward;
    after a block's backward its post-backward reduce-scatters it (BACKWARD_POST prefetches
    then, instead of in the pre-backward); the root reduce-scatters last.

    FSDP1 has one more rule (the lab guide's note "A surprise", section "Predict the order"): a
    unit's post-backward runs only after the backward of the first computation that started
    after the unit was all-gathered in forward. For a unit gathered right before its own forward
    that is its own backward, as in FSDP2; but with ``forward_prefetch`` a block gathered during
    the previous block's forward reduce-scatters only after that previous block's backward.

    Raise ValueError for an unknown variant or ``n_blocks < 1``.

    Why: whether communication hides behind computation is decided by this order: an all-gather
    issued one computation ahead overlaps it, one issued late is waited for. Predicting it is reading
    FSDP's rules well enough to know what a setting will do before you measure it.
    """
    raise NotImplementedError(
        "Exercise 3.1: predict the all-gathers, computations and reduce-scatters of a step, in order"
    )


def local_norm_term(tensors: Iterable[torch.Tensor], norm_type: float = 2.0) -> float:
    """Exercise 3.2a: this rank's share of the gradient's p-norm: the sum of |g|^p over its shard
    tensors (for ``norm_type == inf``: the largest |g|), computed in float64, as a Python float. A
    DTensor counts by its local shard (``t.to_local()``). No tensors: 0.

    Why a sum of powers and not a norm: the shards are disjoint pieces of one gradient, so the whole
    gradient's sum of |g|^p is the sum of the ranks' sums; norms do not add."""
    raise NotImplementedError("Exercise 3.2: the sum of |g|^p over this rank's shards")


def global_grad_norm_from_shards(local_terms: Sequence[float], norm_type: float = 2.0) -> float:
    """Exercise 3.2b: the norm of the whole gradient from every rank's :func:`local_norm_term`
    (what an all-reduce of the terms gives each rank): (sum of terms)^(1/p), or the largest term
    for p = inf. Raise ValueError for no terms or a norm_type that is not positive.

    Why: clipping must scale every rank's shards by one factor, from the norm of the whole gradient;
    a rank's own norm (or the largest of them) clips each rank differently, and the shards stop being
    pieces of one model's step."""
    raise NotImplementedError("Exercise 3.2: combine the ranks' terms into the global norm")


def units_of_policy(model: MiniGPT, policy: str) -> list[nn.Module]:
    """Exercise 3.3: the submodules a wrap ``policy`` makes into FSDP units of their own (the root
    is always one more unit, not in the list): ``"whole"`` none; ``"block"`` every transformer
    block; ``"linear"`` every ``nn.Linear`` whose parameters no module outside it shares (FSDP2
    refuses to put one parameter in two units: MiniGPT's ``lm_head`` shares its weight with the
    token embedding, so it stays in the root). ValueError for another policy.

    Why: a unit is what FSDP gathers at once: the policy sets how many all-gathers a step makes and
    how much is whole at the peak. One parameter can live in one unit only."""
    raise NotImplementedError("Exercise 3.3: choose the modules each wrap policy shards")
