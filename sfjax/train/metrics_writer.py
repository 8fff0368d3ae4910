"""The run's files: `config.json` and `metrics.jsonl` (one JSON object per eval)."""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

from sfjax.core.atomic import atomic_write


def read_records(path: str) -> list[dict[str, Any]]:
  """The JSON records of a `metrics.jsonl` ([] if absent); a torn or garbled line is skipped."""
  if not os.path.exists(path):
    return []
  records = []
  with open(path, encoding="utf-8") as f:
    for line in f:
      try:
        record = json.loads(line)
      except ValueError:
        continue
      if isinstance(record, dict):
        records.append(record)
  return records


class MetricsWriter:
  """Writes a run's config once and appends one line per eval record.

  With `workdir=None` nothing is written (a notebook run). Use as a context
  manager or call `close()`.
  """

  def __init__(self, workdir: str | None, config=None, resume_step: int | None = None):
    """Creates `workdir`, writes `config.json` (if `config`) and starts `metrics.jsonl`.

    With `resume_step` (a run resumed from the checkpoint of that step) the existing
    `metrics.jsonl` keeps its records with `step <= resume_step` (later ones, and a torn
    last line, were written after the checkpoint and will be written again) and new
    records are appended; otherwise it starts empty.
    """
    self.workdir = workdir
    self._file = None
    if not workdir:
      return
    os.makedirs(workdir, exist_ok=True)
    if config is not None:
      atomic_write(os.path.join(workdir, "config.json"), config.to_json_best_effort(indent=2))
    path = os.path.join(workdir, "metrics.jsonl")
    if resume_step is None:
      self._file = open(path, "w", encoding="utf-8")
      return
    kept = [json.dumps(r) + "\n" for r in read_records(path) if r.get("step", 0) <= resume_step]
    atomic_write(path, "".join(kept))
    self._file = open(path, "a", encoding="utf-8")

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
