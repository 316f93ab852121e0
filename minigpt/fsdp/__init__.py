"""FSDP: reading the real source, tracing and timing real runs, FSDP in practice.

Lab 01 built data parallelism by hand: every rank holds all the weights, and gradients are
all-reduced in buckets while backward is still running. FSDP keeps only a shard (1/N) of every
weight on each rank, so it must all-gather a module's parameters before that module runs, in
forward and again in backward, and reduce-scatter its gradients afterwards. Whether that costs
time depends on one thing: is the next all-gather already on its way while the current module
computes? That is *prefetching*, and this package studies it in PyTorch's own implementation
rather than in a copy of it.

* Reading (:mod:`minigpt.fsdp.reading`, notes in :mod:`minigpt.fsdp.annotations`): the prefetch
  logic of FSDP2 (``fully_shard``) and FSDP1 (``FullyShardedDataParallel``), shown straight from
  the installed torch with its real line numbers and our notes beside it, in English and
  Spanish. Nothing of torch is copied here: each note is keyed to a function and a short anchor,
  and a test fails, naming the note, the day an upgrade moves the line away.
* Tracing and timing: real FSDP runs of MiniGPT, recording when each all-gather is issued and
  waited for, and how long a step takes with and without prefetching.
* In practice: the settings that trade memory for overlap (``reshard_after_forward``, explicit
  prefetch lists, the FSDP1 rate limiter) and what they do to a real run.

Run ``python lab/03_fsdp_reading.py`` to start reading.
"""
