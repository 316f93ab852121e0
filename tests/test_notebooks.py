"""The notebooks: the learner's workbooks, one per lab guide, in English and in Spanish.

What is checked:

* every lab guide has its notebook (``notebooks/NN-name.ipynb``) and a Spanish twin
  (``NN-name.es.ipynb``), and every notebook is stored without outputs;
* a Spanish twin has the English cells, in the same order, with the same tags, and the same code
  once comments and string literals are set aside (the printed text is translated, the code is not);
* every exercise of the lab (every ``Exercise N.M`` its stubs in ``lab/exercises/`` raise) has a
  "your turn" cell, then a cell that grades it, and the first code cell runs the learner's code
  unless ``MINIGPT_IMPL`` says otherwise;
* every prediction of the lab (``PN.M``, minigpt/predictions.py) has a cell that asks its question
  and passes the learner's answer to ``predict``, then a cell that grades it, right after the first
  code cell: the learner predicts before anything runs;
* every English notebook runs top to bottom in a fresh kernel with the reference written into the
  exercise files (every exercise at full marks), and every Spanish twin with the untouched stubs (every
  exercise at 0, every "your turn" cell says in one line, in Spanish, that its exercise is not written
  yet, no traceback anywhere; a prediction's grade cell shows its explanation, "why", with the
  reference and says in Spanish that it is not written yet with the stubs). The twins' code is the
  same (checked above), so each path runs once.
  Each lab is graded once per implementation in the whole suite (tests/grading.py: the grader's
  proofs); the grade cells show those results exercise by exercise (``MINIGPT_GRADES``).

The notebooks mark their cells with tags (cell metadata): ``your-turn``, ``prediction`` (a prediction's
question) or ``grade``, and ``exercise-N.M`` (``exercise-PN.M`` for a prediction). Their last code cell
prints one line per graded exercise or prediction: ``  N.M  earned/total``, ``  PN.M  earned/total``.
"""

from __future__ import annotations

import io
import re
import tokenize
from concurrent.futures import Future
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from minigpt import grader, hints, impl, predictions
from tests import background, grading, launcher
from tests.limits import limit

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
ENGLISH = sorted(p for p in NOTEBOOKS.glob("*.ipynb") if not p.name.endswith(".es.ipynb"))
NOT_WRITTEN = {"en": "not written yet: Exercise ", "es": "sin escribir todavía: Ejercicio "}
# seconds each notebook's kernel took on the lane in one suite run (MINIGPT_LANE_LOG, a quiet two-core machine):
# only the order they start in, the longest first, so that no long one is left for last; 5 s for the others
SECONDS = {
    "05-tensor-and-context-parallel.ipynb": 62,
    "01-ddp-from-scratch.ipynb": 33,
    "06-pipelines-and-meshes.ipynb": 28,
    "00-minigpt-baseline.es.ipynb": 20,
    "00-minigpt-baseline.ipynb": 19,
    "05-tensor-and-context-parallel.es.ipynb": 16,
    "02-zero-simulator.ipynb": 12,
    "06-pipelines-and-meshes.es.ipynb": 10,
    "03-fsdp-prefetch.es.ipynb": 9,
    "03-fsdp-prefetch.ipynb": 8,
    "01-ddp-from-scratch.es.ipynb": 7,
    "02-zero-simulator.es.ipynb": 7,
}
SCORE_LINE = re.compile(r"^\s+(P?\d+\.\d+)\s+(\d+)/(\d+)\b", re.MULTILINE)
# a prediction's section opens with this heading (minigpt/predictions.py: "Predict, then run")
PREDICT_HEADING = {"en": "## Predict, then run", "es": "## Predice y luego ejecuta"}


def spanish(path: Path) -> Path:
    return path.with_name(path.stem + ".es.ipynb")


def read(path: Path) -> nbformat.NotebookNode:
    return nbformat.read(path, as_version=4)


def ordered(exercises) -> list[str]:
    """Exercises by number ("1.10" after "1.9"), then predictions ("P1.1")."""
    return sorted(exercises, key=lambda e: (e.startswith("P"), tuple(map(int, e.removeprefix("P").split(".")))))


