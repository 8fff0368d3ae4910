"""What a study records about one trial, and the study's error type.

A `TrialRecord` is immutable: a `tell` (or a journal's tell event) makes a new
one (`finished`); `running` looks a trial up for a tell or a re-queue and names
what is wrong when it is not running.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from sfjax.automl.algorithms.base import Suggestion, TrialStatus
from sfjax.automl.space import Config


class StudyError(RuntimeError):
  """Misuse of a study, or a study reopened with different settings."""


@dataclasses.dataclass(frozen=True)
class TrialRecord:
  """Everything recorded about one trial (one suggestion, i.e. one rung of a config).

  Times are Unix seconds; `started_at` is the latest hand-out (after a re-queue),
  `attempts` counts hand-outs.
  """

  suggestion: Suggestion
  status: TrialStatus
  metrics: Mapping[str, float]
  reason: str | None
  asked_at: float
  started_at: float
  finished_at: float | None
  elapsed_s: float | None
  attempts: int

  @property
  def trial_id(self) -> int:
    """The trial's id."""
    return self.suggestion.trial_id

  @property
  def config(self) -> Config:
    """The trial's config."""
    return self.suggestion.config

  def to_dict(self) -> dict[str, Any]:
    """The `trials.jsonl` line: trial_id, config, metrics, status, then the rest."""
    s = self.suggestion
    return {"trial_id": s.trial_id, "config": s.config.to_dict(),
            "metrics": {k: _json_float(v) for k, v in self.metrics.items()},
            "status": self.status.value, "budget": s.budget, "rung": s.rung,
            "bracket": s.bracket, "parent_trial_id": s.parent_trial_id,
            "resume_from": s.resume_from, "reason": self.reason, "asked_at": self.asked_at,
            "started_at": self.started_at, "finished_at": self.finished_at,
            "elapsed_s": self.elapsed_s, "attempts": self.attempts}


def _json_float(v: float) -> float | None:
  return v if math.isfinite(v) else None


def asked(suggestion: Suggestion, now: float) -> TrialRecord:
  """The record of a trial handed out for the first time at `now`."""
  return TrialRecord(suggestion, TrialStatus.RUNNING, {}, None, now, now, None, None, 1)


def handed_out_again(t: TrialRecord, now: float) -> TrialRecord:
  """`t` handed out once more at `now` (a re-queue): one more attempt."""
  return dataclasses.replace(t, started_at=now, attempts=t.attempts + 1)


def finished(t: TrialRecord, record: Mapping[str, Any]) -> TrialRecord:
  """`t` after the tell event `record` (status, metrics, reason, time, elapsed_s)."""
  return dataclasses.replace(
      t, status=TrialStatus(record["status"]), metrics=dict(record["metrics"]),
      reason=record.get("reason"), finished_at=record["time"], elapsed_s=record.get("elapsed_s"))


def running(trials: Mapping[int, TrialRecord], trial_id: int) -> TrialRecord:
  """The record of running trial `trial_id`.

  Raises:
    StudyError: it was never asked, or it already finished.
  """
  t = trials.get(trial_id)
  if t is None:
    raise StudyError(f"trial {trial_id} was never asked")
  if t.status != TrialStatus.RUNNING:
    raise StudyError(f"trial {trial_id} already finished with status {t.status.value!r}")
  return t
