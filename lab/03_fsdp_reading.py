"""Lab 03, part 1: PyTorch's FSDP prefetch code, read from the installed torch with our notes beside it.

    python lab/03_fsdp_reading.py                 # the whole reading, in English
    python lab/03_fsdp_reading.py --lang es       # en español
    python lab/03_fsdp_reading.py --list          # sections and note keys
    python lab/03_fsdp_reading.py --check         # is every anchor still where the notes say?

The code lives in minigpt/runners/lab03_fsdp_reading.py; see lab/03-fsdp-prefetch.md.
"""

import sys

from minigpt.runners.lab03_fsdp_reading import main

if __name__ == "__main__":
    sys.exit(main())
