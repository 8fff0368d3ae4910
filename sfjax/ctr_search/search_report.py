"""The live leaderboard a search prints to stderr after each round.

    [search] 23/64 trials (2 failed, 1 rejected) in 1m32s | best auc 0.77120 (trial 17) | ...
     rank trial rung steps model      dim mlp    emb_opt  emb_lr   dense_lr auc     status
        1    17    2   450 deepfm       8 2x128  adagrad  0.0421   0.00120  0.77120 done

Finished trials are ranked by validation AUC (`auc`, the valid half of the eval rows;
failed ones last); the table shows the top k with the config values that matter most
to a reader (for PBT members, the learning rates they ended with: `final.<key>`
metrics). The default's AUC beside it is on the same split: the leaderboard, best.json
and the summary's `beats_default` share one selection split (issue #26).

After the trial loop, one line says how busy the workers were (`dispatch_line`):

    [dispatch] async on dask: 4 workers 87% busy | 32 trials in 2m10s (886 trials/hour)

A multi-objective search ends with its Pareto front per budget (`pareto_report`):

    [pareto] budget 4: 3 trials on the front (auc max, params min)
      trial    12  auc 0.77120  params 3.45e+03
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from sfjax.automl.algorithms import ENDED_STATUSES, TrialStatus
from sfjax.automl.study import TrialRecord

if TYPE_CHECKING:
  from sfjax.ctr_search.dispatch import DispatchRecord

_COLUMNS = (("rank", 4), ("trial", 5), ("rung", 4), ("steps", 5), ("model", 10), ("dim", 3),
            ("mlp", 6), ("emb_opt", 7), ("emb_lr", 8), ("dense_lr", 8), ("auc", 7),
            ("status", 6))


def ranked(trials: Sequence[TrialRecord]) -> list[TrialRecord]:
  """Finished trials, best validation AUC first; failed / pruned ones last (by id)."""
  finished = [t for t in trials if t.status in ENDED_STATUSES]

  def key(t):
    auc = t.metrics.get("auc", math.nan)
    ok = t.status == TrialStatus.DONE and math.isfinite(auc)
    return (0, -auc, t.trial_id) if ok else (1, 0.0, t.trial_id)

  return sorted(finished, key=key)


def _fmt(value, spec: str) -> str:
  if value is None or (isinstance(value, float) and not math.isfinite(value)):
    return "-"
  return format(value, spec)


def _model_label(config) -> str:
  """A trial's named model, or its generated model's blocks (`model.<block>.use` switched on,
  joined by '+'), or '-'."""
  if "model.name" in config:
    return str(config["model.name"])
  used = sorted(k[len("model."):-len(".use")] for k, v in config.items()
                if k.startswith("model.") and k.endswith(".use") and v is True)
  return "+".join(used) or "-"


def _row(rank: int, t: TrialRecord) -> list[str]:
  c, m = t.config, t.metrics
  mlp = f"{c['model.mlp.depth']}x{c['model.mlp.width']}" if "model.mlp.depth" in c else "-"
  return [str(rank), str(t.trial_id), _fmt(t.suggestion.rung, "d"), _fmt(m.get("steps"), ".0f"),
          _model_label(c), _fmt(c.get("model.embed_dim"), "d"), mlp,
          str(c.get("embedding.optimizer", "-")),
          _fmt(_hparam(t, "embedding.learning_rate"), ".4g"),
          _fmt(_hparam(t, "optimizer.learning_rate"), ".3g"), _fmt(m.get("auc"), ".5f"), t.status.value]


def _metric(value) -> str:
  """A metric for reading: 5 decimals when small (AUC, logloss), else 3 significant digits."""
  return _fmt(value, ".5f" if value is not None and abs(value) < 10 else ".3g")


def _hparam(t: TrialRecord, key: str):
  """A hyperparameter as trained last: PBT's final value if recorded, else the config's."""
  return t.metrics.get(f"final.{key}", t.config.get(key))


def _duration(seconds: float) -> str:
  minutes, secs = divmod(int(round(seconds)), 60)
  return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def leaderboard(trials: Sequence[TrialRecord], top_k: int, default_auc: float | None,
                num_trials: int, elapsed_s: float) -> str:
  """The progress line and the top-`top_k` table (a string ending in a newline).

  Args:
    trials: every trial of the study (`Study.trials()`).
    top_k: rows of the table (0: only the progress line).
    default_auc: the default config's validation AUC (`auc`, the split trials are ranked
      on), or None.
    num_trials: the number of trials the search aims for.
    elapsed_s: wall time of this run so far.
  """
  order = ranked(trials)
  done = sum(t.status in ENDED_STATUSES for t in trials)
  failed = sum(t.status == TrialStatus.FAILED for t in trials)
  rejected = sum(t.status == TrialStatus.REJECTED for t in trials)
  head = f"[search] {done}/{num_trials} trials ({failed} failed, {rejected} rejected) in " \
         f"{_duration(elapsed_s)}"
  best = order[0] if order and order[0].status == TrialStatus.DONE else None
  if best is not None and math.isfinite(best.metrics.get("auc", math.nan)):
    head += f" | best auc {best.metrics['auc']:.5f} (trial {best.trial_id})"
  if default_auc is not None:
    head += f" | default auc {_fmt(default_auc, '.5f')}"
  lines = [head]
  if top_k and order:
    widths = [w for _, w in _COLUMNS]
    table = [[name for name, _ in _COLUMNS]] + [_row(i + 1, t) for i, t in
                                                 enumerate(order[:top_k])]
    for cells in table:
      lines.append(" " + " ".join(cell.rjust(w) if i < 4 or i == 5 else cell.ljust(w)
                                  for i, (cell, w) in enumerate(zip(cells, widths, strict=True))).rstrip())
  return "\n".join(lines) + "\n"


def pareto_report(fronts: Sequence[tuple[float | None, Sequence[TrialRecord]]],
                  directions: Mapping[str, str]) -> str:
  """The Pareto front of each budget (`Study.pareto_fronts()`), one block per budget.

  Args:
    fronts: `(budget, front trials)` pairs, smallest budget first (budget None:
      a study without budgets).
    directions: metric -> 'maximize' / 'minimize', the columns shown.
  """
  names = ", ".join(f"{m} {d[:3]}" for m, d in directions.items())
  lines = []
  for budget, front in fronts:
    where = "" if budget is None else f" budget {budget:g}:"
    lines.append(f"[pareto]{where} {len(front)} trials on the front ({names})")
    for t in sorted(front, key=lambda t: [t.metrics.get(m, math.nan) for m in directions]):
      values = "  ".join(f"{m} {_metric(t.metrics.get(m))}" for m in directions)
      lines.append(f"  trial {t.trial_id:5d}  {values}")
  return "\n".join(lines) + "\n" if lines else ""


def dispatch_line(record: DispatchRecord) -> str:
  """One line (ending in a newline) of a trial loop's `dispatch.DispatchRecord`."""
  busy = "-" if record.worker_busy_fraction is None else f"{record.worker_busy_fraction:.0%}"
  rate = "-" if record.trials_per_hour is None else f"{record.trials_per_hour:.0f}"
  line = (f"[dispatch] {record.schedule} on {record.executor}: {record.slots} workers {busy} "
          f"busy | {record.trials} trials in {_duration(record.wall_seconds)} ({rate} "
          f"trials/hour)")
  if record.requeued_jobs:
    line += f" | {record.requeued_jobs} jobs re-queued after a lost worker"
  return line + "\n"
