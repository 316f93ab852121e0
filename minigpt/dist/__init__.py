"""What really runs across processes: start-up (:mod:`launch`), collectives written by hand
(:mod:`ring`), the bucketed DDP (:mod:`ddp`) and the checks that a distributed run computes what
one process would (:mod:`equivalence`)."""
