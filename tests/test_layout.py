"""The package's rooms: named for what they hold, data flowing one way, and CONTRIBUTING.md true to
the files.

* no source folder is named like build output (``dist``, ``build``, ...), which tools skip;
* mechanisms (``parallel``, ``zero``, ``fsdp``) never import a runner or a page module, page
  modules never import a runner, and the core never imports any of them;
* every lab script runs the runner named after it, and every runner has its script;
* CONTRIBUTING.md's layout table names every script, runner and page module;
* CONTRIBUTING.md's table of the suite's time lists exactly the test files that exist (the times are
  measured on a quiet machine and not checked: only that no file is missing or invented);
* every make target that ``.PHONY`` or ``make help`` names has a rule;
* the code reads in the present tense: every module docstring is at most 40 lines, and no docstring
  or comment tells the code's history (:data:`HISTORY_PATTERNS`).

No torch here: the imports are read from the source (``ast``), not executed.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "minigpt"
OUTPUT_NAMES = {"dist", "build", "out", "site", "_build", "target", "wheelhouse", "htmlcov"}
CORE = ("model", "grammar", "lexicon", "train", "tutor")
ROOMS = {"parallel": "mechanisms", "zero": "mechanisms", "fsdp": "mechanisms", "runners": "runners", "pages": "pages"}


def room_of(path: Path) -> str:
    """core, mechanisms, runners, pages or shared (cli, impl, checkpoints) for a module of the package."""
    parts = path.relative_to(PACKAGE).parts
    if len(parts) > 1:
        return ROOMS[parts[0]]
    return "core" if path.stem in CORE else "shared"


def imported_modules(path: Path) -> set[str]:
    """Every ``minigpt...`` module the file imports, at any depth (``from minigpt.pages import
    lang`` counts as ``minigpt.pages.lang``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return {name for name in found if name.split(".")[0] == "minigpt"}


def room_of_name(name: str) -> str | None:
    parts = name.split(".")
    if len(parts) < 2:
        return None
    if parts[1] in ROOMS:
        return ROOMS[parts[1]]
    return "core" if parts[1] in CORE else "shared" if parts[1] in ("cli", "impl", "checkpoints") else None


MODULES = sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)
FORBIDDEN = {
    "core": {"mechanisms", "runners", "pages"},
    "shared": {"mechanisms", "runners", "pages"},
    "mechanisms": {"runners", "pages"},
    "pages": {"runners"},
    "runners": set(),
}


def test_no_source_folder_is_named_like_build_output():
    files = [p for top in ("minigpt", "lab", "tests", "notebooks") for p in (ROOT / top).rglob("*") if p.is_file()]
    folders = {folder for p in files if "__pycache__" not in p.parts for folder in p.relative_to(ROOT).parents}
    named = sorted(str(f) for f in folders if f.name in OUTPUT_NAMES)
    assert named == [], f"source folders named like build output (tools skip them): {named}"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_data_flows_one_way(path):
    room = room_of(path)
    wrong = sorted(name for name in imported_modules(path) if room_of_name(name) in FORBIDDEN[room])
    assert wrong == [], f"{path.relative_to(ROOT)} ({room}) imports {wrong}: {room} may not import {FORBIDDEN[room]}"


def lab_scripts() -> dict[str, Path]:
    """``lab01_ddp`` -> ``lab/01_ddp.py`` for every lab script."""
    return {f"lab{p.stem}": p for p in sorted((ROOT / "lab").glob("[0-9][0-9]_*.py"))}


def test_every_lab_script_runs_the_runner_named_after_it():
    scripts = lab_scripts()
    runners = {p.stem for p in (PACKAGE / "runners").glob("lab*.py")}
    assert set(scripts) == runners, (
        f"scripts without a runner: {set(scripts) - runners}; runners without a script: {runners - set(scripts)}"
    )
    for name, script in scripts.items():
        imports = imported_modules(script)
        assert imports == {f"minigpt.runners.{name}", f"minigpt.runners.{name}.main"}, (
            f"{script.relative_to(ROOT)} should only import main from minigpt.runners.{name}, imports {imports}"
        )


