"""Figures of a workdir: `python -m experiments.plot --workdir=DIR`.

Writes PNGs beside the files they come from (`sfjax/viz/workdir_plots.py`): training
and cache curves of a run (metrics.jsonl and its TensorBoard loss), the leaderboard
and Pareto fronts of every study (trials.jsonl, best.json), and a pipeline's report
(report.json). Prints the written paths as one JSON line.
"""

import json

from absl import app, flags

from experiments import cli
from sfjax.viz import write_plots


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  written = write_plots(_WORKDIR.value)
  if not written:
    raise app.UsageError(f"{_WORKDIR.value}: no metrics.jsonl, trials.jsonl or report.json "
                         "to plot")
  print(json.dumps({"workdir": _WORKDIR.value, "plots": written}))


if __name__ == "__main__":
  # Flags are defined only when run as a script, so every module of experiments/
  # imports into one process (a test, a notebook) without a DuplicateFlagError.
  _WORKDIR = flags.DEFINE_string("workdir", None, "A run's, search's or pipeline's workdir.")
  flags.mark_flags_as_required(["workdir"])
  cli.run_main(main, usage=(ValueError,))
