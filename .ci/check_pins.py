"""``make check-pins``: do the pins of constraints.txt install on every Python and system the course supports?

A learner's first command installs the course with pip (``make install`` runs ``pip install -c constraints.txt -e
".[test,notebooks,docs]"``) on *their* machine: Ubuntu 22.04's own Python 3.10, a Mac with Apple silicon, Windows. A
pin frozen on one Python may have no distribution on another (numpy 2.4 has no wheel for Python 3.10; pymdown-extensions
13 needs Python 3.11.5), and then that first command fails. This check asks pip's own resolver, for every Python of
:data:`PYTHONS` and every system of :data:`SYSTEMS`, what ``make install`` *would* install there, without installing
anything (``pip install --dry-run --only-binary=:all: --python-version 3.X --platform TAG``), and prints one line per
Python and system:

    ok    Python 3.10 · windows-amd64: 137 packages, every one pinned
    FAIL  Python 3.10 · linux-x86_64: ipython==9.18.1 (constraints.txt line 40) has no distribution for Python 3.10
          on linux-x86_64 (it needs Python >=3.11; the newest there is 8.39.0)

Three things make the answer the one a learner's pip would give:

* **The target's markers.** ``--python-version`` and ``--platform`` tell pip which wheels fit, but pip evaluates
  environment markers (``numpy==2.2.6; python_version < "3.11"``, torch's ``nvidia-...; platform_system ==
  "Linux"``, jupyter's ``pywin32; sys_platform == "win32"``) against the Python that *runs* it. So pip runs here with
  its marker environment replaced by the target's (:data:`PIP_WITH_TARGET_MARKERS`), and this script evaluates the
  markers of constraints.txt and pyproject.toml against the same environment. A version is checked at its first
  release (3.11 means 3.11.0, as on Debian 12's 3.11.2): a pin must install on every patch release.
* **PyPI, not this machine.** pip's configuration files (``PIP_CONFIG_FILE`` is set to the null device) and the
  ``PIP_*`` variables that add places to look (a local wheel folder, a mirror) are left out: ``--index-url`` names
  the one index asked, PyPI unless told otherwise.
* **Metadata, not downloads.** pip reads a wheel's dependencies with HTTP range requests (``--use-feature=fast-deps``)
  instead of downloading it: torch's Linux wheel alone is 527 MB, once per Python.

When a resolution fails, pip stops at the first pin it cannot satisfy: each pin its message names is asked alone
(``--no-deps``) to tell a pin with no distribution (named, with why and the newest version there) from pins that
disagree with each other (pip's conflict, quoted); the missing pin is left out and the resolution asked again, so one
run names every missing pin. A package pip would install but constraints.txt does not pin is named too: it would
install whatever version is newest that day. Exit status 0 when every pair resolves with every package pinned, 1
otherwise, 2 for bad input.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from minigpt import cli

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
PROG = ".ci/check_pins.py"
PYTHONS = ("3.10", "3.11", "3.12", "3.13", "3.14")  # pyproject.toml's requires-python says the same
EXTRAS = ("test", "notebooks", "docs")  # what make install installs: -e ".[test,notebooks,docs]"
PYPI = "https://pypi.org/simple"
OLDEST_GLIBC_MINOR = 28  # torch 2.13's Linux wheels are manylinux_2_28: glibc 2.28 or newer
OLDEST_MACOS = "14_0"  # torch 2.13's Mac wheels are macosx_14_0_arm64: macOS 14 (Sonoma) or newer
MAX_ROUNDS = 25  # resolutions per Python and system, each one after leaving out a missing pin
# where pip may be told to look for packages besides --index-url: left out, so that PyPI alone answers
PIP_VARIABLES_KEPT = {"PIP_CERT", "PIP_CLIENT_CERT", "PIP_PROXY", "PIP_TRUSTED_HOST", "PIP_DEFAULT_TIMEOUT"}
PIP_VARIABLES_KEPT |= {"PIP_RETRIES", "PIP_CACHE_DIR", "PIP_NO_CACHE_DIR"}


def manylinux(arch: str, oldest_minor: int = OLDEST_GLIBC_MINOR) -> tuple[str, ...]:
    """The wheel platform tags a Linux with glibc 2.``oldest_minor`` accepts: every ``manylinux_2_N`` up to it, and the
    legacy names of three of them (manylinux2014 = 2_17, manylinux2010 = 2_12, manylinux1 = 2_5). pip's
    ``--platform`` takes each tag literally, so all of them are passed."""
    tags = [f"manylinux_2_{minor}_{arch}" for minor in range(oldest_minor, 4, -1)]
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    return tuple(tags + [f"{name}_{arch}" for minor, name in legacy.items() if minor <= oldest_minor])


@dataclass(frozen=True)
class System:
    """A learner's operating system and processor: the wheel tags it accepts (pip's ``--platform``, one or more; a
    ``macosx_`` tag is widened by pip itself to the older macOS versions and ``universal2``) and the environment
    markers its Python reports."""

    name: str
    tags: tuple[str, ...]
    markers: dict = field(hash=False)


SYSTEMS = {
    "linux-x86_64": System(
        "linux-x86_64",
        manylinux("x86_64"),
        {"sys_platform": "linux", "platform_system": "Linux", "os_name": "posix", "platform_machine": "x86_64"},
    ),
    "linux-aarch64": System(
        "linux-aarch64",
        manylinux("aarch64"),
        {"sys_platform": "linux", "platform_system": "Linux", "os_name": "posix", "platform_machine": "aarch64"},
    ),
    "macos-arm64": System(
        "macos-arm64",
        (f"macosx_{OLDEST_MACOS}_arm64",),
        {"sys_platform": "darwin", "platform_system": "Darwin", "os_name": "posix", "platform_machine": "arm64"},
    ),
    "windows-amd64": System(
        "windows-amd64",
        ("win_amd64",),
        {"sys_platform": "win32", "platform_system": "Windows", "os_name": "nt", "platform_machine": "AMD64"},
    ),
}


def target_markers(python: str, system: System) -> dict[str, str]:
    """The environment markers of CPython ``python`` (its first release: "3.11" is 3.11.0) on ``system``."""
    full = f"{python}.0"
    return {
        **default_environment(),
        **system.markers,
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "implementation_version": full,
        "python_version": python,
        "python_full_version": full,
        "platform_release": "",
        "platform_version": "",
    }


# pip, with the marker environment of the target (argv[1], JSON) instead of this Python's; the rest of argv is pip's.
# pip evaluates every marker through its own copy of packaging, whose Marker.evaluate looks this function up each time.
PIP_WITH_TARGET_MARKERS = """
import json, sys
from pip._vendor.packaging import markers
target = json.loads(sys.argv[1])
markers.default_environment = lambda: dict(target)
from pip._internal.cli.main import main
sys.exit(main(sys.argv[2:]))
"""


@dataclass(frozen=True)
class Pin:
    """One line of constraints.txt: ``name==version``, maybe with a marker that says where it applies."""

    file: str
    line_number: int
    requirement: Requirement

    @property
    def name(self) -> str:
        return canonicalize_name(self.requirement.name)

    @property
    def version(self) -> str:
        return next(iter(self.requirement.specifier)).version

    @property
    def text(self) -> str:
        """``name==version`` as written, without its marker."""
        return f"{self.requirement.name}{self.requirement.specifier}"

    def applies(self, markers: dict[str, str]) -> bool:
        return self.requirement.marker is None or self.requirement.marker.evaluate(markers)


def read_pins(path: Path) -> list[Pin]:
    """Every pin of a constraints file; a line that is not ``name==version`` (with an optional marker) is bad input."""
    pins = []
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        try:
            requirement = Requirement(line)
        except InvalidRequirement as exc:
            raise cli.BadInput(f"{path.name} line {number}: {line!r} is not a requirement ({exc})") from None
        specs = list(requirement.specifier)
        if len(specs) != 1 or specs[0].operator != "==" or "*" in specs[0].version:
            raise cli.BadInput(f"{path.name} line {number}: {line!r} is not an exact pin; write name==version")
        pins.append(Pin(path.name, number, requirement))
    return pins


def pins_for(pins: list[Pin], markers: dict[str, str], path: Path) -> dict[str, Pin]:
    """The pins that apply where ``markers`` say, by package name; two that apply to one package are bad input."""
    chosen: dict[str, Pin] = {}
    for pin in pins:
        if not pin.applies(markers):
            continue
        if pin.name in chosen:
            other = chosen[pin.name]
            raise cli.BadInput(
                f"{path.name} lines {other.line_number} and {pin.line_number} both pin {pin.requirement.name} for "
                f"Python {markers['python_version']} on {markers['sys_platform']}; their markers must not overlap"
            )
        chosen[pin.name] = pin
    return chosen


def project_requirements(pyproject: Path, extras: tuple[str, ...], markers: dict[str, str]) -> list[str]:
    """What ``pip install -e ".[extras]"`` asks for: the project's dependencies and those of its extras, without
    the ones whose marker leaves them out on the target."""
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    optional = project.get("optional-dependencies", {})
    unknown = [e for e in extras if e not in optional]
    if unknown:
        raise cli.BadInput(
            f"--extras {','.join(unknown)}: pyproject.toml has no such extra; it has {', '.join(optional)}"
        )
    wanted = list(project.get("dependencies", [])) + [r for e in extras for r in optional[e]]
    kept = []
    for text in wanted:
        requirement = Requirement(text)
        if requirement.marker is None or requirement.marker.evaluate(markers):
            requirement.marker = None
            kept.append(str(requirement))
    return kept


@dataclass
class Outcome:
    """What pip said for one Python and system."""

    python: str
    system: str
    packages: int = 0
    missing: list[str] = field(default_factory=list)  # one sentence per pin with no distribution
    unpinned: list[str] = field(default_factory=list)  # "name version" that pip would install unpinned
    picked: list[str] = field(default_factory=list)  # "name==version" pip takes once the missing pins are left out
    conflict: str = ""  # pins that disagree (pip's words), or another failure of pip

    @property
    def ok(self) -> bool:
        return not (self.missing or self.unpinned or self.conflict)

    def lines(self) -> list[str]:
        where = f"Python {self.python} · {self.system}"
        if self.ok:
            return [f"ok    {where}: {self.packages} packages, every one pinned"]
        lines = [f"FAIL  {where}: {text}" for text in self.missing]
        if self.picked:
            lines.append(f"      {where}: with those left out, pip picks {', '.join(self.picked)}")
        if self.unpinned:
            lines.append(
                f"FAIL  {where}: pip would install {', '.join(self.unpinned)}, which constraints.txt does not pin"
            )
        if self.conflict:
            lines.append(f"FAIL  {where}: {self.conflict}")
        return lines


class Pip:
    """pip's resolver asked about one Python and system, against one index."""

    def __init__(self, python: str, system: System, index_url: str, fast_deps: bool = True):
        self.python, self.system, self.index_url, self.fast_deps = python, system, index_url, fast_deps
        self.markers = target_markers(python, system)

    def run(self, args: list[str], workdir: Path) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") or k in PIP_VARIABLES_KEPT}
        env |= {"PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PYTHONWARNINGS": "ignore"}
        target = ["--python-version", self.python, *(f"--platform={tag}" for tag in self.system.tags)]
        command = [sys.executable, "-c", PIP_WITH_TARGET_MARKERS, json.dumps(self.markers), "install", "--dry-run"]
        command += ["--ignore-installed", "--only-binary=:all:", *target, "--target", str(workdir / "target")]
        command += ["--index-url", self.index_url, "--no-input"]
        if self.fast_deps:
            command.append("--use-feature=fast-deps")
        proc = subprocess.run(command + args, capture_output=True, text=True, env=env, cwd=workdir)
        if self.fast_deps and proc.returncode != 0 and "fast-deps" in proc.stderr and "invalid" in proc.stderr:
            self.fast_deps = False  # a pip without the feature: whole wheels are downloaded to read their metadata
            return self.run(args, workdir)
        return proc

    def missing_reason(self, pin: Pin, workdir: Path) -> str | None:
        """Why ``pin`` alone cannot be installed here (None when it can): the versions that need another Python, and
        the newest version there is."""
        proc = self.run(["--no-deps", pin.text], workdir)
        if proc.returncode == 0:
            return None
        output = proc.stdout + proc.stderr
        why = []
        ignored = re.search(r"require a different python version: (.*)", output)
        needs = ignored and re.search(rf"(?:^|; ){re.escape(pin.version)} Requires-Python ([^;]+)", ignored.group(1))
        if needs:
            why.append(f"it needs Python {needs.group(1)}")
        available = re.search(r"\(from versions: ([^)]*)\)", output)
        versions = [] if not available or available.group(1) == "none" else available.group(1).split(", ")
        releases = [v for v in versions if not Version(v).is_prerelease]
        newest = max(releases, key=Version) if releases else None
        why.append(f"the newest there is {newest}" if newest else "no version of it installs there")
        return (
            f"{pin.text} ({pin.file} line {pin.line_number}) has no distribution for Python {self.python} on "
            f"{self.system.name} ({'; '.join(why)})"
        )