def exercises_of(path: Path) -> list[str]:
    """The exercises the lab's stubs raise ``NotImplementedError("Exercise N.M: ...")`` for."""
    found = set()
    for stub in impl.EXERCISES_DIR.glob(f"lab{path.name[:2]}_*.py"):
        found |= set(re.findall(r'NotImplementedError\(\s*"Exercise (\d+\.\d+):', stub.read_text(encoding="utf-8")))
    return ordered(found)


def predictions_of(path: Path) -> list[str]:
    """The predictions the lab's notebook asks (minigpt/predictions.py: two per lab from 01), in order."""
    lab = path.name[:2]
    return [q for q, question in predictions.QUESTIONS.items() if question.lab == lab]


def graded_in(path: Path) -> list[str]:
    """What the notebook grades, as ``ordered`` sorts it: the lab's exercises and its predictions."""
    english = path.with_name(path.name.replace(".es.ipynb", ".ipynb"))
    return ordered(exercises_of(english) + predictions_of(english))


def tags(cell) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


def tagged(notebook, kind: str, exercise: str) -> list[int]:
    return [i for i, c in enumerate(notebook.cells) if kind in tags(c) and f"exercise-{exercise}" in tags(c)]


def code_tokens(source: str) -> list[str]:
    """The cell's tokens without comments and line breaks inside brackets, each string literal (an
    f-string with what it contains, adjacent literals together) as one ``<str>``."""
    starts = {getattr(tokenize, n) for n in ("FSTRING_START", "TSTRING_START") if hasattr(tokenize, n)}
    ends = {getattr(tokenize, n) for n in ("FSTRING_END", "TSTRING_END") if hasattr(tokenize, n)}
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.ENCODING, tokenize.ENDMARKER}
    out, depth = [], 0
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in starts:
            depth += 1
        elif tok.type in ends:
            depth -= 1
            if depth == 0 and out[-1:] != ["<str>"]:
                out.append("<str>")
        elif depth or tok.type in skip:
            continue
        elif tok.type == tokenize.STRING:
            if out[-1:] != ["<str>"]:
                out.append("<str>")
        else:
            out.append(tok.string)
    return out


# ----------------------------------------------------------------------------------------------
# What is stored


def test_there_is_a_notebook_and_a_spanish_twin_per_lab_guide():
    guides = {p.stem for p in (ROOT / "lab").glob("[0-9][0-9]-*.md") if not p.name.endswith(".es.md")}
    assert guides and guides == {p.stem for p in ENGLISH}, "one notebook per lab guide, named like it"
    missing = [spanish(p).name for p in ENGLISH if not spanish(p).is_file()]
    assert missing == [], f"Spanish twins missing: {missing}"
    strays = {p.name for p in NOTEBOOKS.glob("*.es.ipynb")} - {spanish(p).name for p in ENGLISH}
    assert not strays, f"Spanish notebooks without an English one: {sorted(strays)}"


@pytest.mark.parametrize("path", ENGLISH + [spanish(p) for p in ENGLISH], ids=lambda p: p.name)
def test_notebook_is_stored_without_outputs(path):
    code = [c for c in read(path).cells if c.cell_type == "code"]
    assert not any(c.get("outputs") or c.get("execution_count") for c in code), (
        f"{path.name} is stored with outputs or execution counts; clear them before committing"
    )


@pytest.mark.parametrize("path", ENGLISH, ids=lambda p: p.name)
def test_spanish_twin_has_the_english_cells_and_code(path):
    english, twin = read(path).cells, read(spanish(path)).cells
    assert [c.cell_type for c in twin] == [c.cell_type for c in english], "the same cells in the same order"
    assert [tags(c) for c in twin] == [tags(c) for c in english], "the same tags"
    for i, (en, es) in enumerate(zip(english, twin)):
        if en.cell_type == "code":
            assert code_tokens(es.source) == code_tokens(en.source), (
                f"code cell {i} of {spanish(path).name} differs from the English one beyond comments and strings"
            )


