"""Lab 01's link measurements: α and β of this machine's link fitted from messages of four decades of
sizes, the ring all-reduce of Lab 01's buckets predicted and measured, and a hierarchical all-reduce on
two simulated nodes (the same sum, fewer bytes across nodes).

    torchrun --nproc_per_node=4 lab/01_links.py --out lab/results

The run is minigpt/runners/lab01_links.py; its tables, minigpt/pages/lab01_links.py.
"""

import sys

from minigpt.runners.lab01_links import main

if __name__ == "__main__":
    sys.exit(main())
