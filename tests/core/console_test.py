"""The console: a run shows our progress lines, not orbax's or jax's INFO chatter."""

import json
import logging
import os
import subprocess
import sys

import numpy as np
import orbax.checkpoint as ocp
import pytest
from absl import logging as absl_logging

from sfjax.core import console

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_LIBTPU = "Unable to initialize backend 'tpu'"


def _record(level: int, pathname: str) -> logging.LogRecord:
  return logging.LogRecord("absl", level, pathname, 1, "message", None, None)


@pytest.fixture
def restored_logging():
  """Puts back the absl verbosity, the absl logger's filters and the quiet loggers' levels."""
  absl_logger = absl_logging.get_absl_logger()
  verbosity, filters = absl_logging.get_verbosity(), list(absl_logger.filters)
  levels = {name: logging.getLogger(name).level for name in console._QUIET_LOGGERS}
  yield
  absl_logging.set_verbosity(verbosity)
  absl_logger.filters[:] = filters
  for name, level in levels.items():
    logging.getLogger(name).setLevel(level)


def test_filter_drops_only_library_records_below_warning():
  f = console._LibraryInfoFilter(("orbax",))
  lib = "/venv/lib/python3.11/site-packages/orbax/checkpoint/_src/checkpointers/async.py"
  ours = "/work/sfjax/train/loop.py"
  assert not f.filter(_record(logging.INFO, lib))
  assert not f.filter(_record(logging.DEBUG, lib))
  assert f.filter(_record(logging.WARNING, lib))
  assert f.filter(_record(logging.ERROR, lib))
  assert f.filter(_record(logging.INFO, ours))
  assert f.filter(_record(logging.INFO, "/work/orbax_notes/loop.py"))  # a component, not a prefix


def test_set_up_is_idempotent(restored_logging):
  console.set_up_console(absl_logging.WARNING)
  console.set_up_console(absl_logging.INFO)
  absl_logger = absl_logging.get_absl_logger()
  assert sum(isinstance(f, console._LibraryInfoFilter) for f in absl_logger.filters) == 1
  assert absl_logging.get_verbosity() == absl_logging.INFO
  assert logging.getLogger("jax._src.xla_bridge").level == logging.WARNING


def test_a_real_orbax_save_and_the_libtpu_line_are_quiet_after_set_up(
    restored_logging, caplog, tmp_path):
  caplog.set_level(logging.INFO)
  absl_logging.set_verbosity(absl_logging.INFO)
  tree = {"w": np.arange(6.0).reshape(2, 3)}
  bridge = logging.getLogger("jax._src.xla_bridge")

  def chatter(directory):
    caplog.clear()
    with ocp.StandardCheckpointer() as ckpt:
      ckpt.save(directory, tree)
    bridge.info(f"{_LIBTPU}: INTERNAL: Failed to open libtpu.so")  # what jax logs at start-up
    absl_logging.info("step 1/1 loss 0.5")  # one of ours
    return [(r.levelno, r.pathname, r.getMessage()) for r in caplog.records]

  before = chatter(tmp_path / "before")
  assert any(os.sep + "orbax" + os.sep in p for _, p, _ in before), "orbax logs at INFO"
  assert any(_LIBTPU in m for _, _, m in before)
  console.set_up_console(absl_logging.INFO)
  after = chatter(tmp_path / "after")
  assert not [r for r in after if os.sep + "orbax" + os.sep in r[1] and r[0] < logging.WARNING]
  assert not [m for _, _, m in after if _LIBTPU in m]
  assert [m for _, _, m in after if m == "step 1/1 loss 0.5"]


@pytest.mark.slow
def test_train_ctr_with_checkpoints_prints_only_our_lines(tmp_path):
  # JAX_PLATFORMS unset: jax probes every backend, as on a user's machine (the libtpu line).
  env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
  env["XLA_FLAGS"] = ""
  r = subprocess.run(
      [sys.executable, "-m", "experiments.train_ctr", "--config=experiments/configs/ctr.py:smoke",
       f"--workdir={tmp_path}", "--config.checkpoint.every_steps=30"],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  console_text = r.stdout + r.stderr
  assert "libtpu" not in console_text and _LIBTPU not in console_text
  orbax_files = ("abstract_checkpointer.py", "async_checkpointer.py", "checkpoint_handler.py",
                 "async_io_engine.py", "atomicity.py", "event_tracking.py",
                 "jax_array_handlers.py", "array_metadata_store.py", "ocdbt_utils.py")
  lines = console_text.splitlines()
  assert not [x for x in lines if x.startswith("I") and any(f + ":" in x for f in orbax_files)]
  assert not [x for x in lines if "orbax" in x.lower() and not x.startswith("{")], lines
  assert [x for x in lines if "checkpoint " in x and "step_00000060" in x]  # ours stays
  assert [x for x in lines if "step 60/60" in x]
  assert json.loads(r.stdout.splitlines()[-1])["step"] == 60