@pytest.mark.parametrize("path", ENGLISH, ids=lambda p: p.name)
def test_every_exercise_has_a_your_turn_cell_then_a_grade_cell(path):
    notebook = read(path)
    exercises = exercises_of(path)
    assert exercises, f"no stub raises 'Exercise {int(path.name[:2])}.N' in lab/exercises/"
    first_code = next(c for c in notebook.cells if c.cell_type == "code")
    assert 'IMPL = os.environ.get("MINIGPT_IMPL", "exercises")' in first_code.source, (
        "the first code cell picks whose code runs: the learner's unless MINIGPT_IMPL says otherwise"
    )
    for exercise in exercises:
        yours, grades = tagged(notebook, "your-turn", exercise), tagged(notebook, "grade", exercise)
        assert yours, f"Exercise {exercise} has no cell tagged your-turn"
        assert len(grades) == 1, f"Exercise {exercise}: {len(grades)} cells tagged grade, not one"
        assert min(yours) < grades[0], f"Exercise {exercise}: the grade cell comes before the your-turn cell"
        assert f'grade("{exercise}", impl=IMPL, lang=LANG)' in notebook.cells[grades[0]].source
    named = {t.removeprefix("exercise-") for c in notebook.cells for t in tags(c) if t.startswith("exercise-")}
    known = set(exercises) | set(predictions_of(path))
    assert named <= known, f"cells tagged for exercises the stubs (or predictions the lab) do not have: {named - known}"


PREDICTING = [p for p in ENGLISH if predictions_of(p)]  # Lab 00 has none


@pytest.mark.parametrize("path", PREDICTING + [spanish(p) for p in PREDICTING], ids=lambda p: p.name)
def test_every_prediction_is_asked_then_graded_first(path):
    """Predict, then run: right after the setup cell, under its heading, each prediction of the lab has a
    cell tagged ``prediction`` that prints its question from minigpt/predictions.py (the text has one home)
    and passes the learner's answer to ``predict`` (None as it ships: it writes nothing), then its grade
    cell; no other code runs before them (a cell of the lab could show an answer). The twin has the
    same cells (checked above); each is checked here for its own heading."""
    notebook = read(path)
    asked = predictions_of(path.with_name(path.name.replace(".es.ipynb", ".ipynb")))
    code = [i for i, c in enumerate(notebook.cells) if c.cell_type == "code"]
    setup = notebook.cells[code[0]].source
    assert re.search(r"^from minigpt import .*\bpredictions\b", setup, re.M), "the setup cell imports predictions"
    assert "from minigpt.predictions import predict\n" in setup, "the setup cell imports predict"
    cells = []
    for q in asked:
        questions, grades = tagged(notebook, "prediction", q), tagged(notebook, "grade", q)
        assert len(questions) == 1 and len(grades) == 1, (
            f"{q}: {len(questions)} cells tagged prediction and {len(grades)} tagged grade, not one each"
        )
        question, grade_cell = questions[0], grades[0]
        source = notebook.cells[question].source
        assert f'print(predictions.QUESTIONS["{q}"].ask[LANG])' in source, f"{q}: the question comes from the code"
        assert re.search(rf'^predict\("{re.escape(q)}", None\)', source, re.M), f"{q}: ships unanswered"
        assert f'GRADES["{q}"] = grade("{q}", impl=IMPL, lang=LANG)' in notebook.cells[grade_cell].source
        cells += [question, grade_cell]
    assert cells == code[1 : 1 + len(cells)], (
        "the predictions' cells (question, grade, in the lab's order) are the first code cells after the setup"
    )
    heading = notebook.cells[cells[0] - 1]
    lang = "es" if path.name.endswith(".es.ipynb") else "en"
    assert heading.cell_type == "markdown" and heading.source.startswith(PREDICT_HEADING[lang]), heading.source[:80]
    strays = [
        tags(c)
        for c in notebook.cells
        if "prediction" in tags(c) and not {f"exercise-{q}" for q in asked} & set(tags(c))
    ]
    assert not strays, f"cells tagged prediction for no prediction of the lab: {strays}"


