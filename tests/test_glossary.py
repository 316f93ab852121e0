"""One Spanish word per idea: the Spanish text of the course never uses a word that GLOSSARY.md
rejects.

GLOSSARY.md's section "Words we do not use / Palabras que no usamos" is a table: its first column
lists the rejected variants, each in backticks; its second column says what to write instead. This
test reads that table and looks for every variant in the course's Spanish text:

* every ``*.es.md`` page (README.es.md, docs/, theory/, lab/, minigpt/fsdp/notes/reading.es.md),
  outside code: fenced blocks, inline code, math, link targets, heading ids, HTML tags and snippet
  lines are blanked first (keeping the line numbers);
* the generated Spanish text: the measured fragments the lab pages include
  (``lab/results/*-es.txt``, rendered by the page modules) and every table of
  :data:`minigpt.pages.site.TABLES` as ``python -m minigpt.pages`` writes it now (a forbidden word
  in generated text is caught where it is made, not only once it reaches a page);
* the ``es`` entries of minigpt/exercises.toml (the grader's Spanish report);
* the Spanish strings of Python sources: the Spanish argument of ``tr(lang, en, es)`` (the pages'
  tables and figures), ``say(en, es)`` and ``refuses(call, run, en, es)`` (the graded tests'
  messages), and the value of every ``"es"`` key of a dict literal.

A variant matches as whole words, in any case, across line breaks. A failure names the file, the
line, the word found and the word to use.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
GLOSSARY = ROOT / "GLOSSARY.md"
AVOID_HEADING = re.compile(r"^##\s+Words we do not use\b.*$", re.MULTILINE)

# The Spanish sources (not the notebooks). tests/test_grader.py is not one: it quotes the grader's
# own report, which minigpt/grader.py writes.
PAGE_GLOBS = ("*.es.md", "docs/*.es.md", "theory/*.es.md", "lab/*.es.md", "minigpt/**/*.es.md")
FRAGMENT_GLOBS = ("lab/results/*-es.txt",)  # the measured fragments, as the page modules rendered them
PYTHON_GLOBS = ("minigpt/pages/*.py", "tests/test_lab0*.py", "tests/ranks.py", "tests/words.py")
TOML_FILES = ("minigpt/exercises.toml",)
# call name -> position of its Spanish argument (and the keyword that may name it)
SPANISH_ARGUMENT = {"tr": (2, "es"), "say": (1, "spanish_text"), "refuses": (3, "spanish_text")}


@dataclass(frozen=True)
class Rule:
    variant: str  # as written in the glossary
    use: str  # the glossary's word for it
    pattern: re.Pattern


def rules(text: str | None = None) -> list[Rule]:
    """The rejected variants of GLOSSARY.md's table "Words we do not use / Palabras que no usamos"."""
    text = GLOSSARY.read_text(encoding="utf-8") if text is None else text
    heading = AVOID_HEADING.search(text)
    assert heading, "GLOSSARY.md must have a section '## Words we do not use / Palabras que no usamos'"
    section = text[heading.end() :]
    end = re.search(r"^#{1,2}\s", section, re.MULTILINE)
    section = section[: end.start()] if end else section
    found = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.lstrip().startswith("|") or len(cells) < 2 or set(cells[0]) <= set("-: "):
            continue
        for variant in re.findall(r"`([^`]+)`", cells[0]):
            words = r"\s+".join(re.escape(w) for w in variant.split())
            pattern = re.compile(rf"(?<![\w-]){words}(?![\w-])", re.IGNORECASE)
            found.append(Rule(variant, cells[1], pattern))
    return found


# --- the Spanish text of each kind of source, as (line number, text) pieces ---------------------


def _blank(match: re.Match) -> str:
    """The matched text as spaces, its line breaks kept (so that line numbers do not move)."""
    return re.sub(r"[^\n]", " ", match.group(0))