def test_contributing_names_every_script_runner_and_page_module():
    text = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    table = text[text.index("## Where each lab lives") : text.index("## The package, room by room")]
    named = set(re.findall(r"`([\w./]+\.py)`", table))
    scripts = {p.name for p in lab_scripts().values()}
    runners = {p.name for p in (PACKAGE / "runners").glob("lab*.py")}
    pages = {p.name for p in (PACKAGE / "pages").glob("*.py")} - {"__init__.py", "__main__.py", "lang.py"}
    for kind, files in (("lab script", scripts), ("runner", runners), ("page module", pages)):
        missing = sorted(files - named)
        assert missing == [], f"CONTRIBUTING.md's table does not name the {kind}s {missing}"
    for path in re.findall(r"`(minigpt/[\w/]+\.py)`", table):
        assert (ROOT / path).is_file(), f"CONTRIBUTING.md names {path}, which does not exist"


def test_contributing_times_exactly_the_test_files_that_exist():
    text = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    section = text[text.index("## The suite's time") : text.index("## The proof harness")]
    assert "| test file | seconds | share |" in section, "CONTRIBUTING.md has no table of each test file's time"
    table = section[section.index("| test file |") : section.index("| all |")]
    listed = re.findall(r"^\| `(tests/[\w/]+\.py)` \|", table, flags=re.M)
    existing = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py"))
    assert len(listed) == len(set(listed)), f"a test file is listed twice: {sorted(listed)}"
    missing, invented = sorted(set(existing) - set(listed)), sorted(set(listed) - set(existing))
    assert missing == [] and invented == [], (
        f"CONTRIBUTING.md's durations table misses {missing} and names files that do not exist {invented}; "
        "rerun `pytest --durations=0` and `python .ci/durations.py LOG`"
    )
    slowest = section[section.index("slowest tests") :]
    for nodeid in re.findall(r"^\| `(tests/[\w/]+\.py)::", slowest, flags=re.M):
        assert nodeid in existing, f"the slowest tests name {nodeid}, which does not exist"


def test_every_make_target_named_has_a_rule():
    """Every target that `.PHONY` or `make help` names has a rule of its own. A phony target without one
    does nothing and exits 0: `make test-fast` would print "Nothing to be done" where CONTRIBUTING tells
    contributors to run it."""
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    phony = set(re.search(r"^\.PHONY:(.*)$", text, flags=re.M).group(1).split())
    advertised = set(re.findall(r'^\t@echo "make ([\w-]+)', text, flags=re.M))
    ruled = set(re.findall(r"^([\w-]+):(?!=)", text, flags=re.M))
    assert advertised <= phony, f"make help names targets that .PHONY does not: {sorted(advertised - phony)}"
    assert phony <= ruled, f"the Makefile names targets with no rule: {sorted(phony - ruled)}"


def package_imports() -> dict[str, set[str]]:
    """module -> the package's modules it imports, at the top or inside a function (``from pkg import sub``
    is an import of the submodule ``pkg.sub``, not of the package's ``__init__``)."""
    names = {}
    for path in MODULES:
        parts = path.relative_to(ROOT).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in names.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the module's package
                    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                    base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in names else base for a in node.names]
            else:
                continue
            for target in targets:
                while target and target not in names:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    deps.add(target)
        graph[name] = deps
    return graph


def test_no_import_circle_in_the_package():
    """No module of the package imports, directly or through others, a module that imports it back: not at
    the top, not inside a function (an import inside a function hides a circle; it does not remove it)."""
    graph = package_imports()
    circles = []
    for start in graph:
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for dep in graph[node]:
                if dep == start:
                    circles.append(" -> ".join(path + [start]))
                elif dep not in seen:
                    seen.add(dep)
                    stack.append((dep, path + [dep]))
    assert circles == [], "import circles:\n" + "\n".join(sorted(set(circles))[:10])


# ----------------------------------------------------------------------------------------------
# Code that reads in the present tense