# The notebooks of the labs that teach before they prove (issue 29): a hint cell per exercise, tables
# shown as Markdown, pictures as figures, no guessed run time.
TEACH_FIRST = [p for p in ENGLISH if p.name[:2] in ("04", "05", "06", "07")]
HINT_CALL = re.compile(r'^hint\("(\d+\.\d+)", lang=LANG\)$', re.M)
GUESSED_TIME = re.compile(
    r"\b(?:a few|several|about|around|unos|unas|cerca de|alrededor de)\s+(?:[\w-]+\s+){0,3}?"
    r"(?:minutes?|seconds?|minutos?|segundos?)\b",
    re.IGNORECASE,
)


@pytest.mark.parametrize("path", TEACH_FIRST + [spanish(p) for p in TEACH_FIRST], ids=lambda p: p.name)
def test_every_exercise_has_one_collapsed_hint_cell(path):
    """One hint cell per exercise, after its Your turn cells and before its grade cell: a code cell that
    calls ``hint("N.M", lang=LANG)`` (minigpt.hints: the next hint on every run, as make hint), hidden
    until opened, neither a your-turn nor a grade cell."""
    notebook = read(path)
    found = {}
    for i, cell in enumerate(notebook.cells):
        if cell.cell_type == "code" and HINT_CALL.search(cell.source):
            (exercise,) = HINT_CALL.findall(cell.source)
            assert exercise not in found, f"Exercise {exercise}: two hint cells"
            found[exercise] = i
            assert not ({"your-turn", "grade"} & set(tags(cell))), f"the hint cell of {exercise} is tagged"
            meta = cell.get("metadata", {})
            assert meta.get("collapsed") is True and meta.get("jupyter", {}).get("source_hidden") is True, exercise
    assert ordered(found) == exercises_of(path.with_name(path.name.replace(".es.", "."))), sorted(found)
    for exercise, i in found.items():
        yours, grade_cell = tagged(notebook, "your-turn", exercise), tagged(notebook, "grade", exercise)
        assert max(yours) < i < grade_cell[0], (
            f"Exercise {exercise}: the hint cell sits between its last Your turn and grade cells"
        )


@pytest.mark.parametrize("path", TEACH_FIRST + [spanish(p) for p in TEACH_FIRST], ids=lambda p: p.name)
def test_tables_are_markdown_and_no_run_time_is_guessed(path):
    """A generated table is displayed as Markdown, never printed as raw pipes; the 1F1B chart is a
    figure (``lab06.schedule_png``), not the script's text chart; no prose guesses a run time."""
    notebook = read(path)
    code = "\n".join(c.source for c in notebook.cells if c.cell_type == "code")
    assert not re.search(r"print\(lab0\d\.\w+\(", code), "a table printed as raw text: display(Markdown(...))"
    assert "chart(" not in code
    if path.name.startswith("06-"):
        assert "lab06.schedule_png(" in code
    prose = " ".join(" ".join(c.source for c in notebook.cells if c.cell_type == "markdown").split())
    assert not GUESSED_TIME.findall(prose), GUESSED_TIME.findall(prose)


PAGE_FIGURE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)-(?:en|es)\.png\)")


@pytest.mark.parametrize("path", TEACH_FIRST + [spanish(p) for p in TEACH_FIRST], ids=lambda p: p.name)
def test_every_figure_of_the_lab_page_is_shown(path):
    """Each picture of the lab guide (``![...](...-en.png)``) is displayed by its notebook, in the
    notebook's language (``f"{name}-{LANG}.png"``)."""
    guide = ROOT / "lab" / f"{path.name.split('.')[0]}.md"
    figures = {Path(f).name for f in PAGE_FIGURE.findall(guide.read_text(encoding="utf-8"))}
    code = "\n".join(c.source for c in read(path).cells if c.cell_type == "code")
    assert figures and "{LANG}.png" in code
    missing = sorted(f for f in figures if f'"{f}' not in code)
    assert not missing, f"figures of {guide.name} that {path.name} does not show: {missing}"


# ----------------------------------------------------------------------------------------------
# Running them


