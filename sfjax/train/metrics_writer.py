"""The run's files: `config.json` and `metrics.jsonl` (one JSON object per eval)."""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

from sfjax.core.atomic import atomic_write


class MetricsWriter:
  """Writes a run's config once and appends one line per eval record.

  With `workdir=None` nothing is written (a notebook run). Use as a context
  manager or call `close()`.
  """

  def __init__(self, workdir: str | None, config=None):
    """Creates `workdir`, writes `config.json` (if `config`) and starts `metrics.jsonl`."""
    self.workdir = workdir
    self._file = None
    if not workdir:
      return
    os.makedirs(workdir, exist_ok=True)
    if config is not None:
      atomic_write(os.path.join(workdir, "config.json"), config.to_json_best_effort(indent=2))
    self._file = open(os.path.join(workdir, "metrics.jsonl"), "w", encoding="utf-8")

  def write(self, record: Mapping[str, Any]) -> None:
    """Appends `record` as one line, flushed."""
    if self._file is not None:
      self._file.write(json.dumps(dict(record)) + "\n")
      self._file.flush()

  def close(self) -> None:
    """Closes `metrics.jsonl`."""
    if self._file is not None:
      self._file.close()
      self._file = None

  def __enter__(self) -> "MetricsWriter":
    return self

  def __exit__(self, *exc) -> None:
    self.close()
