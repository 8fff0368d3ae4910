"""A search's TensorBoard curves: every finished trial's metrics, and the best so far.

`tensorboard --logdir=WORKDIR` of a running search shows

  trial/<metric>        each DONE trial's metrics (auc, logloss, params, flops, ...) at
                        step = its trial id
  search/best_<metric>  the best value of the objective metric after n DONE trials, at step n

The journal is the record; the event files are rebuilt from it when a search
resumes (old files removed, finished trials written again), so they never hold
duplicates.

With `study.optuna_storage` set (a journal file `*.log` / `*.jsonl`, or
`sqlite:///path.db`), every update is also mirrored to that Optuna storage
(`sfjax.automl.study.optuna_mirror`, issue #26): `optuna-dashboard <storage>` shows
the search live, running trials included; a resumed search adds no trial twice.
`study.optuna_study_name` names the Optuna study ('' = the workdir's base name).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence

from sfjax.automl.algorithms import Objective, TrialStatus
from sfjax.automl.space import Space
from sfjax.automl.study import TrialRecord
from sfjax.automl.study.optuna_mirror import OptunaMirror
from sfjax.core.tensorboard import EventWriter
from sfjax.ctr_search import search_config
from sfjax.ctr_search.search_config import SearchConfigError


def open_mirror(config, workdir: str, space: Space, objective: Objective,
                step_of_budget: Callable[[float], int]) -> OptunaMirror | None:
  """The search's Optuna mirror (`study.optuna_storage`, `study.optuna_study_name`), or
  None when `study.optuna_storage` is ''.

  Args:
    config: the search config; workdir: the search's directory (the mirror's owner).
    space, objective: the study's; step_of_budget: budget -> training steps (the steps
      of intermediate values).

  Raises:
    SearchConfigError: a bad storage or name, or the Optuna study belongs to another
      workdir or has other directions (the message names the field).
  """
  storage = search_config.study_field(config, "optuna_storage")
  if storage == "":
    return None
  name = search_config.study_field(config, "optuna_study_name") or os.path.basename(
      os.path.abspath(workdir))
  try:
    return OptunaMirror.open(storage, name, space, objective, owner=os.path.abspath(workdir),
                             step_of_budget=step_of_budget)
  except ValueError as e:
    raise SearchConfigError(str(e)) from None


class SearchEvents:
  """Writes the finished trials of a study to TensorBoard event files in `workdir`.

  Args:
    workdir: the search's directory (old event files there are removed).
    metric: the objective metric tracked by `search/best_<metric>`.
    direction: 'maximize' or 'minimize'.
    mirror: an `OptunaMirror` each `update` also writes (running trials included).
  """

  def __init__(self, workdir: str, metric: str, direction: str,
               mirror: OptunaMirror | None = None):
    self.metric, self.direction, self.mirror = metric, direction, mirror
    self._writer = EventWriter(workdir, fresh=True)
    self._written: set[int] = set()
    self._best: float | None = None

  def update(self, trials: Sequence[TrialRecord]) -> int:
    """Writes the DONE trials not written yet (by trial id); returns how many. The mirror
    (if any) gets every trial: new ones, running or final, and those told since."""
    if self.mirror is not None:
      self.mirror.update(trials)
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
    """Flushes and closes the event file (and the mirror's storage)."""
    self._writer.close()
    if self.mirror is not None:
      self.mirror.close()