# what pip says when the index cannot be reached at all (no network, a proxy, a name that does not resolve)
UNREACHABLE = re.compile(r"NewConnectionError|Max retries exceeded|ConnectTimeout|Could not fetch URL|SSLError")


def named_in_failure(output: str) -> set[str]:
    """The packages a failed resolution names: the constraints of pip's conflict, and a requirement it found no
    version for."""
    names = re.findall(r"The user requested \(constraint\) ([A-Za-z0-9][A-Za-z0-9._-]*)", output)
    names += re.findall(r"Could not find a version that satisfies the requirement ([A-Za-z0-9][A-Za-z0-9._-]*)", output)
    return {canonicalize_name(n) for n in names}


def conflict_text(output: str) -> str:
    """pip's own account of a failed resolution, on one line: its ERROR lines and the conflict's cause."""
    lines = [line.strip() for line in output.splitlines()]
    cause = []
    if "The conflict is caused by:" in lines:
        start = lines.index("The conflict is caused by:") + 1
        cause = [line for line in lines[start:] if line][:6]
        cause = cause[: next((i for i, line in enumerate(cause) if line.startswith("To fix")), len(cause))]
    errors = [line.removeprefix("ERROR: ") for line in lines if line.startswith("ERROR:")]
    return "pip cannot resolve the pins: " + " | ".join(cause + errors[:2] or ["(no message; run pip by hand)"])


