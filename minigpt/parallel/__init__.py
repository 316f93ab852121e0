"""What runs across processes and is taught: the mechanisms the learner studies and rebuilds.

* :mod:`launch` - start-up and tear-down from torchrun's environment (gloo on CPU, NCCL on GPU),
  the timeout every collective obeys, messages that name the rank;
* :mod:`ring` - ring reduce-scatter, all-gather and all-reduce written on send/recv, with byte
  counters;
* :mod:`ddp` - the bucketed, overlapped DDP of Lab 01; :mod:`ddp_steps` - the versions it grew
  from, down to the naive one all-reduce per gradient;
* :mod:`zero1` - ZeRO stage 1: the optimizer state sharded over the ranks (Lab 02);
* :mod:`equivalence` - the check that a distributed run computes what one process would.

Labs 04-06 add their mechanisms here (FSDP from scratch, tensor / sequence / context parallel,
pipeline schedules, device meshes). The lab scripts that run them live in :mod:`minigpt.runners`.
"""
