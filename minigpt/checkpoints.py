"""Checkpoints that are never lost: how the course writes a checkpoint, and how it reads one back.

A save can be interrupted at any moment: the process is killed (out of memory, a preempted job,
Ctrl-C), one rank of a distributed run dies, the disk fills up. Writing the new checkpoint over
the old one in place is the classic mistake: an interruption then leaves half of the new one and
none of the old, and a run of hours starts again from zero. The rule is **write beside, swap in
when complete**:

* **A file** (the trainer's ``out/minigpt.pt``). :func:`write_file` writes a temporary file in the
  same folder, ``minigpt.pt.<8 random characters>.tmp``, pushes it to the disk (``fsync``) and
  renames it over the real name with ``os.replace``. A rename within one file system is atomic:
  a reader finds the old file or the new one, never a mix.
* **A folder** (Lab 03's sharded checkpoint: one file per rank, an index, the full state dict).
  No call replaces a folder atomically (``os.replace`` refuses a non-empty target), so the swap
  takes two renames. :func:`new_folder` makes a sibling ``<name>.<8 random>.tmp/`` that every
  writer fills; :func:`commit_folder` writes the *completion marker* ``complete.json`` last (every
  file with its size and SHA-256), renames the old folder aside (``<name>.<8 random>.old``),
  renames the new one in, and removes the old. :func:`check_folder` refuses a folder without the
  marker (it was never finished) and one with a listed file missing, shorter or changed.

Where an interruption can land, and what it leaves (at the checkpoint's path; beside it):

1. before the marker is written: the previous checkpoint; an unfinished ``.tmp`` (no marker);
2. before the first rename: the previous checkpoint; the new one, complete, as ``.tmp``;
3. between the two renames: *nothing*; the previous one as ``.old``, the new one as ``.tmp``;
4. before the old one is removed: the new checkpoint; the previous one as ``.old``.

Case 3 is why a reader goes through :func:`recover`: when the path is missing, it renames
the newest *complete* leftover into place, finishing the swap. Every save starts with
:func:`recover` too, then removes the leftovers of earlier saves (:func:`leftovers`: only names of
this exact pattern, beside this checkpoint), so nobody ever cleans up by hand.

Two rules the scheme needs. One writer per checkpoint path at a time: a second saver would take
the first one's temporary files for leftovers. And ``fsync``: a killed process loses nothing that
reached the kernel, but a power cut loses what was not on the disk yet, so every file is synced
before the marker that vouches for it, and every folder after a rename in it.

No torch here (the callers hand in a function that writes): :func:`check_tensors` compares any
mapping of objects with ``.shape`` and ``.dtype``, a later lab's numpy state as well.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
import secrets
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import IO, Any

MARKER = "complete.json"  # written last into a folder checkpoint: the list of its files
FORMAT = "minigpt-folder-checkpoint-1"
_TOKEN = r"[a-z0-9_]{8}"  # tempfile's random part (and secrets.token_hex(4)): 8 characters


class CheckpointError(ValueError):
    """A checkpoint that cannot be read or is not consistent; ``str(exc)`` is one line naming the
    file and what is wrong (the command lines print it after ``prog: error:``, exit status 2)."""


# ----------------------------------------------------------------------------------------------
# Leftovers of interrupted saves


def leftovers(path: str | os.PathLike) -> list[Path]:
    """The temporary files and folders an interrupted save of ``path`` may have left beside it:
    ``<name>.<8 characters>.tmp`` (a new checkpoint being written) and ``<name>.<8 characters>.old``
    (the previous one, renamed aside during a folder swap). Nothing else is ever matched."""
    path = Path(path)
    pattern = re.compile(re.escape(path.name) + r"\." + _TOKEN + r"\.(tmp|old)")
    if not path.parent.is_dir():
        return []
    return sorted(p for p in path.parent.iterdir() if pattern.fullmatch(p.name))


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _fsync(path: Path) -> None:
    """Push a file, or a folder's list of names, to the disk (best effort for folders: not every
    system can open one)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        if path.is_dir():
            return
        raise
    try:
        os.fsync(fd)
    except OSError:
        if not path.is_dir():
            raise
    finally:
        os.close(fd)


# ----------------------------------------------------------------------------------------------
# A checkpoint that is one file


