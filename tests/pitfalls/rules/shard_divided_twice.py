"""Exercise 2.2: The summed shard divided by N again: Adam almost cancels it, the bits do not."""

from __future__ import annotations

from minigpt.zero import simulate


def zero2_step(c, xs, ys, rows, step):
    adam = c.adam_update

    def averaged_again(w, u, weights, where, grad, step):
        adam(w, u, weights, where, grad / c.n, step)  # Mistake: the summed shard divided by N a second time

    c.adam_update = averaged_again
    try:
        return simulate.zero2_step(c, xs, ys, rows, step)
    finally:
        del c.adam_update  # the cluster's own method again
