"""How every entry point of the course refuses bad input and prepares the paths it writes.

A script checks everything it was given *before* it starts any work (before a process group
exists, before a model is built), and refuses what cannot work with one line and exit status 2:

    lab/01_ddp.py: error: --report out/lab01.json/x.json: out/lab01.json is a file, not a folder

Under ``torchrun`` every rank checks its own arguments, so every rank that refuses prints the
line with its rank (``[rank 1] lab/01_ddp.py: error: ...``), and it also hands the line to
torchrun: a worker that fails may leave a small JSON *error file* (torchrun names it in the
worker's ``TORCHELASTIC_ERROR_FILE``), and torchrun prints its content as the "traceback" of the
"Root Cause" at the bottom of its failure report. So the last lines a learner sees are ours, not
an empty "To enable traceback see: ..." under torchrun's own traceback.

Paths: :func:`output_file` and :func:`output_dir` check a path the script will write, without
writing anything; :func:`make_parents` creates the missing folders when the work starts. A missing
parent folder is created (as users expect); a path under a regular file, an existing folder
where a file is wanted (or a file where a folder is wanted), and a folder this process may not
write into are refused.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

# the --help epilog of every script started with torchrun
TORCHRUN_EPILOG = (
    "Bad input stops every rank before any work, with one line: 'PROG: error: --option VALUE: "
    "why'. Under torchrun that line comes first, then torchrun's own failure report (a "
    "traceback of torchrun itself, then a box): skip to the box's last lines, 'Root Cause "
    "(first observed failure)', whose 'traceback :' repeats our line with the rank that "
    "stopped first."
)


class BadInput(ValueError):
    """A value an entry point cannot work with; ``str(exc)`` is the line to print after
    ``prog: error:``, naming the value and what would be valid."""


def rank_prefix() -> str:
    """``"[rank r] "`` under a launcher that set ``RANK``, else ``""`` (a plain ``python`` run)."""
    rank = os.environ.get("RANK")
    return f"[rank {rank}] " if rank is not None and rank.strip() else ""


def refuse(prog: str, message: str) -> int:
    """Print ``prog: error: message`` on stderr (with this rank under torchrun), hand the same line
    to torchrun's failure report, and return the exit status 2 for ``main`` to return."""
    line = f"{rank_prefix()}{prog}: error: {message}"
    print(line, file=sys.stderr, flush=True)
    tell_torchrun(line)
    return 2


def tell_torchrun(line: str) -> None:
    """Write ``line`` where torchrun reads a failed worker's cause (``TORCHELASTIC_ERROR_FILE``,
    set only under torchrun). torchrun shows it in its report's "Root Cause" section; the
    timestamp lets it pick, among several failed ranks, the one that failed first."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    data = {"message": {"message": line, "extraInfo": {"py_callstack": line, "timestamp": str(int(time.time()))}}}
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(data))
    except OSError:
        pass  # the report is a courtesy: the line is already on stderr


# ----------------------------------------------------------------------------------------------
# Paths a script writes


def _first_existing(path: Path) -> Path:
    """``path`` or its nearest ancestor that exists (the folder new folders would be made in)."""
    current = path
    while not current.exists() and current != current.parent:
        current = current.parent
    return current


def _writable_folder(flag: str, value: str, folder: Path) -> None:
    """Refuse unless ``folder`` (an existing path) is a folder this process can create files in.
    The check really creates and removes a temporary file: permission bits do not tell (root
    ignores them, a read-only file system does not)."""
    if not folder.is_dir():
        raise BadInput(f"{flag} {value}: {folder} is a file, not a folder")
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise BadInput(
            f"{flag} {value}: the folder {folder} is not writable ({exc.strerror or exc}); "
            f"give a path in a folder you can write"
        ) from None


def output_file(value: str | os.PathLike, flag: str) -> Path:
    """Check a file a script will write (``--report``, a checkpoint): it may not be an existing
    folder, and the folder it goes in must exist and be writable or be creatable. Nothing is
    created; call :func:`make_parents` when the work starts."""
    path = Path(value)
    if str(value) == "" or path.name in ("", ".", ".."):
        raise BadInput(f"{flag} {str(value)!r}: give a file name, e.g. out/report.json")
    if path.is_dir():
        raise BadInput(f"{flag} {value}: is a folder; give a file name inside it, e.g. {path / 'report.json'}")
    _writable_folder(flag, str(value), _first_existing(path.parent.resolve()))
    return path


def output_dir(value: str | os.PathLike, flag: str) -> Path:
    """Check a folder a script will write into (``--out``, ``--trace-dir``): it may not be an
    existing file, and it must be writable or creatable. Nothing is created."""
    path = Path(value)
    if str(value) == "":
        raise BadInput(f"{flag} '': give a folder, e.g. out")
    if path.exists() and not path.is_dir():
        raise BadInput(f"{flag} {value}: is a file; give a folder (it is created if missing)")
    _writable_folder(flag, str(value), _first_existing(path.resolve()))
    return path


def input_file(value: str | os.PathLike, flag: str) -> Path:
    """Check a file a script will read: it must exist and be a file."""
    path = Path(value)
    if not path.exists():
        raise BadInput(f"{flag} {value}: no such file")
    if not path.is_file():
        raise BadInput(f"{flag} {value}: is a folder, not a file")
    return path


def make_parents(path: str | os.PathLike, is_dir: bool = False) -> Path:
    """Create the folders ``path`` needs (``path`` itself too when ``is_dir``); returns it."""
    path = Path(path)
    (path if is_dir else path.parent).mkdir(parents=True, exist_ok=True)
    return path