def environment(graded, tmp_path: Path) -> dict[str, str]:
    """The kernel's environment: the learner's path (``MINIGPT_IMPL=exercises``), with the exercise
    files and the saved grades of ``graded`` (tests/grading.py)."""
    env = {k: v for k, v in launcher.environ().items() if k not in (impl.ONLY_ENV_VAR, impl.DIR_ENV_VAR)}
    env[impl.ENV_VAR] = "exercises"
    if graded.folder is not None:
        env[impl.DIR_ENV_VAR] = str(graded.folder)
    env[grader.SAVED_VARIABLE] = str(graded.saved)
    env[hints.STATE_VARIABLE] = str(tmp_path / "hints.json")  # the hint cells count here, not in out/
    env["OMP_NUM_THREADS"] = "1"  # two kernels at a time on two cores: one thread each, no spin-waiting
    env["TMPDIR"] = str(tmp_path)  # the notebook's own temporary folders (its runs' reports) go with the test's
    return env


def execute(path: Path, graded, tmp_path: Path) -> nbformat.NotebookNode:
    """``path`` executed in a fresh kernel (its environment: ``environment``); raises on the first cell
    that raises."""
    notebook = read(path)
    # the kernel's own log to a file: it starts on the second lane, where pytest captures nothing.
    # A cell's limit: notebook 05's two lab launches take about 75 s under the suite's load on a quiet
    # two-core machine, and a machine half as fast, busy, takes four times that.
    with open(tmp_path / "kernel.log", "w", encoding="utf-8") as log:
        NotebookClient(
            notebook, timeout=limit(300), kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
        ).execute(env=environment(graded, tmp_path), stderr=log)
    return notebook


def submit(config: pytest.Config) -> dict:
    """Every notebook, on the suite's second lane (tests/background.py; a kernel computes on one thread,
    so the other core works meanwhile): English with the reference, Spanish with the stubs, the longest
    first. Each waits for its whole grading (tests/grading.py, started before it on the same lane)."""
    gradings = grading.submit(config)
    jobs = [(p, gradings["reference"]) for p in ENGLISH] + [(spanish(p), gradings["stubs"]) for p in ENGLISH]
    jobs.sort(key=lambda job: -SECONDS.get(job[0].name, 5))
    lane = background.lane(config)

    def job(path: Path, graded: Future):
        return lambda folder: execute(path, graded.result(timeout=limit(280)), folder)

    return {path.name: lane.submit(f"notebook {path.name}", job(path, graded)) for path, graded in jobs}


@pytest.fixture(scope="session")
def executed(request):
    """The futures of the executed notebooks (``submit``), by file name; each test waits for its own."""
    return submit(request.config)


def run(path: Path, executed) -> nbformat.NotebookNode:
    return executed[path.name].result(timeout=limit(600))  # the longest notebook, started last, on a slow machine


def text(cell) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", []) if o.output_type == "stream")


def check_ran_cleanly(notebook, name: str) -> None:
    outputs = [o for c in notebook.cells if c.cell_type == "code" for o in c.outputs]
    errors = [o for o in outputs if o.output_type == "error"]
    assert not errors, f"{name}: {errors[0].ename}: {errors[0].evalue}"
    tracebacks = [o.text for o in outputs if o.output_type == "stream" and "Traceback" in o.text]
    assert not tracebacks, f"{name} printed a traceback:\n{tracebacks[0][-2000:]}"


def scores(notebook, name: str) -> dict[str, tuple[int, int]]:
    """The last code cell's score lines: exercise -> (earned, total)."""
    last = [c for c in notebook.cells if c.cell_type == "code"][-1]
    found = {ex: (int(earned), int(total)) for ex, earned, total in SCORE_LINE.findall(text(last))}
    assert found, f"{name}: the last cell printed no score lines"
    return found