def check(python: str, system: System, pins: list[Pin], args) -> Outcome:
    """Resolve what make install asks for, for one Python and system; a missing pin is named and left out, and the
    resolution asked again, until it succeeds or fails for another reason."""
    outcome = Outcome(python, system.name)
    pip = Pip(python, system, args.index_url)
    applying = pins_for(pins, pip.markers, args.constraints)
    requirements = project_requirements(args.pyproject, args.extras, pip.markers)
    left_out: set[str] = set()
    with tempfile.TemporaryDirectory(prefix="check-pins-") as tmp:
        workdir = Path(tmp)
        for _ in range(MAX_ROUNDS):
            constraints = workdir / "constraints.txt"
            constraints.write_text("".join(f"{p.text}\n" for n, p in applying.items() if n not in left_out))
            report = workdir / "report.json"
            proc = pip.run(["--report", str(report), "-c", str(constraints), *requirements], workdir)
            if proc.returncode == 0:
                installed = json.loads(report.read_text(encoding="utf-8"))["install"]
                outcome.packages = len(installed)
                for item in installed:
                    name, version = item["metadata"]["name"], item["metadata"]["version"]
                    if canonicalize_name(name) not in applying:
                        outcome.unpinned.append(f"{name} {version}")
                    elif canonicalize_name(name) in left_out:
                        outcome.picked.append(f"{name}=={version}")
                return outcome
            output = proc.stdout + proc.stderr
            unreachable = UNREACHABLE.search(output)
            if unreachable:
                line = next(line for line in output.splitlines() if unreachable.group(0) in line)
                outcome.conflict = f"pip cannot reach {args.index_url}: {line.strip()[:200]}"
                return outcome
            missing = []
            for name in sorted(named_in_failure(output) & (applying.keys() - left_out)):
                reason = pip.missing_reason(applying[name], workdir)
                if reason:
                    missing.append(reason)
                    left_out.add(name)
            if not missing:
                outcome.conflict = conflict_text(output)
                return outcome
            outcome.missing += missing
    outcome.conflict = f"still failing after {MAX_ROUNDS} resolutions; fix the pins named above and run again"
    return outcome


