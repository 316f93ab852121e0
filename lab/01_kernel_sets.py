"""Lab 01's check under each kernel set this CPU supports (ATen, MKL and oneDNN held together at
AVX-512, at AVX2 and at their baseline): the worst step drift on every CPU a learner may own.

    python lab/01_kernel_sets.py --out out                     # about 6 minutes per kernel set here
    python lab/01_kernel_sets.py --out out --config sgd

The code lives in minigpt/runners/lab01_kernel_sets.py; see lab/01-ddp-from-scratch.md, section 7.
"""

import sys

from minigpt.runners.lab01_kernel_sets import main

if __name__ == "__main__":
    sys.exit(main())
