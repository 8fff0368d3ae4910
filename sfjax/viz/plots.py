"""Figures of a run, a study and a pipeline, from the JSON files they write (matplotlib).

Each `plot_*` function takes plain records (what `metrics.jsonl`, `trials.jsonl`,
`best.json` and `report.json` hold, as lists of dicts) and returns a matplotlib
`Figure`, so a notebook can show it and `save_figure` can write it. `write_plots(DIR)`
finds those files under a workdir and writes one PNG beside each
(`python -m experiments.plot --workdir=DIR`).

No backend is forced: matplotlib picks Agg on a machine without a display and the
inline backend in a notebook.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from matplotlib import pyplot as plt
from matplotlib.figure import Figure

from sfjax.core.jsonl import read_jsonl  # re-exported: plots.read_jsonl(path) for notebooks

__all__ = [
  "CACHE_KEYS", "pareto_mask", "plot_cache", "plot_latency_front", "plot_leaderboard",
  "plot_pareto", "plot_pipeline", "plot_training", "read_jsonl", "save_figure",
]

CACHE_KEYS = ("cache_hit_rate", "h2d_bytes_per_example", "d2h_bytes_per_example")


def _finite(v: Any) -> bool:
  return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _series(records: Sequence[Mapping[str, Any]], key: str) -> tuple[list[float], list[float]]:
  """(steps, values) of the records holding a finite `key` (and a step)."""
  pts = [(r["step"], r[key]) for r in records if _finite(r.get(key)) and _finite(r.get("step"))]
  return [p[0] for p in pts], [p[1] for p in pts]


def plot_training(records: Sequence[Mapping[str, Any]],
                  step_losses: Sequence[tuple[int, float]] = ()) -> Figure:
  """Training curves of one run: loss, every split's AUC (and the oracle's), throughput.

  Args:
    records: `metrics.jsonl` records (`step`, `loss`, `<split>_auc`, `oracle_<split>_auc`,
      `examples_per_sec`).
    step_losses: optional per-step train losses [(step, loss)] (the TensorBoard
      `train/loss` series) drawn under the per-eval loss.
  """
  fig, (ax_loss, ax_auc, ax_speed) = plt.subplots(1, 3, figsize=(13, 3.6))
  if step_losses:
    ax_loss.plot([s for s, _ in step_losses], [v for _, v in step_losses], lw=0.6, alpha=0.5,
                 label="train loss (step)")
  steps, loss = _series(records, "loss")
  ax_loss.plot(steps, loss, "o-", label="train loss (at eval)")
  ax_loss.set(xlabel="step", ylabel="logloss", title="loss")
  auc_keys = sorted({k for r in records for k in r if k.endswith("_auc")})
  for key in auc_keys:
    s, v = _series(records, key)
    ax_auc.plot(s, v, "--" if key.startswith("oracle_") else "o-", label=key)
  ax_auc.set(xlabel="step", ylabel="AUC", title="held-out AUC")
  s, v = _series(records, "examples_per_sec")
  ax_speed.plot(s, v, "o-")
  ax_speed.set(xlabel="step", ylabel="examples / s", title="throughput")
  for ax in (ax_loss, ax_auc):
    if ax.lines:
      ax.legend(fontsize=7)
  fig.tight_layout()
  return fig


def plot_cache(records: Sequence[Mapping[str, Any]]) -> Figure:
  """The MixCache over a run: hit rate and host<->device bytes per example per eval window."""
  fig, (ax_hit, ax_bytes) = plt.subplots(1, 2, figsize=(9, 3.6))
  s, v = _series(records, "cache_hit_rate")
  ax_hit.plot(s, v, "o-")
  ax_hit.set(xlabel="step", ylabel="hit rate", title="cache hit rate", ylim=(0, 1.02))
  for key, label in (("h2d_bytes_per_example", "host -> device"),
                     ("d2h_bytes_per_example", "device -> host")):
    s, v = _series(records, key)
    ax_bytes.plot(s, v, "o-", label=label)
  ax_bytes.set(xlabel="step", ylabel="bytes / example", title="cache traffic")
  ax_bytes.legend(fontsize=7)
  fig.tight_layout()
  return fig


def _done(trials: Sequence[Mapping[str, Any]], metric: str) -> list[Mapping[str, Any]]:
  return [t for t in trials if t.get("status") == "done"
          and _finite((t.get("metrics") or {}).get(metric))]


def plot_leaderboard(trials: Sequence[Mapping[str, Any]], metric: str = "auc",
                     direction: str = "maximize", top_k: int = 15) -> Figure:
  """The best `top_k` finished trials by `metric` (horizontal bars, best on top), and every
  finished trial's `metric` against its budget."""
  done = _done(trials, metric)
  ranked = sorted(done, key=lambda t: t["metrics"][metric], reverse=direction == "maximize")
  top = ranked[:top_k]
  fig, (ax_bar, ax_budget) = plt.subplots(1, 2, figsize=(11, 0.35 * max(len(top), 4) + 1.5))
  labels = [f"#{t['trial_id']} (budget {t.get('budget')})" for t in top]
  values = [t["metrics"][metric] for t in top]
  ax_bar.barh(range(len(top))[::-1], values)
  ax_bar.set_yticks(range(len(top))[::-1], labels, fontsize=7)
  if values:
    lo, hi = min(values), max(values)
    pad = (hi - lo) * 0.1 or abs(hi) * 0.01 or 0.01
    ax_bar.set_xlim(lo - pad, hi + pad)
  ax_bar.set(xlabel=metric, title=f"top {len(top)} of {len(done)} finished trials")
  ax_budget.scatter([t.get("budget") or 0 for t in done], [t["metrics"][metric] for t in done],
                    s=12, alpha=0.7)
  ax_budget.set(xlabel="budget", ylabel=metric, title=f"{metric} by budget")
  fig.tight_layout()
  return fig