def parse_args(argv: list[str] | None):
    parser = cli.ArgumentParser(
        prog=PROG, description=__doc__.split("\n\n")[0], formatter_class=cli.HelpFormatter, name=PROG
    )
    parser.add_argument(
        "--python", default=",".join(PYTHONS), help="the Python versions to ask about, comma-separated (3.X)"
    )
    parser.add_argument(
        "--system", default=",".join(SYSTEMS), help=f"the systems to ask about, comma-separated: {', '.join(SYSTEMS)}"
    )
    parser.add_argument(
        "--constraints", default=str(ROOT / "constraints.txt"), help="the pins (default: constraints.txt)"
    )
    parser.add_argument(
        "--pyproject",
        default=str(ROOT / "pyproject.toml"),
        help="whose dependencies to resolve (default: the course's; the tests give a one-package project)",
    )
    parser.add_argument("--extras", default=",".join(EXTRAS), help="the extras make install asks for, comma-separated")
    parser.add_argument("--index-url", default=PYPI, help="the package index to ask (a mirror of PyPI, say)")
    parser.add_argument("--jobs", type=cli.POSITIVE_INT, default=4, help="how many pips ask at once (they mostly wait)")
    args = parser.parse_args(argv)
    pythons = [p.strip() for p in args.python.split(",") if p.strip()]
    bad = [p for p in pythons if not re.fullmatch(r"3\.\d{1,2}", p)]
    if bad or not pythons:
        raise cli.BadInput(f"--python {args.python}: give versions as 3.X, comma-separated, e.g. {','.join(PYTHONS)}")
    systems = [s.strip() for s in args.system.split(",") if s.strip()]
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown or not systems:
        raise cli.BadInput(f"--system {args.system}: unknown system {','.join(unknown)!r}; use {', '.join(SYSTEMS)}")
    args.python, args.system = pythons, systems
    args.constraints = cli.input_file(args.constraints, "--constraints")
    args.pyproject = cli.input_file(args.pyproject, "--pyproject")
    args.extras = tuple(e.strip() for e in args.extras.split(",") if e.strip())
    return args


