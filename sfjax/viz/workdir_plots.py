"""Every figure a workdir's files support, written as PNGs beside those files.

  metrics.jsonl (+ TensorBoard train/loss)   -> training_curves.png, cache_curves.png (cache runs)
  trials.jsonl + best.json (any depth)       -> leaderboard.png, pareto.png (multi-objective)
  report.json (a pipeline)                   -> pipeline.png

Used by `python -m experiments.plot --workdir=DIR`.
"""

from __future__ import annotations

import json
import os
from typing import Any

from sfjax.core import tensorboard
from sfjax.viz import plots

_SKIP_DIRS = ("checkpoints", "trial_states")


def _read_json(path: str) -> dict[str, Any] | None:
  try:
    with open(path, encoding="utf-8") as f:
      value = json.load(f)
  except (OSError, ValueError):
    return None
  return value if isinstance(value, dict) else None


def _run_plots(directory: str) -> list[str]:
  records = plots.read_jsonl(os.path.join(directory, "metrics.jsonl"))
  if not records:
    return []
  step_losses = tensorboard.read_scalars(directory).get("train/loss", [])
  out = [plots.save_figure(plots.plot_training(records, step_losses),
                           os.path.join(directory, "training_curves.png"))]
  if any("cache_hit_rate" in r for r in records):
    out.append(plots.save_figure(plots.plot_cache(records),
                                 os.path.join(directory, "cache_curves.png")))
  return out


def _objectives(best: dict[str, Any] | None) -> tuple[str, str, dict[str, str]]:
  """(metric, direction, directions of a multi-objective study or {}) from best.json."""
  objective = (best or {}).get("objective") or {}
  directions = (best or {}).get("directions") or {}
  return (objective.get("metric", "auc"), objective.get("direction", "maximize"),
          directions if isinstance(directions, dict) else {})


def _study_plots(directory: str) -> list[str]:
  trials = plots.read_jsonl(os.path.join(directory, "trials.jsonl"))
  if not trials:
    return []
  metric, direction, directions = _objectives(_read_json(os.path.join(directory, "best.json")))
  out = [plots.save_figure(plots.plot_leaderboard(trials, metric, direction),
                           os.path.join(directory, "leaderboard.png"))]
  if len(directions) >= 2:
    (y, dy), (x, dx) = list(directions.items())[:2]
    out.append(plots.save_figure(plots.plot_pareto(trials, x, y, (dx, dy)),
                                 os.path.join(directory, "pareto.png")))
  return out


def write_plots(workdir: str) -> list[str]:
  """Writes every figure the files under `workdir` support; returns the PNG paths.

  Raises:
    FileNotFoundError: `workdir` is not a directory.
  """
  if not os.path.isdir(workdir):
    raise FileNotFoundError(f"{workdir}: not a directory")
  out = []
  for directory, dirnames, filenames in os.walk(workdir):
    dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
    if "metrics.jsonl" in filenames:
      out += _run_plots(directory)
    if "trials.jsonl" in filenames:
      out += _study_plots(directory)
    if "report.json" in filenames:
      report = _read_json(os.path.join(directory, "report.json"))
      if report is not None and isinstance(report.get("steps"), list):
        out.append(plots.save_figure(plots.plot_pipeline(report),
                                     os.path.join(directory, "pipeline.png")))
  return out