def pareto_mask(points: Sequence[Sequence[float]], directions: Sequence[str]) -> list[bool]:
  """True for each point no other point dominates (`directions`: 'maximize'/'minimize')."""
  if any(len(p) != len(directions) for p in points):
    raise ValueError(f"pareto_mask: every point needs {len(directions)} coordinates, one per "
                     f"direction {tuple(directions)}")
  signs = [1.0 if d == "minimize" else -1.0 for d in directions]
  pts = [[s * x for s, x in zip(signs, p, strict=True)] for p in points]
  mask = []
  for i, p in enumerate(pts):
    dominated = any(all(a <= b for a, b in zip(q, p, strict=True))
                    and any(a < b for a, b in zip(q, p, strict=True))
                    for j, q in enumerate(pts) if j != i)
    mask.append(not dominated)
  return mask


def plot_pareto(trials: Sequence[Mapping[str, Any]], x: str, y: str,
                directions: tuple[str, str] = ("minimize", "maximize")) -> Figure:
  """Finished trials in the (`x`, `y`) metric plane, one colour per budget, with the
  non-dominated front of each budget joined (fronts are never mixed across budgets)."""
  done = [t for t in trials if t.get("status") == "done"
          and _finite((t.get("metrics") or {}).get(x)) and _finite(t["metrics"].get(y))]
  fig, ax = plt.subplots(figsize=(6, 4.5))
  budgets = sorted({t.get("budget") or 0 for t in done})
  for budget in budgets:
    group = [t for t in done if (t.get("budget") or 0) == budget]
    pts = [(t["metrics"][x], t["metrics"][y]) for t in group]
    sc = ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=14, alpha=0.6,
                    label=f"budget {budget}")
    front = sorted(p for p, m in zip(pts, pareto_mask(pts, directions), strict=True) if m)
    ax.plot([p[0] for p in front], [p[1] for p in front], "-", color=sc.get_facecolor()[0])
  ax.set(xlabel=f"{x} ({directions[0]})", ylabel=f"{y} ({directions[1]})", title="Pareto fronts")
  if budgets:
    ax.legend(fontsize=7)
  fig.tight_layout()
  return fig


