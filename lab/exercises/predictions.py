"""Predict, then run: your answers, before you run the labs.

Each question below asks for one number (or a list of ranks) that a lab's mechanism decides. Work it
out from the guide and Lab 00's shapes, write it in place of None, then grade it: the grader runs the
course's code, measures the same thing, and shows why once you have answered.

    make grade EX=P1.1        # one prediction
    make grade LAB=01         # with the lab's exercises

In a notebook, predict("P1.1", 123) writes the answer here for you.
"""

# P1.1 · Lab 01 · the ring's bytes on 4 ranks
# Your ring all-reduce (Exercise 1.1) runs on 4 ranks over one float32 buffer of MiniGPT's 507,552 gradients
# (2,030,208 bytes). How many bytes does rank 0 send, in all?
P1_1 = None

# P1.2 · Lab 01 · buckets at a cap of 0.25 MiB
# BucketedDDP groups MiniGPT's parameters (Lab 00 lists their shapes) into buckets, last parameter first,
# closing a bucket once it reaches the cap. With bucket_cap_mb = 0.25, how many buckets?
P1_2 = None

# P2.1 · Lab 02 · ZeRO-2's bytes against DDP's
# Lab 02's simulator trains its MLP (widths 16, 32, 32, 8: three units of W and b, 1,864 float32 numbers) on 8
# workers. With ZeRO-2 (stage 2), how many bytes does worker 0 send in one step?
P2_1 = None

# P2.2 · Lab 02 · ZeRO-3's bytes
# The same MLP on the same 8 workers with ZeRO-3 (stage 3: the weights sharded too). How many bytes does
# worker 0 send in one step?
P2_2 = None

# P3.1 · Lab 03 · FSDP2's all-gathers per step
# FSDP2 wraps each of MiniGPT's 4 blocks, then the whole model (the root), with reshard_after_forward left at
# its default. How many all-gathers does one training step issue?
P3_1 = None

# P3.2 · Lab 03 · without resharding
# The same model with reshard_after_forward=False on every unit. How many all-gathers per step?
P3_2 = None

# P4.1 · Lab 04 · our FSDP's bytes per step
# Our FSDP on 4 ranks, each block a unit, then the root: each parameter cut along its rows, padded to a
# multiple of 4 rows (Lab 00 lists the shapes). How many bytes does one rank send in one step (all-gathers in
# forward and backward, reduce-scatters), in float32?
P4_1 = None

# P4.2 · Lab 04 · the peak without resharding
# The same FSDP on 4 ranks, with backward's prefetch (Exercise 4.3), but the blocks keep their gathered
# parameters after forward (reshard_after_forward=False). At the step's peak, how much more memory of
# parameters and gradients does one rank hold than with resharding? Count in blocks: one block's parameters
# gathered (111,456 float32 numbers, 445,824 bytes) count 1.
P4_2 = None

# P5.1 · Lab 05 · tensor parallelism's bytes
# MiniGPT with tensor parallelism on 2 ranks (no sequence parallelism), one step on its batch of 64 rows of 32
# tokens, hidden size 96, 4 blocks, float32: how many bytes does one rank send?
P5_1 = None

# P5.2 · Lab 05 · ring attention's bytes
# MiniGPT with context parallelism on 2 ranks (ring attention, load-balanced), one step on its batch (64 rows
# of 32 tokens, 4 heads of 24, 4 blocks, float32): how many bytes does one rank send?
P5_2 = None

# P6.1 · Lab 06 · 1F1B's bubble
# A 1F1B pipeline of p = 4 stages and m = 8 micro-batches, every forward and backward taking one unit of time
# each. What fraction of the stages' time is idle (the bubble), between 0 and 1?
P6_1 = None

# P6.2 · Lab 06 · what stage 0 holds
# In the same 1F1B pipeline (p = 4, m = 8), at most how many micro-batches does stage 0 hold at once (forward
# done, backward not yet)?
P6_2 = None

# P7.1 · Lab 07 · rank 5's tensor-parallel group
# Lab 07's mesh of 8 ranks, dp_replicate 2 x dp_shard 2 x cp 1 x tp 2, in that order (outermost first). Which
# ranks form rank 5's tp group? (a list of ranks, in order)
P7_1 = None

# P7.2 · Lab 07 · rank 5's shard group
# In the same mesh, which ranks does FSDP shard rank 5's parameters over (its dp_shard group)?
P7_2 = None