def markdown_prose(text: str) -> str:
    """A page with everything that is not prose blanked out: the same length, line by line."""
    lines = text.split("\n")
    fence = None
    for i, line in enumerate(lines):
        opener = re.match(r"\s*(`{3,}|~{3,})", line)
        if fence is None and opener:
            fence = opener.group(1)
            lines[i] = " " * len(line)
        elif fence is not None:
            if line.strip().startswith(fence) and line.strip().strip(fence[0]) == "":
                fence = None
            lines[i] = " " * len(line)
        elif line.lstrip().startswith("--8<--"):
            lines[i] = " " * len(line)
    text = "\n".join(lines)
    for pattern in (
        r"\$\$.*?\$\$",  # display math
        r"(?<![\\\w])\$[^$\n]+?\$",  # inline math
        r"(`+)(?:(?!\1).)+?\1",  # inline code
        r"\]\([^)]*\)",  # link targets
        r"\{\s*#[^}]*\}|\{#[^}]*\}",  # heading ids
        r"<[^>\n]+>",  # HTML tags
        r"https?://\S+",
        r"(?<![\w/])[\w.-]+(?:/[\w.-]+)+/?",  # paths: lab/00-minigpt-baseline.es.md
    ):
        text = re.sub(pattern, _blank, text, flags=re.DOTALL)
    return text


def _strings(node: ast.AST) -> list[tuple[int, str]]:
    """The literal text of an expression: string constants, f-strings' literal parts, the items of
    lists, tuples and dicts, the sides of ``+`` and ``%``, both branches of ``a if c else b``, and the
    template of ``"...".format(...)``; not paths (``ROOT / "lab"``) nor a call's arguments."""
    if isinstance(node, ast.Constant):
        return [(node.lineno, node.value)] if isinstance(node.value, str) else []
    if isinstance(node, ast.JoinedStr):
        return [(node.lineno, v.value) for v in node.values if isinstance(v, ast.Constant)]
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return [s for item in node.elts for s in _strings(item)]
    if isinstance(node, ast.Dict):
        return [s for item in node.values for s in _strings(item)]
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mod)):
        return _strings(node.left) + _strings(node.right)
    if isinstance(node, ast.IfExp):
        return _strings(node.body) + _strings(node.orelse)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return _strings(node.func.value)
    return []


SPANISH_WORDS = {"el", "la", "los", "las", "del", "que", "una", "por", "con", "se", "es", "su", "sus", "y"}
ENGLISH_WORDS = {"the", "of", "and", "to", "is", "a", "an", "that", "with", "its", "it", "by"}


def looks_spanish(text: str) -> bool:
    """A string with more Spanish than English function words (at least two), or Spanish letters:
    the Spanish half of a table such as tests/ranks.py's HINTS, which reaches ``say`` through names."""
    words = re.findall(r"[^\W\d_]+", text.lower())
    spanish_words = sum(w in SPANISH_WORDS for w in words)
    english_words = sum(w in ENGLISH_WORDS for w in words)
    return bool(re.search(r"[áéíóúñ¿¡]", text.lower())) or (spanish_words >= 2 and spanish_words > english_words)


