"""Every notebook runs top to bottom in a fresh kernel (the notebooks are not stored executed)."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tests.limits import limit

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_there_is_a_notebook_per_lab_guide():
    labs = {p.name.split("-")[0] for p in (ROOT / "lab").glob("[0-9][0-9]-*.md")}
    assert labs and labs == {p.name.split("-")[0] for p in NOTEBOOKS}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs_top_to_bottom(path, tmp_path):
    notebook = nbformat.read(path, as_version=4)
    assert not any(c.get("outputs") for c in notebook.cells if c.cell_type == "code"), (
        f"{path.name} is stored with outputs; clear them before committing"
    )
    NotebookClient(
        notebook, timeout=limit(180), kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    errors = [o for c in notebook.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
