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

`config.group_only` (issue #26, 0a's width target): no training; a random search of
`search.study.num_trials` trials over the space, for each ask batch of `group_asks`
and each seed below `group_seeds`: the algorithm's own proposals, asked in rounds of
the batch, formed into cohorts (`search_round.form_cohorts` with the data's Nd and F)
and each cohort planned into program calls at `search.study.cohort_width` (the
runner's own `plan`). It reports, per ask batch, `mean_cohort_width` (trials per
program call, as a search's summary counts them), `programs`, `pairs_tried` (mean
over seeds) and `configs_digest` (of every asked config: equal across ask batches and
to a search without fill, since grouping never changes what is asked).

Old flag -> config field: `--config=FILE` (the search config) -> `config.search`
(`--config.task.X` -> `--config.search.task.X`, and so on), `--modes` ->
`config.modes`, `--space` -> `config.space`, `--out` -> `config.out`.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import jax
import ml_collections
import numpy as np

from experiments import cli
from search_spaces import blocks as blocks_space
from search_spaces import default as default_space
from sfjax.automl.algorithms import Objective, RandomSearch
from sfjax.automl.study import Study
from sfjax.cohorts import CohortRunner, cohort_program, split_config
from sfjax.core import ConfigError
from sfjax.ctr_search import form_cohorts, make_space, make_task, parse_cohort_width, run_search

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


def group_widths(search, space: str, asks: Sequence[int], seeds: int) -> dict[str, Any]:
  """Cohort widths of a random search's own proposals, grouped only (module docstring)."""
  search_space = SPACES[space]
  joint = make_space(search, search_space)
  runner = CohortRunner(make_task(search), cohort_width=parse_cohort_width(search.study.cohort_width))
  spec, n = runner.spec, search.study.num_trials
  out = {}
  for ask in asks:
    calls, digest, pairs = [], hashlib.sha256(), []
    for seed in range(seeds):
      with tempfile.TemporaryDirectory() as workdir, Study.open(
          workdir, joint, RandomSearch(seed=seed), Objective("auc", "maximize")) as study:
        asked = []
        while len(asked) < n:
          batch = study.ask(min(ask, n - len(asked)))
          asked += batch
          archs = [split_config(search_space.runner_config(s.config))[0] for s in batch]
          for group in form_cohorts(archs, True, spec.num_dense, spec.num_fields):
            members = [archs[i] for i in group]
            calls += [len(c.trials) for c in runner.plan(
                members, [0] * len(members), [1] * len(members), [False] * len(members),
                merge_optimizers=True)]
      for s in asked:
        digest.update(json.dumps(s.config.to_dict(), sort_keys=True).encode())
      pairs.append(len({(_family(s.config), s.config.get("embedding.optimizer")) for s in asked}))
    out[str(ask)] = {"mean_cohort_width": float(np.mean(calls)), "programs": len(calls),
                     "pairs_tried": float(np.mean(pairs)),
                     "configs_digest": digest.hexdigest()[:12]}
    sys.stderr.write(f"ask {ask}: {json.dumps(out[str(ask)])}\n")
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
  if config.get("group_only", False):
    asks = [int(a) for a in str(config.group_asks).split(",") if a.strip()]
    return {"benchmark": "bench_search_fill", "mode": "group_only", "space": config.space,
            "algorithm": "random", "num_trials": search.study.num_trials,
            "cohort_width": search.study.cohort_width, "seeds": config.group_seeds,
            "asks": group_widths(search, config.space, asks, config.group_seeds)}
  return {"benchmark": "bench_search_fill", "space": config.space,
          "algorithm": search.study.algorithm, "num_trials": search.study.num_trials,
          "cohort_width": search.study.cohort_width,
          "modes": measure(search, modes, config.space)}


if __name__ == "__main__":
  cli.run_benchmark("bench_search_fill", run)
