"""Tensor, sequence and context parallelism written by hand (Lab 05), one concept a file.

* :mod:`.comm` - the conjugate operators: ``copy_to_tp`` / ``reduce_from_tp`` (Megatron's f and
  g) and, for sequence parallelism, ``gather_from_sequence`` / ``reduce_scatter_to_sequence``, on
  Lab 01's ring, with byte counters;
* :mod:`.layers` - column- and row-parallel linear layers, the vocabulary-parallel embedding (and
  the tied output layer), the vocabulary-parallel cross-entropy;
* :mod:`.model` - ``TPMiniGPT``: MiniGPT sliced over a tensor-parallel group, with or without
  sequence parallelism, its full state dict, and the bytes formula ``tp_bytes_per_step``;
* :mod:`.ring_attention` - context parallelism: causal attention with K/V blocks going round a
  ring, the online softmax, the load-balanced split.
"""

from minigpt.parallel.tensor_parallel.comm import (
    COUNTER,
    copy_to_tp,
    gather_from_sequence,
    reduce_from_tp,
    reduce_scatter_to_sequence,
    scatter_to_sequence,
)
from minigpt.parallel.tensor_parallel.layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    gather_logits,
    masked_mean_per_sentence,
    padded_vocab_size,
    vocab_parallel_cross_entropy,
)
from minigpt.parallel.tensor_parallel.model import TPMiniGPT, tp_bytes_per_step
from minigpt.parallel.tensor_parallel.ring_attention import (
    merge_sequence,
    ring_attention,
    ring_attention_bytes,
    split_sequence,
)

__all__ = [
    "COUNTER",
    "ColumnParallelLinear",
    "RowParallelLinear",
    "TPMiniGPT",
    "VocabParallelEmbedding",
    "copy_to_tp",
    "gather_from_sequence",
    "gather_logits",
    "masked_mean_per_sentence",
    "merge_sequence",
    "padded_vocab_size",
    "reduce_from_tp",
    "reduce_scatter_to_sequence",
    "ring_attention",
    "ring_attention_bytes",
    "scatter_to_sequence",
    "split_sequence",
    "tp_bytes_per_step",
    "vocab_parallel_cross_entropy",
]
