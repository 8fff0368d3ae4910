"""Figures from run / study / pipeline records: what is drawn, Pareto fronts per budget."""

import math

import numpy as np
import pytest

from sfjax.viz import plots


def _records():
  return [{"step": 10, "loss": 0.6, "eval_auc": 0.70, "oracle_eval_auc": 0.79,
           "examples_per_sec": 1000.0, "cache_hit_rate": 0.4, "h2d_bytes_per_example": 300.0,
           "d2h_bytes_per_example": 290.0},
          {"step": 20, "loss": 0.5, "eval_auc": 0.74, "oracle_eval_auc": 0.79,
           "examples_per_sec": float("nan"), "cache_hit_rate": 0.5}]


def test_training_figure_draws_each_series_it_has():
  fig = plots.plot_training(_records(), step_losses=[(1, 0.7), (2, 0.65)])
  loss_ax, auc_ax, speed_ax = fig.axes
  assert [line.get_label() for line in loss_ax.lines] == ["train loss (step)", "train loss (at eval)"]
  assert sorted(line.get_label() for line in auc_ax.lines) == ["eval_auc", "oracle_eval_auc"]
  np.testing.assert_allclose(auc_ax.lines[0].get_ydata(), [0.70, 0.74])
  assert list(speed_ax.lines[0].get_xdata()) == [10]  # the NaN throughput is not drawn


def test_cache_figure():
  fig = plots.plot_cache(_records())
  hit_ax, bytes_ax = fig.axes
  np.testing.assert_allclose(hit_ax.lines[0].get_ydata(), [0.4, 0.5])
  assert [len(line.get_xdata()) for line in bytes_ax.lines] == [1, 1]


def test_pareto_mask_by_hand():
  pts = [(1.0, 0.7), (2.0, 0.8), (2.0, 0.6), (3.0, 0.8), (0.5, 0.5)]
  # minimise x, maximise y: (2, 0.6) is dominated by (1, 0.7); (3, 0.8) by (2, 0.8)
  assert plots.pareto_mask(pts, ("minimize", "maximize")) == [True, True, False, False, True]
  with pytest.raises(ValueError, match="every point needs 2 coordinates"):
    plots.pareto_mask([(1.0, 0.7, 3.0)], ("minimize", "maximize"))


def _trial(i, budget, auc, params, status="done"):
  return {"trial_id": i, "budget": budget, "status": status,
          "metrics": {"auc": auc, "params": params}}


def test_pareto_fronts_are_per_budget_and_leaderboard_ranks():
  trials = [_trial(0, 1, 0.70, 10), _trial(1, 1, 0.72, 20), _trial(2, 1, 0.69, 30),
            _trial(3, 3, 0.75, 25), _trial(4, 3, 0.74, 5), _trial(5, 3, math.nan, 1),
            _trial(6, 3, 0.99, 1, status="failed")]
  fig = plots.plot_pareto(trials, "params", "auc")
  fronts = [[(float(x), float(y)) for x, y in zip(line.get_xdata(), line.get_ydata(), strict=True)]
            for line in fig.axes[0].lines]
  assert sorted(fronts) == [[(5, 0.74), (25, 0.75)], [(10, 0.70), (20, 0.72)]]
  fig = plots.plot_leaderboard(trials, "auc", "maximize", top_k=2)
  bars = fig.axes[0].patches
  assert [b.get_width() for b in bars] == pytest.approx([0.75, 0.74])
  assert fig.axes[0].get_title() == "top 2 of 5 finished trials"


def test_pipeline_figure_and_save(tmp_path):
  report = {"steps": [{"name": "nas", "status": "done", "wall_s": 3.0},
                      {"name": "fully_train", "status": "failed", "wall_s": 1.0}],
            "final_test_auc": 0.76, "baseline_test_auc": 0.75, "test_auc_interval": [0.002, 0.018]}
  fig = plots.plot_pipeline(report)
  assert "[+0.0020, +0.0180]" in fig.axes[1].get_title()
  assert [b.get_height() for b in fig.axes[1].patches] == [0.75, 0.76]
  report["test_auc_interval"] = {"diff": 0.01, "low": 0.003, "high": 0.017, "stderr": 0.003}
  assert "[+0.0030, +0.0170]" in plots.plot_pipeline(report).axes[1].get_title()
  path = plots.save_figure(fig, str(tmp_path / "sub" / "p.png"))
  with open(path, "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_latency_front_marks_the_chosen_model_and_its_delta_band():
  def trial(i, budget, auc, ms, status="done"):
    return {"trial_id": i, "budget": budget, "status": status,
            "metrics": {"auc": auc, "latency_ms": ms}}

  trials = [trial(0, 3, 0.80, 9.0), trial(1, 3, 0.797, 4.0), trial(2, 3, 0.79, 2.0),
            trial(3, 3, 0.78, 3.0), trial(4, 1, 0.99, 0.1), trial(5, 3, 0.9, 0.1, "failed")]
  fig = plots.plot_latency_front(trials, chosen=2, delta=0.01)
  ax = fig.axes[0]
  front = [(float(x), float(y)) for x, y in zip(ax.lines[0].get_xdata(), ax.lines[0].get_ydata(),
                                                strict=True)]
  assert front == [(2.0, 0.79), (4.0, 0.797), (9.0, 0.80)]  # budget 1 and the failed trial: out
  assert ax.get_title() == "auc vs latency_ms: 3 on the front of 4"
  assert ax.get_xscale() == "log"
  labels = ax.get_legend_handles_labels()[1]
  assert labels == ["trials", "front", "within ΔAUC 0.01", "chosen #2"]
  band = [p for p in ax.patches + ax.collections if p.get_label() == "within ΔAUC 0.01"][0]
  np.testing.assert_allclose([band.get_y(), band.get_y() + band.get_height()], [0.79, 0.80])
  chosen = [c for c in ax.collections if c.get_label() == "chosen #2"][0]
  np.testing.assert_allclose(chosen.get_offsets(), [[2.0, 0.79]])
  bare = plots.plot_latency_front(trials).axes[0]  # no selection: nothing marked
  assert bare.get_legend_handles_labels()[1] == ["trials", "front"]
