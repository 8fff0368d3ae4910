"""Re-executes the notebooks in place with their outputs saved (`make notebooks`).

  .venv/bin/python notebooks/execute.py                      # every notebooks/*.ipynb
  .venv/bin/python notebooks/execute.py notebooks/quickstart_ctr.ipynb

Runs each notebook top to bottom in a fresh `python3` kernel of this interpreter (nbclient),
at the sizes the test suite uses (SFJAX_NOTEBOOK_SMALL=1, as tests/notebooks/notebooks_test.py
does), on CPU with 8 fake devices, figures inline as PNG. Scratch directories go to a
temporary TMPDIR removed afterwards. A notebook is rewritten only when every cell ran; a
failing cell leaves the file as it was and the exit status 1. A notebook written larger
than MAX_BYTES is an error too.
"""

import os
import sys
import tempfile
import time

import nbformat
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from sfjax.core import fake_device_env

HERE = os.path.dirname(os.path.abspath(__file__))
MAX_BYTES = 2_000_000
KERNEL = "python3"  # the kernel name the test uses: ipykernel of the interpreter running this


def kernel_env(tmpdir: str) -> dict:
  """The environment variables the kernel gets: small sizes, CPU, 8 devices (with the XLA
  launch threads they need, `sfjax.core.fake_device_env`), inline PNGs."""
  devices = fake_device_env(8, {})
  return {"SFJAX_NOTEBOOK_SMALL": "1", "MPLBACKEND": "module://matplotlib_inline.backend_inline",
          "TMPDIR": tmpdir, "XLA_FLAGS": devices["XLA_FLAGS"],
          "PJRT_NPROC": devices["PJRT_NPROC"], "JAX_PLATFORMS": "cpu"}


def execute(path: str, tmpdir: str) -> int:
  """Runs the notebook at `path` and rewrites it with its outputs; returns its size in bytes.

  The kernel talks over Unix sockets under `tmpdir` (not unencrypted TCP, which ipykernel
  warns about on every start).

  Raises:
    CellExecutionError: a cell failed (the file is left unchanged).
    ValueError: the executed notebook is larger than MAX_BYTES (not written).
  """
  nb = nbformat.read(path, as_version=4)
  km = KernelManager(kernel_name=KERNEL, transport="ipc", ip=os.path.join(tmpdir, "kernel"))
  client = NotebookClient(nb, km=km, timeout=600, kernel_name=KERNEL, record_timing=False,
                          resources={"metadata": {"path": HERE}})
  client.execute()
  text = nbformat.writes(nb)
  if len(text.encode()) > MAX_BYTES:
    raise ValueError(f"{path}: {len(text.encode())} bytes with outputs, more than {MAX_BYTES}")
  with open(path, "w", encoding="utf-8") as f:
    f.write(text)
  return len(text.encode())


def main(paths: list[str]) -> int:
  """Executes `paths` (default: every notebook here) one after another; the exit status."""
  paths = paths or sorted(os.path.join(HERE, n) for n in os.listdir(HERE) if n.endswith(".ipynb"))
  status = 0
  with tempfile.TemporaryDirectory(prefix="sfjax_notebooks_") as tmpdir:
    os.environ.update(kernel_env(tmpdir))  # the kernels inherit it
    for path in paths:
      t0 = time.time()
      try:
        size = execute(path, tmpdir)
      except (CellExecutionError, ValueError) as err:
        print(f"{path}: FAILED\n{str(err)[-3000:]}", file=sys.stderr)
        status = 1
        continue
      print(f"{os.path.relpath(path)}: {time.time() - t0:.0f} s, {size / 1e3:.0f} kB")
  return status


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
