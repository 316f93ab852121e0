"""Lab 01's drift experiments: how one AdamW or SGD step amplifies a rounding difference, and which
weights make the drift of a given step of the two-rank run.

    python lab/01_drift.py --out lab/results                    # the one-step amplification table
    python lab/01_drift.py --sources 0,286 --out lab/results    # what makes steps 0 and 286 drift

The code lives in minigpt/runners/lab01_drift.py; see lab/01-ddp-from-scratch.md, section 7.
"""

import sys

from minigpt.runners.lab01_drift import main

if __name__ == "__main__":
    sys.exit(main())