DOCSTRING_MAX_LINES = 40  # a longer story goes on the lab page the module points to
PRESENT_TENSE_FILES = sorted(
    p
    for folder, pattern in (("minigpt", "**/*.py"), ("tests", "**/*.py"), ("lab", "*.py"), (".ci", "*.py"))
    for p in (ROOT / folder).glob(pattern)
    if "__pycache__" not in p.parts
)
# Sentences that tell the code's history (a past version's timing, what it used to do) instead of what it
# does and why: history belongs in commit messages. Matched without case, across line breaks.
HISTORY_PATTERNS = (
    r"\bwent from\b",  # "a grading of every lab went from 26.8 to 20.5 s of CPU"
    r"\b(was|were|took) (about )?[0-9.]+ ?(s|ms|min|minutes|seconds)\b",  # "(was 12 s)", "took 21 s"
    r"\b[0-9.]+ ?(s|min) (of CPU )?(less|saved)\b",  # "about 3 s of CPU less per kernel"
    r"\bused to (be|take|cost|do|run|need|spend|start|import|print)\b",  # "what the page used to do"
    r"\b(an?|the) (earlier|previous|old|older) (version|implementation)\b",  # "an earlier version of ..."
    r"\bbefore (this|the) (change|server|rewrite|refactor|fix|cut)\b",  # "before this server, every ..."
    r"\bas before\b",  # "each rank is a fresh process as before"
    r"\b(formerly|originally)\b",
    r"\b(faster|slower|cheaper|less|more) than (before|it was|it used to)\b",
    r"\b20\d\d-\d\d-\d\d\b[^.;]{0,40}\b[0-9.]+ ?(s|min)\b",  # a dated timing: "2026-11-20: 9 min 40 s"
)
HISTORY = re.compile("|".join(f"(?:{p})" for p in HISTORY_PATTERNS), flags=re.IGNORECASE)


def module_docstring(source: str) -> str | None:
    """The module's docstring as ``ast.get_docstring(clean=False)`` gives it, read from the file's first
    tokens: a string statement before any other code."""
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in (tokenize.COMMENT, tokenize.NL):
            return ast.literal_eval(token.string) if token.type == tokenize.STRING else None
    return None


def docstrings_and_comments(source: str) -> list[tuple[int, str]]:
    """(line, text) for every docstring of a module, class or function, and every comment with the
    full-line comments that follow it (one text, so that a phrase wrapped across comment lines is
    found); the whitespace of each text collapsed to single spaces."""
    texts = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                texts.append((node.body[0].lineno, " ".join(doc.split())))
    last = 0  # the line of the comment the current text ends with
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            words = " ".join(token.string.lstrip("#").split())
            line = token.start[0]
            if line == last + 1 and token.line.lstrip().startswith("#"):
                texts[-1] = (texts[-1][0], f"{texts[-1][1]} {words}")
            else:
                texts.append((line, words))
            last = line
    return texts


def history_in(source: str) -> list[tuple[int, str]]:
    """(line, quote) for every match of :data:`HISTORY` in the docstrings and comments of ``source``.
    Every such text is a piece of the source with its ``#`` and line breaks taken out, so a file whose
    source so flattened matches nothing (most files) is not parsed."""
    if not HISTORY.search(" ".join(source.replace("#", " ").split())):
        return []
    return [
        (line, text[max(match.start() - 40, 0) : match.end() + 40])
        for line, text in docstrings_and_comments(source)
        for match in HISTORY.finditer(text)
    ]


def test_module_docstrings_are_at_most_40_lines():
    """A module docstring says what the module is and why in at most :data:`DOCSTRING_MAX_LINES` lines;
    the long story of a teaching module is on its lab page, the details of one function in that
    function's docstring."""
    long = []
    for path in PRESENT_TENSE_FILES:
        doc = module_docstring(path.read_text(encoding="utf-8"))
        # the lines of the file it takes, its quotes included: a closing quote on a line of its own counts
        lines = len(doc.splitlines()) + doc.endswith("\n") if doc else 0
        if lines > DOCSTRING_MAX_LINES:
            long.append(f"{path.relative_to(ROOT)}: {lines} lines")
    assert long == [], f"module docstrings over {DOCSTRING_MAX_LINES} lines:\n" + "\n".join(long)


