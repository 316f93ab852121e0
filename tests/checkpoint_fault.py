"""Test-only (tests/test_checkpoints.py): lab/03_fsdp_practice.py with one rank killed in the middle
of the sharded save.

    python tests/checkpoint_fault.py KILL_RANK [lab arguments ...]    (every rank, via start_ranks)

On rank KILL_RANK, DCP's ``FileSystemWriter.write_data`` (the call that writes this rank's shard
file, a public method of DCP's storage-writer interface) is wrapped: the shard is written, then
the process sends itself SIGKILL before it reports back to the coordinator, so the index
(``.metadata``) is never written and the full state dict is never saved. That is the moment the
issue measured (``.distcp`` files, no ``.metadata``). The fault lives here only: nothing in
``minigpt/`` knows about it.
"""

from __future__ import annotations

import os
import signal
import sys

from torch.distributed.checkpoint import FileSystemWriter

from minigpt.runners.lab03_fsdp_practice import main


def write_then_die(original):
    def write_data(self, plan, planner):
        original(self, plan, planner).wait()  # this rank's shard file is on disk ...
        os.kill(os.getpid(), signal.SIGKILL)  # ... and the rank dies before anyone hears of it

    return write_data


if __name__ == "__main__":
    kill_rank, lab_args = sys.argv[1], sys.argv[2:]
    if os.environ.get("RANK") == kill_rank:
        FileSystemWriter.write_data = write_then_die(FileSystemWriter.write_data)
    sys.exit(main(lab_args))
