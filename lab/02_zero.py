"""Lab 02's ZeRO model from the command line: memory and communication per device, by stage, and
the numpy simulation of ZeRO-1/2/3 on a small MLP. Plain Python and numpy; it never imports torch.

    python lab/02_zero.py memory --params 7.5e9 --dp 64      # the ZeRO paper's Table 1 model
    python lab/02_zero.py comm --params 7.5e9 --dp 64
    python lab/02_zero.py simulate --workers 4

The code lives in minigpt/runners/lab02_zero.py; see lab/02-zero-simulator.md.
"""

import sys

from minigpt.runners.lab02_zero import main

if __name__ == "__main__":
    sys.exit(main())