def test_no_docstring_or_comment_tells_the_code_s_history():
    """No docstring or comment of minigpt/, tests/, lab/*.py or .ci/ matches one of
    :data:`HISTORY_PATTERNS`: a past version's timing ("went from 26.8 to 20.5 s", "(was 12 s)", "took
    21 s", "3 s of CPU less"), what the code used to do, "an earlier version", "before this change",
    "as before", "formerly", "faster than before", a dated timing. A measured reason stays when it is a
    fact of today's code, in the present tense ("importing torch takes about 2 s of CPU, so the ranks
    are forked"). This file is left out: it quotes what the patterns catch."""
    found = [
        f"{path.relative_to(ROOT)}:{line}: ...{quote}..."
        for path in PRESENT_TENSE_FILES
        if path != Path(__file__).resolve()
        for line, quote in history_in(path.read_text(encoding="utf-8"))
    ]
    assert found == [], "history in docstrings or comments (say what the code does, now):\n" + "\n".join(found)


@pytest.mark.parametrize(
    ("text", "history"),
    [
        ("a grading of every lab went from 26.8 to 20.5 s of CPU", True),
        ("before this server every process paid it once more", True),
        ("An earlier version of the launcher forked nothing", True),
        ("the resume test took 21 s on two threads (was 10 s)", True),
        ("torch already imported; about 3 s of CPU less per kernel", True),
        ("fully_shard(model)  # what the page used to do", True),
        ("# measured 2026-11-20 on the two-core machine: 9 min 40 s", True),
        ("equal on paper, no longer FSDP2's norm to the bit", False),
        ("importing torch takes about 1.7 s of CPU, so the ranks are forked", False),
        ("the previous checkpoint is untouched, and the next save removes the leftovers", False),
        ("DeepSpeed's main branch of 2026-08-22 (commit edaa722); the figures are per node", False),
        ("Collective: every rank must call it. Used to check the run against one process.", False),
    ],
)
def test_the_history_patterns_catch_history_and_only_history(text, history):
    assert bool(HISTORY.search(text)) == history, f"{text!r}: {HISTORY.search(text)}"


# ----------------------------------------------------------------------------------------------
# One home for every bound and digest; runners that stand alone

BOUND_NAME = re.compile(r"^[A-Z0-9_]*(BOUND|TOLERANCE|TOL)[A-Z0-9_]*$")


def test_bounds_and_digests_live_in_the_proof_s_room():
    """Every bound a run is held to is a constant of minigpt/parallel/ (``bounds.py``), and every digest
    of a state is :func:`minigpt.parallel.equivalence.digest`: no runner or page module names a bound of
    its own or hashes tensors."""
    found = []
    for path in MODULES:
        if room_of(path) not in ("runners", "pages"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
                found += [f"{path.relative_to(ROOT)}:{node.lineno}: {n}" for n in names if BOUND_NAME.match(n)]
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                found += [f"{path.relative_to(ROOT)}:{node.lineno}: imports hashlib" for m in modules if m == "hashlib"]
    assert found == [], "bounds or digests outside minigpt/parallel/:\n" + "\n".join(found)


def test_no_runner_imports_another():
    """A runner imports the mechanisms, the shared modules and ``entry`` (every lab's command line and
    report), never another runner: what two runners share lives in a room below them (the harness in
    minigpt/parallel/, the kernel sets in minigpt/kernel_sets.py)."""
    found = []
    for path in sorted((PACKAGE / "runners").glob("*.py")):
        others = {
            name
            for name in imported_modules(path)
            if name.startswith("minigpt.runners.") and name.split(".")[2] not in ("entry", path.stem)
        }
        found += [f"{path.relative_to(ROOT)} imports {m}" for m in sorted(others)]
    assert found == [], "\n".join(found)
