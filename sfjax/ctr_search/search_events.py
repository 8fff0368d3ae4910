"""A search's TensorBoard curves: every finished trial's metrics, and the best so far.

`tensorboard --logdir=WORKDIR` of a running search shows

  trial/<metric>        each DONE trial's metrics (auc, logloss, params, flops, ...) at
                        step = its trial id
  search/best_<metric>  the best value of the objective metric after n DONE trials, at step n

The journal is the record; the event files are rebuilt from it when a search
resumes (old files removed, finished trials written again), so they never hold
duplicates.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from sfjax.automl.algorithms import TrialStatus
from sfjax.automl.study import TrialRecord
from sfjax.core.tensorboard import EventWriter


class SearchEvents:
  """Writes the finished trials of a study to TensorBoard event files in `workdir`.

  Args:
    workdir: the search's directory (old event files there are removed).
    metric: the objective metric tracked by `search/best_<metric>`.
    direction: 'maximize' or 'minimize'.
  """

  def __init__(self, workdir: str, metric: str, direction: str):
    self.metric, self.direction = metric, direction
    self._writer = EventWriter(workdir, fresh=True)
    self._written: set[int] = set()
    self._best: float | None = None

  def update(self, trials: Sequence[TrialRecord]) -> int:
    """Writes the DONE trials not written yet (by trial id); returns how many."""
    new = sorted((t for t in trials
                  if t.status == TrialStatus.DONE and t.trial_id not in self._written),
                 key=lambda t: t.trial_id)
    for t in new:
      self._writer.scalars(t.trial_id, t.metrics, prefix="trial/", skip=())
      self._written.add(t.trial_id)
      value = t.metrics.get(self.metric)
      if value is not None and math.isfinite(value) and (
          self._best is None or (value > self._best if self.direction == "maximize"
                                 else value < self._best)):
        self._best = float(value)
      if self._best is not None:
        self._writer.scalars(len(self._written), {f"best_{self.metric}": self._best},
                             prefix="search/")
    self._writer.flush()
    return len(new)

  def close(self) -> None:
    """Flushes and closes the event file."""
    self._writer.close()
