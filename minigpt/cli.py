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

Every rank checks *every* argument, the paths rank 0 alone will write included: a value refused
on one rank only would leave the others waiting for it in the rendezvous, then killed by torchrun
without a word.

What is checked, and where it is defined once for every script:

* **numbers** (:class:`Number`, with the common rules :data:`POSITIVE_INT`, :data:`SEED`,
  :data:`POSITIVE`, :data:`FRACTION`, :data:`SECONDS`, ...): the ``type=`` of an argparse option
  (text in, value out) and :meth:`Number.check` for a value that came another way (a config). Every
  number must be finite: ``nan`` and ``inf`` are refused, never silently compared;
* **argparse's own errors** (an unknown option, a choice not offered, a missing value): the
  :class:`ArgumentParser` of this module prints them as the same one line, not argparse's usage block;
* **the world size** (:func:`divisible_by_world`, :func:`need_world_size`);
* **the launcher's environment** (:func:`launcher_env`: ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
  ``MASTER_ADDR``, ``MASTER_PORT``), read by :func:`minigpt.parallel.launch.torchrun_env` before
  any process group exists;
* **paths**: :func:`output_file` and :func:`output_dir` check a path the script will write, without
  writing anything; :func:`make_parents` creates the missing folders when the work starts. A missing
  parent folder is created (as users expect); a path under a regular file, an existing folder
  where a file is wanted (or a file where a folder is wanted), and a folder this process may not
  write into are refused. :func:`input_file` and :func:`input_json` check what a script reads.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

# the --help epilog of every script started with torchrun
TORCHRUN_EPILOG = (
    "Bad input stops every rank before any work, with one line: 'PROG: error: --option VALUE: "
    "why'. Under torchrun that line comes first, then torchrun's own failure report (a "
    "traceback of torchrun itself, then a box): skip to the box's last lines, 'Root Cause "
    "(first observed failure)', whose 'traceback :' repeats our line with the rank that "
    "stopped first."
)


# under torchrun, how long a refusing rank waits at most for the other workers of its machine to say it
# too (times MINIGPT_TIME_SCALE): it goes on as soon as every one has
PEERS_GRACE_S = 10.0
# and at least this long when ranks run on other machines too, whose error files it cannot see
REMOTE_PEERS_S = 2.0


TIME_SCALE_VARIABLE = "MINIGPT_TIME_SCALE"


def positive_from_env(name: str, default: float, example: str) -> float:
    """The positive, finite number the environment variable ``name`` holds (``default`` when unset), or
    a ValueError that names the variable, its value and an ``example`` of a valid one."""
    text = os.environ.get(name) or str(default)
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise ValueError(f"{name}={text!r}: give a positive number, e.g. {example}")
    return value


def time_scale() -> float:
    """The factor every time limit of the course is multiplied by (``MINIGPT_TIME_SCALE``, 1 when
    unset): a slow or busy machine raises them all at once. A bad value is a ValueError that says so."""
    return positive_from_env(TIME_SCALE_VARIABLE, 1, "2")


class BadInput(ValueError):
    """A value an entry point cannot work with; ``str(exc)`` is the line to print after
    ``prog: error:``, naming the value and what would be valid."""


def rank_prefix() -> str:
    """``"[rank r] "`` under a launcher that set ``RANK`` to a rank, else ``""`` (a plain ``python``
    run, or a ``RANK`` that is no rank: :func:`launcher_env` says so)."""
    rank = os.environ.get("RANK", "").strip()
    return f"[rank {rank}] " if rank.isdigit() else ""


def refuse(prog: str, message: str) -> int:
    """Print ``prog: error: message`` on stderr (with this rank under torchrun), hand the same line
    to torchrun's failure report, and return the exit status 2 for ``main`` to return."""
    return stop(prog, message, 2)


def stop(prog: str, message: str, code: int = 1) -> int:
    """:func:`refuse`'s one line for a run that fails after it started (a diverged training:
    ``code`` 1); returns ``code``."""
    line = f"{rank_prefix()}{prog}: error: {message}"
    say_on_stderr(line)
    tell_torchrun(line)
    wait_for_peers()
    return code