def write_file(path: str | os.PathLike, write: Callable[[IO[bytes]], Any]) -> Path:
    """Write the file checkpoint ``path`` with ``write(f)`` (e.g. ``lambda f: torch.save(state, f)``)
    into a temporary file beside it, then rename it into place. The leftovers of earlier
    interrupted saves of ``path`` are removed first. Returns ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in leftovers(path):
        _remove(stale)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)  # a kill skips this: the next save removes it
        raise
    _fsync(path.parent)
    return path


# ----------------------------------------------------------------------------------------------
# A checkpoint that is a folder


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _files(folder: Path) -> list[str]:
    """Every file under ``folder`` (hidden ones too), as sorted relative POSIX paths."""
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def new_folder(path: str | os.PathLike) -> Path:
    """Start a new folder checkpoint for ``path``: finish an interrupted swap (:func:`recover`),
    remove every other leftover, and make an empty ``<name>.<8 random>.tmp/`` beside ``path``
    for the writers to fill. Hand it to :func:`commit_folder` when everything is written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    recover(path)
    for stale in leftovers(path):
        _remove(stale)
    return Path(tempfile.mkdtemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp"))


def commit_folder(tmp: str | os.PathLike, path: str | os.PathLike) -> dict:
    """Seal the folder ``tmp`` (made by :func:`new_folder`, every file written and closed) and
    swap it in as ``path``: sync every file, write the marker, rename the old ``path`` aside,
    rename ``tmp`` in, remove the old. Returns the marker's content."""
    tmp, path = Path(tmp), Path(path)
    names = [n for n in _files(tmp) if n != MARKER]
    for name in names:
        _fsync(tmp / name)
    manifest = {
        "format": FORMAT,
        "files": {n: {"bytes": (tmp / n).stat().st_size, "sha256": _sha256(tmp / n)} for n in names},
    }
    with (tmp / MARKER).open("w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    for folder in sorted({(tmp / n).parent for n in names} | {tmp}, reverse=True):
        _fsync(folder)
    if path.exists():
        old = path.with_name(f"{path.name}.{secrets.token_hex(4)}.old")
        os.rename(path, old)  # from here until the next rename, nothing is at ``path``
        os.rename(tmp, path)
        _fsync(path.parent)
        shutil.rmtree(old)
    else:
        os.rename(tmp, path)
        _fsync(path.parent)
    return manifest


def check_folder(path: str | os.PathLike, required: Iterable[str] = ()) -> dict:
    """The marker of the folder checkpoint ``path``, after checking that the save finished (the
    marker is there and lists the ``required`` files) and that every file it lists is there with
    its size and SHA-256. CheckpointError, one line, otherwise."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: no checkpoint folder there")
    marker = path / MARKER
    if not marker.is_file():
        raise CheckpointError(
            f"{path}: no completion marker {MARKER}: the save that wrote this folder did not finish "
            f"(or an older version of the course wrote it); save it again"
        )
    try:
        manifest = json.loads(marker.read_text())
        files = manifest["files"]
        ok = manifest["format"] == FORMAT and all(
            isinstance(n, str)
            and not Path(n).is_absolute()
            and ".." not in Path(n).parts
            and isinstance(f["bytes"], int)
            and isinstance(f["sha256"], str)
            for n, f in files.items()
        )
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        ok = False
    if not ok:
        raise CheckpointError(f"{marker}: not a completion marker this course wrote (unreadable or another format)")
    for name in required:
        if name not in files:
            raise CheckpointError(f"{path}: its {MARKER} does not list {name}; this is not the checkpoint expected")
    for name, expected in files.items():
        file = path / name
        if not file.is_file():
            raise CheckpointError(f"{file}: missing (the checkpoint's {MARKER} lists it)")
        size = file.stat().st_size
        if size != expected["bytes"]:
            raise CheckpointError(
                f"{file}: {size} bytes where {MARKER} says {expected['bytes']} (truncated or overwritten)"
            )
        if _sha256(file) != expected["sha256"]:
            raise CheckpointError(f"{file}: its content differs from the SHA-256 in {MARKER} (corrupted)")
    return manifest


def recover(path: str | os.PathLike) -> Path | None:
    """The folder checkpoint to read for ``path``: ``path`` itself when it exists; when it does
    not, the newest complete leftover (a save was killed between its two renames: the new one,
    ``.tmp``, if its marker is there, else the previous one, ``.old``), renamed into place if this
    process may (else read where it is); None if there is no checkpoint at all."""
    path = Path(path)
    if path.exists():
        return path
    complete = []
    for candidate in leftovers(path):
        try:
            check_folder(candidate)
        except CheckpointError:
            continue
        complete.append(candidate)
    if not complete:
        return None
    # a .tmp with its marker is the newer of the two (the save wrote it after the .old's)
    newest = max(complete, key=lambda p: (p.suffix == ".tmp", (p / MARKER).stat().st_mtime_ns))
    try:
        os.rename(newest, path)
    except OSError:
        return newest
    _fsync(path.parent)
    return path


def replaceable(path: str | os.PathLike, also: Iterable[str] = ()) -> None:
    """Refuse (CheckpointError) to let a save replace ``path`` unless it is missing, empty, or
    holds only a checkpoint: the files its marker lists, the marker, and names matching the
    ``also`` patterns (files a caller adds beside its checkpoint, or an older layout of it).
    A folder of someone else's files is never swapped away."""
    path = Path(path)
    if not path.exists():
        return
    if not path.is_dir():
        raise CheckpointError(f"{path} is a file, not a checkpoint folder")
    try:
        listed = set(json.loads((path / MARKER).read_text())["files"]) | {MARKER}
    except (OSError, ValueError, TypeError, KeyError):
        listed = set()
    patterns = list(also)
    foreign = [n for n in _files(path) if n not in listed and not any(fnmatch.fnmatch(n, p) for p in patterns)]
    if foreign:
        raise CheckpointError(
            f"{path} holds files that are not part of a checkpoint ({', '.join(foreign[:3])}"
            f"{', ...' if len(foreign) > 3 else ''}); a new checkpoint replaces the whole folder, "
            f"so give another one"
        )


# ----------------------------------------------------------------------------------------------
# Bytes that depend on the content only


def canonical(obj: Any) -> Any:
    """``obj`` with every dict, list and tuple rebuilt and every string interned, for pickling.

    Pickle (under ``torch.save``) writes an object it has already written as a reference to the
    first copy, and "already written" means the same object in memory, not an equal one. So the
    same content pickles to different bytes depending on the process's history: a run resumed
    from a checkpoint holds the optimizer's keys (``"step"``, ``"lr"``) as strings read from the
    file, distinct objects, where a fresh run holds one shared string. Rebuilt this way, equal
    strings are one object and no container is shared, whatever came before: the bytes of a
    checkpoint depend on its content only. Tensors are left as they are (``torch.save`` names
    their storages by order of appearance, which the content fixes).
    """
    if isinstance(obj, str):
        return sys.intern(obj)
    if isinstance(obj, dict):
        rebuilt = type(obj)((canonical(k), canonical(v)) for k, v in obj.items())
        if hasattr(obj, "_metadata"):  # a module's state_dict carries its version numbers there
            rebuilt._metadata = canonical(obj._metadata)
        return rebuilt
    if isinstance(obj, list):
        return [canonical(v) for v in obj]
    if type(obj) is tuple:
        return tuple(canonical(v) for v in obj)
    return obj


# ----------------------------------------------------------------------------------------------
# Consistency of what a checkpoint holds


def _dtype_name(dtype: object) -> str:
    return str(dtype).removeprefix("torch.")


def check_tensors(
    where: str, found: object, expected: Mapping[str, Any], model: str = "the model its config describes"
) -> None:
    """Check that ``found`` maps exactly the names of ``expected`` to tensors of the same shape
    and dtype (anything with ``.shape`` and ``.dtype``). CheckpointError naming ``where``, the
    first tensor that differs and how (against ``model``, what ``expected`` comes from),
    otherwise."""
    if not isinstance(found, Mapping):
        raise CheckpointError(f"{where} is a {type(found).__name__}, not a dictionary of tensors")
    missing = [k for k in expected if k not in found]
    if missing:
        raise CheckpointError(
            f"{where} lacks {len(missing)} of the model's tensors, first {missing[0]!r} ({model} has {len(expected)})"
        )
    unknown = [k for k in found if k not in expected]
    if unknown:
        raise CheckpointError(f"{where} has {len(unknown)} tensors the model does not, first {unknown[0]!r}")
    for name, want in expected.items():
        got = found[name]
        if not (hasattr(got, "shape") and hasattr(got, "dtype")):
            raise CheckpointError(f"{where}: {name!r} is a {type(got).__name__}, not a tensor")
        if tuple(got.shape) != tuple(want.shape):
            raise CheckpointError(f"{where}: {name!r} has shape {tuple(got.shape)}, {model} needs {tuple(want.shape)}")
        if got.dtype != want.dtype:
            raise CheckpointError(
                f"{where}: {name!r} is {_dtype_name(got.dtype)}, {model} is {_dtype_name(want.dtype)}"
            )