def python_spanish(source: str) -> list[tuple[int, str]]:
    """The Spanish strings of a Python source: tr/say/refuses' Spanish arguments, "es" dict values,
    and any other string literal that looks Spanish."""
    tree = ast.parse(source)
    found = [
        (n.lineno, n.value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and looks_spanish(n.value)
    ]
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            if name in SPANISH_ARGUMENT:
                position, keyword = SPANISH_ARGUMENT[name]
                if len(node.args) > position:
                    found += _strings(node.args[position])
                found += [s for k in node.keywords if k.arg == keyword for s in _strings(k.value)]
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if isinstance(key, ast.Constant) and key.value == "es":
                    found += _strings(value)
    return sorted(set(found))


def toml_spanish(text: str) -> list[tuple[int, str]]:
    """The ``es = "..."`` values of a TOML file, each with its line."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for match in re.finditer(r'\bes\s*=\s*"((?:[^"\\]|\\.)*)"', line):
            found.append((number, match.group(1)))
    expected = []

    def walk(value):
        if isinstance(value, dict):
            for key, item in value.items():
                expected.append(item) if key == "es" and isinstance(item, str) else walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(tomllib.loads(text))
    assert len(found) == len(expected), 'every es entry must be a one-line string (es = "...")'
    return found


def spanish_sources() -> list[tuple[Path, list[tuple[int, str]]]]:
    """Every Spanish source, as (path, [(first line, text), ...])."""
    sources = []
    pages = sorted({p for g in PAGE_GLOBS for p in ROOT.glob(g)})
    for path in pages:
        sources.append((path, [(1, markdown_prose(path.read_text(encoding="utf-8")))]))
    for path in sorted({p for g in FRAGMENT_GLOBS for p in ROOT.glob(g)}):
        sources.append((path, [(1, markdown_prose(path.read_text(encoding="utf-8")))]))
    sources += generated_tables()
    for path in sorted({p for g in PYTHON_GLOBS for p in ROOT.glob(g)}):
        if path.name != Path(__file__).name:
            sources.append((path, python_spanish(path.read_text(encoding="utf-8"))))
    for name in TOML_FILES:
        path = ROOT / name
        sources.append((path, toml_spanish(path.read_text(encoding="utf-8"))))
    return sources


def generated_tables() -> list[tuple[Path, list[tuple[int, str]]]]:
    """Every registered table in Spanish, as ``python -m minigpt.pages`` writes it to
    ``build/tables/<name>-es.md`` (made here, not read from a build folder that may be stale)."""
    from minigpt.pages import site

    return [
        (ROOT / "build" / "tables" / f"{name}-es.md", [(1, markdown_prose(make("es")))])
        for name, make in sorted(site.TABLES.items())
    ]


def misuses(sources, glossary_rules) -> list[str]:
    """'file:line: "found" -> use ...' for every rejected variant in the sources."""
    problems = []
    for path, pieces in sources:
        for first_line, text in pieces:
            for rule in glossary_rules:
                for match in rule.pattern.finditer(text):
                    line = first_line + text.count("\n", 0, match.start())
                    problems.append(
                        f'{path.relative_to(ROOT)}:{line}: "{match.group(0)}" (GLOSSARY.md rejects '
                        f"`{rule.variant}`): use {rule.use}"
                    )
    return problems


# --- the tests ----------------------------------------------------------------------------------


def test_the_glossary_lists_rejected_variants():
    found = rules()
    assert len(found) >= 20, f"GLOSSARY.md's table of rejected words has only {len(found)} entries"
    assert all(r.use for r in found), "every rejected variant says what to use instead"


def test_the_checker_sees_prose_and_skips_code():
    page = (
        "Una cubeta.\n```python\ncubeta = 1\n```\n`cubeta` y $cubeta$ y [x](cubeta.md)\n"
        "## Título { #cubeta }\n    ```\n    cubeta\n    ```\nla\ncubeta"
    )
    cubeta = [r for r in rules("## Words we do not use\n| no | sí |\n| --- | --- |\n| `cubeta` | bucket |\n")]
    problems = misuses([(ROOT / "x.es.md", [(1, markdown_prose(page))])], cubeta)
    assert [p.split(":")[1] for p in problems] == ["1", "11"], problems
    source = 'tr(lang, "the cubeta", "la cubeta")\nsay("a", f"{x} cubetas")\nd = {"en": "cubeta", "es": ["cubeta"]}'
    assert [line for line, text in python_spanish(source) if "cubeta" in text] == [1, 2, 3]
    assert [line for line, _ in toml_spanish('t = { en = "cubeta", es = "una cubeta" }')] == [1]


def test_generated_text_is_read_too():
    """The measured fragments and the generated tables are among the sources, and a forbidden word
    in one is found, with its file and line."""
    from minigpt.pages import site

    read = {path.relative_to(ROOT).as_posix() for path, _ in spanish_sources()}
    fragments = {p.relative_to(ROOT).as_posix() for p in (ROOT / "lab" / "results").glob("*-es.txt")}
    assert fragments and fragments <= read, sorted(fragments - read)
    assert {f"build/tables/{name}-es.md" for name in site.TABLES} <= read
    fragment = ROOT / "lab" / "results" / "x-es.txt"
    text = markdown_prose("| medida | valor |\n| --- | ---: |\n| precisión del tutor tras entrenar | 98,0 % |\n")
    problems = misuses([(fragment, [(1, text)])], rules())
    assert [p.split(":")[:2] for p in problems] == [["lab/results/x-es.txt", "3"]], problems


def test_spanish_text_uses_the_glossary_words():
    problems = misuses(spanish_sources(), rules())
    assert not problems, (
        f"{len(problems)} word(s) that GLOSSARY.md rejects (section 'Words we do not use'):\n" + "\n".join(problems)
    )
