"""Every notebook under notebooks/ runs top to bottom (code cells exec'd in order)."""

import glob
import json
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOTEBOOKS = sorted(glob.glob(os.path.join(ROOT, "notebooks", "*.ipynb")))


def test_there_are_notebooks():
  assert NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_runs(path, monkeypatch):
  monkeypatch.chdir(os.path.join(ROOT, "notebooks"))
  cells = json.load(open(path))["cells"]
  namespace = {"__name__": "__notebook__"}
  for i, cell in enumerate(cells):
    if cell["cell_type"] != "code":
      continue
    source = "".join(cell["source"])
    exec(compile(source, f"{os.path.basename(path)}[cell {i}]", "exec"), namespace)  # pylint: disable=exec-used
