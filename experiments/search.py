"""AutoML search over the CTR space (by default generated models, `search_spaces/default.py`).

  python -m experiments.search --config=experiments/configs/search_ctr.py --workdir=DIR

Any config field can be overridden, e.g. `--config.study.algorithm=tpe
--config.study.num_trials=32 --config.study.cohort_width=4 --config.seed=1`; an
algorithm's settings are in its block (`--config.study.tpe.n_startup_trials=4`,
`--config.study.asha.eta=2`: a flat `--config.study.eta` is refused, naming the block).
Multi-objective: `--config.study.algorithm=nsga2 --config.study.objectives=auc:max,params:min`
(or motpe; best.json then holds the Pareto front per budget). Across processes or
machines: `--config.study.executor=dask` (a local cluster of `study.dask_workers`
processes, or an existing scheduler at `--config.study.dask_address=tls://HOST:8786?ca=..&cert=..&key=..` (README)).
Rerunning the same command on the same DIR resumes the study; a second run on the same
DIR while one runs fails at once naming it. Errors print one line `error: ...` (exit 2
for a bad flag, config or workdir, 1 otherwise); `--verbose` adds the traceback. Prints a live
leaderboard to stderr, writes DIR/trials.jsonl and DIR/best.json, and ends stdout
with one JSON line: the summary of `sfjax.ctr_search.search_loop.run_search`.
"""

import json
import math
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from experiments import cli
from search_spaces import default as default_space
from sfjax.automl.study import JournalLockedError, StudyError
from sfjax.core import set_up_console
from sfjax.ctr_search import SearchConfigError, check_flag_overrides, run_search


def _finite(value):
  """JSON-safe copy: non-finite floats become null."""
  if isinstance(value, dict):
    return {k: _finite(v) for k, v in value.items()}
  if isinstance(value, float) and not math.isfinite(value):
    return None
  return value


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  set_up_console(logging.INFO)  # our progress lines; orbax and jax INFO chatter off
  # run_search holds the workdir's lock itself (one owner per workdir, issue #25).
  summary = run_search(_CONFIG.value, _WORKDIR.value, default_space.SEARCH_SPACE)
  sys.stdout.write(json.dumps(_finite(summary), sort_keys=True, allow_nan=False) + "\n")
  sys.stdout.flush()


def refuse_flat_settings(argv) -> None:
  """Exits (status 2, one line) on a flat algorithm setting such as `--config.study.eta`,
  before the flags are parsed (ml_collections would stop with a traceback)."""
  try:
    check_flag_overrides(argv)
  except SearchConfigError as e:
    sys.stderr.write(f"error: {e}\n")
    sys.exit(2)


if __name__ == "__main__":
  refuse_flat_settings(sys.argv)
  # Flags are defined only when run as a script, so every module of experiments/
  # imports into one process (a test, a notebook) without a DuplicateFlagError.
  _CONFIG = config_flags.DEFINE_config_file("config", None, "Python config file (ml_collections).",
                                            lock_config=True)
  _WORKDIR = flags.DEFINE_string("workdir", None,
                                  "Directory of the study (journal, states, exports).")
  flags.mark_flags_as_required(["config", "workdir"])
  # Exit 2 also for a study that does not fit the workdir and an unreachable scheduler.
  cli.run_main(main, usage=(SearchConfigError, StudyError, JournalLockedError, ConnectionError))