def wait_for_peers() -> None:
    """Under torchrun, return once every worker of this machine has written its error file (each
    one that stops writes it, :func:`tell_torchrun`), or after :data:`PEERS_GRACE_S` seconds.

    torchrun stops every worker as soon as one exits: a peer that reaches the same check a few
    seconds later (still importing torch on a busy machine) would be killed before it prints its
    own line. torchrun gives worker ``k`` of this machine the file
    ``<log dir>/<run id>/attempt_<n>/<k>/error.json``, so the peers' files are this file's
    siblings; a peer that never stops (it waits in a collective) costs the whole grace. Peers on
    other machines write where this one cannot see: with any, it waits :data:`REMOTE_PEERS_S` too."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    world = os.environ.get("WORLD_SIZE", "1").strip()
    local = os.environ.get("LOCAL_WORLD_SIZE", world).strip()
    if not path or not (world.isdigit() and local.isdigit()) or int(world) < 2:
        return
    files = [Path(path).parent.parent / str(k) / Path(path).name for k in range(int(local))]
    try:
        grace = PEERS_GRACE_S * time_scale()
    except ValueError:  # a bad MINIGPT_TIME_SCALE: its own refusal says so
        grace = PEERS_GRACE_S
    start = time.monotonic()
    at_least = min(grace, REMOTE_PEERS_S) if int(world) > int(local) else 0.0
    while time.monotonic() - start < grace:
        if time.monotonic() - start >= at_least and all(f.exists() for f in files):
            return
        time.sleep(0.05)


def say_on_stderr(line: str) -> None:
    """``line`` and its newline on stderr in **one** write. The ranks of a run share one stderr;
    ``print`` writes the text and the newline apart, so two ranks failing at once could glue their
    lines together (``...not written yet)[rank 1] error: ...``), which no reader can take apart."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


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
# argparse, refusing our way


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors (an unknown option, a choice not offered, a value
    a ``type=`` refused, a missing argument) are refused like every other bad input: one line
    ``[rank r] NAME: error: --option VALUE: why``, torchrun's error file, exit 2; argparse would
    print its usage block first, without the rank. ``name`` is the script as the line names it
    (``lab/01_ddp.py``), where ``prog`` is how ``--help`` shows the command
    (``torchrun --nproc_per_node=N lab/01_ddp.py``); it defaults to ``prog``. Subcommands' parsers
    (``add_subparsers().add_parser``) are of this class too."""

    def __init__(self, *args, name: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.name = name or self.prog

    def error(self, message: str):
        raise SystemExit(refuse(self.name, argparse_message(message)))


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` with every option's default, said once: ``(default: X)`` is added to an option's
    help unless the help already says its default (the word ``default`` is in it) or there is none
    to say (``None``, or a flag's ``False``)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or action.default is None or action.default is False:
            return text
        return super()._get_help_string(action)


def plain(line: str) -> str:
    """A docstring line without its reStructuredText markup, for ``--help``:
    ``:class:`BucketedDDP``` -> ``BucketedDDP``, ````--check```` -> ``--check``."""
    return re.sub(r"``([^`]+)``", r"\1", re.sub(r":\w+:`~?([^`]+)`", r"\1", line))


def torchrun_parser(script: str, doc: str, nproc: str = "N") -> ArgumentParser:
    """The parser of a lab script started with torchrun: ``--help`` shows the command
    (``torchrun --nproc_per_node=N lab/01_ddp.py``), the first line of the runner's docstring, every
    default, and what to read in torchrun's failure report (:data:`TORCHRUN_EPILOG`); an error
    names the script."""
    return ArgumentParser(
        prog=f"torchrun --nproc_per_node={nproc} {script}",
        name=script,
        description=plain(doc.split("\n")[0]),
        formatter_class=HelpFormatter,
        epilog=TORCHRUN_EPILOG,
    )


def argparse_message(message: str) -> str:
    """argparse's ``argument --x: ...`` rewritten as ``--x VALUE: why; what is valid``."""
    found = re.fullmatch(r"argument ([^:]+): (.*)", message, flags=re.DOTALL)
    if not found:
        return message  # "unrecognized arguments: ...", "the following arguments are required: ..."
    flag, rest = found.group(1).split("/")[-1], found.group(2)
    choice = re.fullmatch(r"invalid choice: '(.*)' \(choose from (.*)\)", rest, flags=re.DOTALL)
    if choice:
        return f"{flag} {choice.group(1)}: not a choice; choose from {choice.group(2).replace(chr(39), '')}"
    kind = re.fullmatch(r"invalid (\w+) value: '(.*)'", rest, flags=re.DOTALL)
    if kind:
        return f"{flag} {kind.group(2)}: not a valid {kind.group(1)}"
    return f"{flag} {rest}"  # a Number's refusal starts with the value: "--seed -1: out of range; ..."


# ----------------------------------------------------------------------------------------------
# Numbers


