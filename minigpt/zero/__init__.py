"""ZeRO on paper and in simulation: how much memory and communication each way of splitting
training costs.

``analytic`` holds the closed-form formulas (the ZeRO paper's memory and communication, the ring
collectives, activations, pipeline bubbles, hybrid-sharding degrees); ``pipeline`` simulates
pipeline schedules step by step; ``exact`` makes the model exact, to the byte, for one rank of a
real run. Nothing here imports torch: the package is plain Python (and numpy where it helps), so
its numbers come back at once.
"""