def pyproject_disagrees() -> list[str]:
    """Where pyproject.toml's requires-python and :data:`PYTHONS` disagree: it must admit every version checked
    here (at its first release) and neither the one before the first nor the one after the last, which nobody
    checked."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    spec = SpecifierSet(project.get("requires-python", ""))
    minors = [int(p.split(".")[1]) for p in PYTHONS]
    lines = [
        f"requires-python {spec} leaves out Python {p}, which the pins support"
        for p in PYTHONS
        if Version(f"{p}.0") not in spec
    ]
    for minor in (minors[0] - 1, minors[-1] + 1):
        if Version(f"3.{minor}.0") in spec:
            lines.append(f"requires-python {spec} admits Python 3.{minor}, which make check-pins does not check")
    return lines


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
        pins = read_pins(args.constraints)
        for python in args.python:  # bad pins (overlapping markers), unknown extras: refused before pip is asked
            for system in args.system:
                markers = target_markers(python, SYSTEMS[system])
                pins_for(pins, markers, args.constraints)
                project_requirements(ROOT / "pyproject.toml", args.extras, markers)
    except cli.BadInput as exc:
        return cli.refuse(PROG, str(exc))
    pairs = [(p, SYSTEMS[s]) for p in args.python for s in args.system]
    print(
        f"{PROG}: asking pip ({args.index_url}) about {len(pairs)} pairs of a Python and a system, installing nothing",
        flush=True,
    )
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        outcomes = list(pool.map(lambda pair: check(*pair, pins, args), pairs))
    disagreements = pyproject_disagrees()
    for outcome in outcomes:
        for line in outcome.lines():
            print(line, flush=True)
    for line in disagreements:
        print(f"FAIL  pyproject.toml: {line}")
    return 0 if all(o.ok for o in outcomes) and not disagreements else 1


if __name__ == "__main__":
    sys.exit(main())
