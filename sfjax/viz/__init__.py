"""Figures from the files runs, studies and pipelines write (matplotlib).

`write_plots(workdir)` draws every figure a workdir's files allow; the `plot_*`
functions draw one each from records read with `sfjax.core.read_jsonl`.
"""

from sfjax.viz.plots import (
  pareto_mask,
  plot_cache,
  plot_latency_front,
  plot_leaderboard,
  plot_pareto,
  plot_pipeline,
  plot_training,
  save_figure,
)
from sfjax.viz.workdir_plots import write_plots

__all__ = ["pareto_mask", "plot_cache", "plot_latency_front", "plot_leaderboard", "plot_pareto", "plot_pipeline",
           "plot_training", "save_figure", "write_plots"]
