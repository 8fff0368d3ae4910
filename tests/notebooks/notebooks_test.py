"""Every notebook under notebooks/ runs top to bottom in a fresh Jupyter kernel (nbclient), at
small sizes (SFJAX_NOTEBOOK_SMALL=1); any cell error fails the test, naming the cell."""

import glob
import os

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOTEBOOKS = sorted(glob.glob(os.path.join(ROOT, "notebooks", "*.ipynb")))
EXPECTED = {"quickstart_ctr.ipynb", "huge_tables.ipynb", "automl_search.ipynb"}


def test_the_notebooks_are_there():
  assert {os.path.basename(p) for p in NOTEBOOKS} >= EXPECTED


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_runs_headless(path, monkeypatch, tmp_path):
  monkeypatch.setenv("SFJAX_NOTEBOOK_SMALL", "1")
  monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
  monkeypatch.setenv("TMPDIR", str(tmp_path))  # the notebooks' scratch directories
  # The kernel inherits the suite's XLA_FLAGS (conftest): 8 devices, patient collectives,
  # and the launch threads without which a collective hangs (`sfjax.core.host_devices`).
  assert "--xla_force_host_platform_device_count=8" in os.environ["XLA_FLAGS"]
  assert int(os.environ["PJRT_NPROC"]) >= 16
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  nb = nbformat.read(path, as_version=4)
  client = NotebookClient(nb, timeout=600, kernel_name="python3",
                          resources={"metadata": {"path": os.path.join(ROOT, "notebooks")}})
  try:
    client.execute()
  except CellExecutionError as err:
    pytest.fail(f"{os.path.basename(path)}: {str(err)[-3000:]}")
  images = sum(1 for cell in nb.cells if cell.cell_type == "code"
               for out in cell.get("outputs", []) if "image/png" in out.get("data", {}))
  assert images >= 1, "every notebook shows at least one figure"