def plot_latency_front(trials: Sequence[Mapping[str, Any]], chosen: int | None = None,
                       delta: float | None = None, auc: str = "auc",
                       latency: str = "latency_ms") -> Figure:
  """A hardware-aware search's AUC-latency trade-off (issue #26): finished trials of the
  largest budget reached, their front joined, and the chosen model.

  Args:
    trials: `trials.jsonl` records.
    chosen: trial id of the selected model (e.g. `tradeoff.select_within_auc`'s), ringed.
    delta: the ΔAUC it was selected within: the band [best - delta, best] is shaded.
    auc, latency: the metrics on the y (maximised) and x (minimised, log scale) axes.
  """
  done = [t for t in trials if t.get("status") == "done"
          and _finite((t.get("metrics") or {}).get(auc)) and _finite(t["metrics"].get(latency))]
  budgets = [t["budget"] for t in done if _finite(t.get("budget"))]
  if budgets:  # low-fidelity results never compete with full ones
    done = [t for t in done if t.get("budget") == max(budgets)]
  pts = [(t["metrics"][latency], t["metrics"][auc]) for t in done]
  mask = pareto_mask(pts, ("minimize", "maximize"))
  fig, ax = plt.subplots(figsize=(6, 4.5))
  ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=14, alpha=0.5, color="tab:gray",
             label="trials")
  front = sorted(p for p, m in zip(pts, mask, strict=True) if m)
  ax.plot([p[0] for p in front], [p[1] for p in front], "o-", color="tab:blue", label="front")
  if front and delta is not None and _finite(delta):
    top = max(p[1] for p in front)
    ax.axhspan(top - delta, top, color="tab:green", alpha=0.12, label=f"within ΔAUC {delta:g}")
  picked = [p for t, p in zip(done, pts, strict=True) if t.get("trial_id") == chosen]
  if picked:
    ax.scatter([picked[0][0]], [picked[0][1]], s=120, facecolors="none", edgecolors="tab:red",
               linewidths=2, label=f"chosen #{chosen}")
  if pts and min(p[0] for p in pts) > 0:
    ax.set_xscale("log")
  ax.set(xlabel=f"{latency} (minimize)", ylabel=f"{auc} (maximize)",
         title=f"{auc} vs {latency}: {sum(mask)} on the front of {len(pts)}")
  if pts:
    ax.legend(fontsize=7)
  fig.tight_layout()
  return fig


def plot_pipeline(report: Mapping[str, Any]) -> Figure:
  """A pipeline report: wall time and status per step, and the final model's test AUC
  against the unsearched baseline's (with the reported interval of their difference)."""
  steps = list(report.get("steps") or [])
  fig, (ax_time, ax_auc) = plt.subplots(1, 2, figsize=(10, 3.6))
  colours = {"done": "tab:green", "failed": "tab:red", "skipped": "tab:gray"}
  ax_time.barh(range(len(steps))[::-1], [s.get("wall_s") or 0.0 for s in steps],
               color=[colours.get(s.get("status"), "tab:blue") for s in steps])
  ax_time.set_yticks(range(len(steps))[::-1], [f"{s.get('name')} ({s.get('status')})"
                                               for s in steps], fontsize=8)
  ax_time.set(xlabel="wall seconds", title="pipeline steps")
  names, values = [], []
  for key, label in (("baseline_test_auc", "baseline"), ("final_test_auc", "final")):
    if _finite(report.get(key)):
      names.append(label)
      values.append(report[key])
  ax_auc.bar(names, values, color=["tab:gray", "tab:green"][:len(values)])
  if values:
    lo, hi = min(values), max(values)
    pad = max((hi - lo) * 0.5, 0.002)
    ax_auc.set_ylim(lo - pad, hi + pad)
  interval = report.get("test_auc_interval")
  if isinstance(interval, Mapping):  # the pipeline's paired bootstrap: {diff, low, high, ...}
    interval = (interval.get("low"), interval.get("high"))
  title = "test AUC"
  if isinstance(interval, Sequence) and len(interval) == 2 and all(map(_finite, interval)):
    title += f" (final - baseline in [{interval[0]:+.4f}, {interval[1]:+.4f}])"
  ax_auc.set(ylabel="AUC", title=title)
  fig.tight_layout()
  return fig


def save_figure(fig: Figure, path: str) -> str:
  """Writes `fig` as a PNG at `path` (directories created) and closes it; returns `path`."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path