@dataclass(frozen=True)
class Number:
    """The rule of a numeric option, defined once: an integer or a float, finite, within
    ``low``..``high`` (either end excluded when ``low_open`` / ``high_open``).

    * as argparse's ``type=`` it turns the text into the value or refuses it
      (``--seed -1: out of range; give an integer in 0..4294967295``);
    * :meth:`check` refuses a value that did not come from the command line (a config) the same way.

    ``unit`` is said with the range ("a positive number of seconds"), ``note`` after it
    ("0 turns clipping off").
    """

    kind: type = float
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    unit: str = ""
    note: str = ""

    def describe(self) -> str:
        """What is valid, in words: "a positive integer", "a number in [0, 1)", ..."""
        is_int = self.kind is int
        noun, unit = ("an integer" if is_int else "a number"), (f" of {self.unit}" if self.unit else "")
        low, low_open, high, high_open = self.low, self.low_open, self.high, self.high_open
        if is_int:  # integers: closed ends
            low, low_open = (None if low is None else math.floor(low) + 1 if low_open else math.ceil(low)), False
            high, high_open = (None if high is None else math.ceil(high) - 1 if high_open else math.floor(high)), False
        positive = low == 0 and low_open or (is_int and low == 1)
        if low is not None and high is not None:
            if is_int:
                text = f"an integer{unit} in {low}..{high}"
            elif positive:
                text = f"a positive number{unit} {'below' if high_open else 'up to'} {high:g}"
            else:
                text = f"a number{unit} in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        elif low is not None:
            if positive:
                text = f"a positive {'integer' if is_int else 'number'}{unit}"
            else:
                text = f"{noun}{unit} {'>' if low_open else '>='} {low:g}"
        elif high is not None:
            text = f"{noun}{unit} {'<' if high_open else '<='} {high:g}"
        else:
            text = f"a finite {'integer' if is_int else 'number'}{unit}"
        return f"{text} ({self.note})" if self.note else text

    def problem(self, value) -> str | None:
        """Why ``value`` is refused ("not finite", "negative", ...), or None if it is valid."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"not {'an integer' if self.kind is int else 'a number'}"
        if self.kind is int and not float(value).is_integer():
            return "not an integer"
        if math.isnan(value):
            return "not a number"
        if math.isinf(value):
            return "not finite"
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            if value < 0 <= self.low:
                return "negative"
            return "zero" if value == 0 else "too small"
        if self.high is not None and (value > self.high or (self.high_open and value == self.high)):
            return "too large"
        return None

    def parse(self, text: str):
        """The value of ``text`` (int or float), or :class:`BadInput` with the line's end."""
        try:
            value = int(text) if self.kind is int else float(text)
        except (TypeError, ValueError):
            try:  # an integer written as a float ("2.5", "1e3") is not an integer; "abc" is not a number
                float(text)
                why = "not an integer"
            except (TypeError, ValueError):
                why = "not an integer" if self.kind is int else "not a number"
            raise BadInput(f"{text}: {why}; give {self.describe()}") from None
        why = self.problem(value)
        if why:
            raise BadInput(f"{text}: {why}; give {self.describe()}")
        return value

    def __call__(self, text: str):
        """argparse's ``type=``: :meth:`parse`, its refusal as argparse's error."""
        try:
            return self.parse(text)
        except BadInput as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    def check(self, flag: str, value):
        """``value`` if it is valid, else :class:`BadInput` ``"--flag VALUE: why; give ..."``."""
        why = self.problem(value)
        if why:
            raise BadInput(f"{flag} {value}: {why}; give {self.describe()}")
        return value


POSITIVE_INT = Number(int, low=1)
NON_NEGATIVE_INT = Number(int, low=0)
SEED = Number(int, low=0, high=2**32 - 1)  # what numpy's generators accept, and torch's
POSITIVE = Number(float, low=0, low_open=True)
NON_NEGATIVE = Number(float, low=0)
FRACTION = Number(float, low=0, high=1, high_open=True)  # [0, 1): dropout, momentum
# a collective's or a subprocess's time limit: finite (a timedelta of inf overflows), at most ~11 days
SECONDS = Number(float, low=0, high=1e6, low_open=True, unit="seconds")
MIB = Number(float, low=0, high=1e6, low_open=True, unit="MiB")  # a bucket cap, up to ~1 TB


# ----------------------------------------------------------------------------------------------
# The world size and the launcher's environment

LAUNCHER_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE")


def divisible_by_world(flag: str | None, value: int, world_size: int, what: str = "the global batch") -> None:
    """Refuse ``value`` rows that cannot be cut evenly over ``world_size`` ranks. ``flag`` names the
    option that set it; None when the script fixes it, and then the world size is what to change."""
    if value % world_size == 0:
        return
    if flag:
        raise BadInput(
            f"{flag} {value} is not divisible by the world size {world_size}; use a multiple of {world_size}"
        )
    divisors = ", ".join(str(d) for d in range(1, min(value, 16) + 1) if value % d == 0)
    raise BadInput(
        f"WORLD_SIZE={world_size}: {what} of {value} is not divisible by the world size {world_size}; "
        f"use a world size that divides {value} ({divisors}, ...)"
    )


