"""One rank of the Lab 03 test launch: ``python tests/fsdp_worker.py OUTDIR LAB-ARGUMENTS...``
under RANK/WORLD_SIZE (started by tests/launcher.py, which spares the torchrun agent's start).

It runs the lab's own ``main`` (what ``lab/03_fsdp_prefetch.py`` runs) with the arguments given
and writes ``OUTDIR/rank<r>.json`` = ``{"exit_code": ...}``; the lab writes its report and trace
files where the arguments say.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from minigpt.runners.lab03_fsdp_prefetch import main

if __name__ == "__main__":
    outdir = Path(sys.argv[1])
    code = main(sys.argv[2:])
    (outdir / f"rank{os.environ.get('RANK', '0')}.json").write_text(json.dumps({"exit_code": code}))
    sys.exit(code)
