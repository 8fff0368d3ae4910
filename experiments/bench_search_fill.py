"""How full a real search's cohorts are: the default search, ragged cohorts on and off.

  python -m experiments.bench_search_fill [--config=experiments/configs/bench_search_fill.py[:smoke]]
      [--config.space=ctr|blocks --config.modes=ragged,exact,free --config.out=fill.json]

Runs `experiments.search`'s search (`search_loop.run_search`, the search config
`config.search`, by default experiments/configs/search_ctr.py: ASHA over the default
CTR space; `config.space=blocks`: over the generated models of `search_spaces/blocks.py`)
once per mode, each in a fresh workdir, on the same data and seed:
  * `ragged`: merged cohorts (`study.fill_cohorts`: a round's free proposals in as
    few programs as possible, row optimizers chosen per lane) and ragged cohorts
    (`study.ragged_cohorts`): ASHA's promotions and new trials of one bucket share
    one program (the default);
  * `exact`: merged cohorts, one program per exact step range;
  * `free`: no merging (one program per shape bucket and row optimizer), one
    program per exact step range.
Every mode trains the algorithm's own proposals (issue #26: fill never resamples
inside a bucket), so all three try the same configs on a random search.
For each it prints `pairs_tried` (distinct (model.name, embedding.optimizer) of the
trials), `families_tried`, `optimizers_tried`, `mean_cohort_width` (trials per vmapped program),
`lane_utilization` (trained trial-steps over the trial-steps the programs ran),
wall seconds end to end (data, compiles, the default config's run, host metrics
and state saving included; compiled programs are dropped between modes), trials
per hour, and the best trial's valid and test AUC. `ragged` and `exact` run the
same study (the asks do not depend on how a round is split into programs, and a
ragged program trains each trial as alone, `tests/ctr_search/ragged_test.py`), so
their best AUCs agree to float tolerance; `free` asks other configs.
`run(config)` returns the figures; the command ends stdout with them as one JSON
line (also written to `config.out`).

Old flag -> config field: `--config=FILE` (the search config) -> `config.search`
(`--config.task.X` -> `--config.search.task.X`, and so on), `--modes` ->
`config.modes`, `--space` -> `config.space`, `--out` -> `config.out`.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import jax
import ml_collections

from experiments import cli
from search_spaces import blocks as blocks_space
from search_spaces import default as default_space
from sfjax.cohorts import cohort_program
from sfjax.core import ConfigError
from sfjax.ctr_search import run_search

MODES = {"ragged": (True, True), "exact": (True, False), "free": (False, False)}
# 'ctr': the default space (generated models; the named families when space.families names any).
SPACES = {"ctr": default_space.SEARCH_SPACE, "blocks": blocks_space.BLOCK_SEARCH_SPACE}


def _family(config) -> Any:
  """A trial's named model, or a generated model's block combination (its `.use` switches on)."""
  if "model.name" in config:
    return config["model.name"]
  return (config.get("model.combine"), *sorted(k for k, v in config.items()
                                               if k.endswith(".use") and v is True))


def tried_counts(trials_path: str) -> dict[str, int]:
  """Distinct (model.name, embedding.optimizer) pairs, families and row optimizers among
  the trained (done or failed) trials of a study's `trials.jsonl`."""
  with open(trials_path, encoding="utf-8") as f:
    trials = [json.loads(line) for line in f if line.strip()]
  pairs = {(_family(t["config"]), t["config"].get("embedding.optimizer"))
           for t in trials if t.get("status") in ("done", "failed")}
  return {"pairs_tried": len(pairs), "families_tried": len({p[0] for p in pairs}),
          "optimizers_tried": len({p[1] for p in pairs})}


def measure(search_config, modes: Sequence[str], space: str = "ctr") -> dict[str, Any]:
  """Runs the search of `search_config` over `SPACES[space]` once per mode (names of
  `MODES`) in a fresh workdir; its figures per mode."""
  out = {}
  for mode in modes:
    # Every mode compiles its own programs: none reuses another mode's executables.
    cohort_program.cache_clear()
    jax.clear_caches()
    c = search_config.copy_and_resolve_references()
    c.study.fill_cohorts, c.study.ragged_cohorts = MODES[mode]
    with tempfile.TemporaryDirectory(prefix=f"bench_search_fill_{mode}_") as workdir:
      t0 = time.perf_counter()
      summary = run_search(c, workdir, SPACES[space])
      seconds = time.perf_counter() - t0
      tried = tried_counts(os.path.join(workdir, "trials.jsonl"))
    best = summary["best_metrics"] or {}
    out[mode] = {**tried, "mean_cohort_width": summary["mean_cohort_width"],
                 "lane_utilization": summary["lane_utilization"],
                 "seconds": seconds, "trials": summary["num_trials_done"],
                 "trials_per_hour": summary["num_trials_done"] * 3600.0 / seconds,
                 "best_valid_auc": best.get("auc"), "best_test_auc": best.get("test_auc")}
    sys.stderr.write(f"{mode}: {json.dumps(out[mode])}\n")
  return out


def run(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """The benchmark (see the module docstring); its figures.

  Raises:
    ConfigError: for an unknown mode or space, before anything runs.
  """
  modes = cli.split_names(config.modes, "modes", MODES)
  if config.space not in SPACES:
    raise ConfigError(f"config field space: unknown {config.space!r} (known: {', '.join(SPACES)})")
  search = config.search
  return {"benchmark": "bench_search_fill", "space": config.space,
          "algorithm": search.study.algorithm, "num_trials": search.study.num_trials,
          "cohort_width": search.study.cohort_width,
          "modes": measure(search, modes, config.space)}


if __name__ == "__main__":
  cli.run_benchmark("bench_search_fill", run)