def need_world_size(world_size: int, least: int, why: str) -> None:
    """Refuse a world smaller than ``least`` ranks (a plain ``python`` start is a world of one)."""
    if world_size < least:
        given = f"WORLD_SIZE={world_size}" if "WORLD_SIZE" in os.environ else "world size 1 (a plain python start)"
        raise BadInput(f"{given}: {why}; start it with torchrun --nproc_per_node={max(least, 2)} (or more)")


def _env_int(name: str, low: int, high: int | None, valid: str, environ) -> int:
    text = environ[name]
    try:
        value = int(text.strip())
    except ValueError:
        raise BadInput(f"{name}={text}: not an integer; {valid}") from None
    if value < low:
        raise BadInput(f"{name}={text}: below {low}; {valid}")
    if high is not None and value > high:
        raise BadInput(f"{name}={text}: above {high}; {valid}")
    return value


def launcher_env(environ=None) -> tuple[int, int, int]:
    """``(rank, local_rank, world_size)`` from the launcher's environment, every variable checked
    before any process group exists; ``(0, 0, 1)`` when none is set (a plain ``python`` start).

    ``WORLD_SIZE`` is a positive integer, ``RANK`` and ``LOCAL_RANK`` are in ``0..WORLD_SIZE-1``,
    ``MASTER_PORT`` (when set) is a port in 1..65535 and ``MASTER_ADDR`` (when set) is not empty.
    :class:`BadInput` names the variable and its value otherwise."""
    environ = os.environ if environ is None else environ
    present = [n for n in LAUNCHER_VARIABLES if n in environ]
    if not present:
        return 0, 0, 1
    missing = [n for n in LAUNCHER_VARIABLES if n not in environ]
    if missing:
        raise BadInput(f"{', '.join(present)} set but {', '.join(missing)} missing: start the script with torchrun")
    started = "torchrun sets it; unset RANK, LOCAL_RANK and WORLD_SIZE to run as one process"
    world_size = _env_int("WORLD_SIZE", 1, None, f"the number of processes is a positive integer ({started})", environ)
    ranks = f"the ranks of a world of {world_size} are 0..{world_size - 1} ({started})"
    rank = _env_int("RANK", 0, world_size - 1, ranks, environ)
    local_rank = _env_int("LOCAL_RANK", 0, world_size - 1, ranks, environ)
    if "MASTER_PORT" in environ:
        _env_int("MASTER_PORT", 1, 65535, "give a port in 1..65535, e.g. torchrun --master_port=29500", environ)
    if "MASTER_ADDR" in environ and not environ["MASTER_ADDR"].strip():
        raise BadInput(
            f"MASTER_ADDR={environ['MASTER_ADDR']!r}: empty; give the host name or address of rank 0's machine, "
            f"e.g. 127.0.0.1"
        )
    return rank, local_rank, world_size


# ----------------------------------------------------------------------------------------------
# Where the ranks run (decided by minigpt.parallel.launch.place)

DEVICES = ("auto", "cpu", "cuda")
DEVICE_VARIABLE = "MINIGPT_DEVICE"  # the device when --device is not given (make demo DEVICE=cpu sets it)


def add_device_flag(p: argparse.ArgumentParser) -> None:
    """``--device auto|cpu|cuda``, the same on every lab script."""
    p.add_argument(
        "--device",
        choices=DEVICES,
        default=None,
        help="auto: one GPU per rank when this machine has as many GPUs as ranks, else every rank on the CPU "
        f"(gloo); cpu; cuda: one GPU per rank, or a refusal (default: ${DEVICE_VARIABLE}, else auto)",
    )


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


def input_json(value: str | os.PathLike, flag: str, keys: tuple[str, ...], example: str) -> Path:
    """Check a results file a script will read (``--render``): an existing file holding a JSON
    object with ``keys`` (what a result of this script has); ``example`` names a valid one."""
    path = input_file(value, flag)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise BadInput(
            f"{flag} {value}: not a JSON file ({why}); give a result of this script, e.g. {example}"
        ) from None
    missing = [k for k in keys if not isinstance(data, dict) or k not in data]
    if missing:
        raise BadInput(
            f"{flag} {value}: not a result of this script (no {', '.join(map(repr, missing))}); give e.g. {example}"
        )
    return path


def make_parents(path: str | os.PathLike, is_dir: bool = False) -> Path:
    """Create the folders ``path`` needs (``path`` itself too when ``is_dir``); returns it."""
    path = Path(path)
    (path if is_dir else path.parent).mkdir(parents=True, exist_ok=True)
    return path