@pytest.mark.timeout(660)  # run()'s wait, and the rest
@pytest.mark.parametrize("path", ENGLISH, ids=lambda p: p.name)
def test_english_notebook_runs_top_to_bottom(path, executed):
    notebook = run(path, executed)
    check_ran_cleanly(notebook, path.name)
    found = scores(notebook, path.name)
    assert ordered(found) == graded_in(path), "one score line per exercise and prediction of the lab"
    assert all(total > 0 for _, total in found.values())
    assert all(earned == total for earned, total in found.values()), f"the reference lost points: {found}"
    your_turn = [c for c in notebook.cells if "your-turn" in tags(c)]
    silent = [c.source.splitlines()[0] for c in your_turn if NOT_WRITTEN["en"] in text(c)]
    assert not silent, f"with the reference, your-turn cells said 'not written yet': {silent}"
    why = f"    {grader.WORDS['en']['why']}: "  # a prediction graded: its explanation (minigpt/grader.py)
    unexplained = [q for q in predictions_of(path) if why not in text(notebook.cells[tagged(notebook, "grade", q)[0]])]
    assert not unexplained, f"with the reference, these predictions' grade cells showed no explanation: {unexplained}"
    # the lab scripts a cell runs (on_two_ranks: "$ torchrun ... (N s, exit code K)"), each to its end
    launches = [c for c in notebook.cells if c.cell_type == "code" and "def on_two_ranks" in c.source]
    codes = [int(k) for c in launches for k in re.findall(r"\(\d+ s, exit code (\d+)\)", text(c))]
    assert len(codes) == sum(len(re.findall(r"^on_two_ranks\(", c.source, re.M)) for c in launches), codes
    failed = [line for c in launches for line in text(c).splitlines() if re.search(r"exit code [1-9]", line)]
    assert codes == [0] * len(codes), f"a lab script the notebook runs failed with the reference: {failed}"


def literals(source: str) -> list[str]:
    """The string literals of a cell's code (an f-string as its source text)."""
    found = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.STRING or tok.type == getattr(tokenize, "FSTRING_MIDDLE", None):
            found.append(tok.string)
    return found


@pytest.mark.parametrize("path", ENGLISH, ids=lambda p: p.name)
def test_english_notebook_says_not_written_in_english(path):
    """The English run above meets no stub; its Spanish twin meets every one through the same code (its
    cells' code is the English one, token for token, strings aside). What only the strings decide is
    the line a stub prints: every English line that says "not written yet" is, in the same cell of the
    twin, one that says "sin escribir todavía", and the English notebook grades in English."""
    english, twin = read(path).cells, read(spanish(path)).cells
    first = next(c for c in english if c.cell_type == "code").source
    assert 'LANG = "en"' in first, "the English notebook grades in English"
    said = 0
    for i, (en, es) in enumerate(zip(english, twin)):
        if en.cell_type != "code":
            continue
        n_en = sum("not written yet: " in x for x in literals(en.source))
        n_es = sum("sin escribir todavía: " in x for x in literals(es.source))
        assert n_en == n_es, f"cell {i}: {n_en} English 'not written yet' lines, {n_es} Spanish ones"
        said += n_en
    assert said > 0, "no cell of the notebook says 'not written yet'"


@pytest.mark.timeout(660)  # run()'s wait, and the rest
@pytest.mark.parametrize("path", [spanish(p) for p in ENGLISH], ids=lambda p: p.name)
def test_spanish_notebook_runs_with_the_stubs(path, executed):
    notebook = run(path, executed)
    check_ran_cleanly(notebook, path.name)
    found = scores(notebook, path.name)
    assert ordered(found) == graded_in(path) and all(earned == 0 for earned, _ in found.values())
    words, unsaid = grader.WORDS["es"], {}
    for q in predictions_of(path.with_name(path.name.replace(".es.ipynb", ".ipynb"))):
        said = text(notebook.cells[tagged(notebook, "grade", q)[0]])  # "sin escribir todavía: Predicción P6.1: ..."
        if words["not_written"].format(task=f"{words['prediction']} {q}: ") not in said:
            unsaid[q] = said[-800:]
    assert not unsaid, f"prediction grade cells that did not say, in Spanish, that it is not written yet: {unsaid}"
    quiet = {
        c.source.splitlines()[0]: text(c)[-800:]
        for c in notebook.cells
        if "your-turn" in tags(c) and NOT_WRITTEN["es"] not in text(c)
    }
    assert not quiet, (
        f"your-turn cells that did not say, in Spanish, that their exercise is not written yet (what they printed): {quiet}"
    )
