"""Trials/hour of vmapped cohorts versus the same trials run one after another.

  python -m experiments.bench_trials [--config=experiments/configs/bench_trials.py[:smoke]]
      [--config.widths=1,8,32,128 --config.steps=20 --config.out=bench.json]

For each cohort size N in `widths`, N small CTR trials (one architecture,
log-spaced learning rates, seeds 0..N-1) are run
  * as one cohort: one compiled program of width N (`CohortRunner.run`), and
  * sequentially: N calls of the width-1 program, one trial after another.
Both paths include eval, exact host AUC/logloss and the transfer of each trial's
final state to the host, i.e. what a study pays per trial. Each program is
compiled (and run) once before the timed run; compile time is reported apart.

With `joint=N`, also N trials drawn at random from the default joint architecture +
hyperparameter space of `experiments.search` (search_spaces/ctr.py, the families of
search_ctr.py), asked in rounds of `joint_batch` like a search (architecture-aware
unless `joint_fill=False`: a round's first draw is free, the rest share its shape bucket):
each round's trials of one bucket run as one padded cohort, against every trial
alone. Both paths are timed end to end, compiles included (every new program
compiles, as in a search), `mean_cohort_width` is the mean number of trials per
cohort and `max_auc_diff_vs_sequential` checks that both paths train the same trials.
`run(config)` returns the figures; the command ends stdout with them as one JSON line
(also written to `config.out`). Nothing here is platform-specific: the same command
measures a GPU.

With `executor` ('dask' or 'local'), also a search (`sfjax.ctr_search.run_search`, the
smoke search's task and space at this benchmark's sizes) of `dispatch_trials` trials of
`dispatch_algorithm` over `dispatch_families` (each family its own shape bucket), run
twice on `workers` workers: in synchronous rounds and on the asynchronous schedule
(`study.dispatch`, `sfjax/ctr_search/dispatch.py`), each on a fresh cluster. The JSON
holds, per schedule, `worker_busy_fraction` (the workers' seconds running cohorts over
workers x the trial loop's wall time) and `trials_per_hour`:

  python -m experiments.bench_trials --config=experiments/configs/bench_trials.py:dispatch
  python -m experiments.bench_trials --config.executor=dask --config.workers=4 --config.widths=1

With more workers than cores the workers share the CPU: the busy fraction still says
whether a worker had a cohort to run; trials/hour then mostly measures the CPU.

Old flag -> config field: each `--X` is `--config.X` (widths, steps, batch_size, model,
embed_dim, mlp_depth, mlp_width, embedding_optimizer, cardinality_scale, eval_rows,
shard_trials, joint, joint_batch, joint_fill, out); `widths` is a tuple
(`--config.widths=1,8`), `--nojoint_fill` is `--config.joint_fill=False`. `xla_cpu_dots` is new: the library the
cohort programs' dots use on CPU (`CTRTask.xla_cpu_dots`; the JSON reports what it resolved
to).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

import jax
import ml_collections
import numpy as np

from experiments import cli
from experiments.configs import ctr as ctr_config
from experiments.configs import search_ctr
from search_spaces import ctr as ctr_space
from sfjax.automl.algorithms import TrialStatus
from sfjax.cohorts import (
  STATIC_KEYS,
  CohortRunner,
  CTRTask,
  TrialData,
  bucket_key,
  count_params,
  fixed_config_keys,
  split_config,
  trial_mesh,
)
from sfjax.core import ConfigError, resolve_xla_cpu_dots
from sfjax.ctr_search import DISPATCH_FILE, run_search

SCHEDULES = ("rounds", "async")  # the synchronous schedule, then the asynchronous one


def make_task(config: ml_collections.ConfigDict) -> CTRTask:
  """The benchmark's CTR task (synthetic Criteo-like data, ctr.py defaults otherwise)."""
  data = ctr_config.get_config().data
  data.synthetic.cardinality_scale = config.cardinality_scale
  data.synthetic.num_eval = max(config.eval_rows, 1)
  return CTRTask(data, batch_size=config.batch_size, eval_rows=config.eval_rows,
                 steps_per_budget_unit=config.steps,
                 eval_batch_size=min(config.eval_rows, 2048), max_steps=config.steps,
                 xla_cpu_dots=config.get("xla_cpu_dots", "auto"))


def trial_hparams(count: int) -> list[dict[str, float]]:
  """`count` trials with log-spaced embedding and dense learning rates."""
  frac = np.linspace(0.0, 1.0, count) if count > 1 else np.zeros(1)
  return [{"embedding.learning_rate": float(0.003 * (100 / 3) ** f),
           "optimizer.learning_rate": float(1e-3 * 10 ** f)}
          for f in frac]


def timed_run(runner: CohortRunner, arch, hparams, seeds):
  """(results, seconds) of one `runner.run` of fresh trials over the task's steps."""
  t = time.perf_counter()
  results = runner.run(arch, hparams, seeds, [0] * len(seeds), runner.task.max_steps,
                       [None] * len(seeds))
  return results, time.perf_counter() - t


def measure(data: TrialData, arch, count: int, mesh) -> dict[str, float]:
  """Cohort vs sequential figures for `count` trials."""
  hparams, seeds = trial_hparams(count), list(range(count))
  together = CohortRunner(data.task, cohort_width=count, mesh=mesh, data=data)
  _, compile_s = timed_run(together, arch, hparams, seeds)  # compiles (and runs) once
  cohort_results, cohort_s = timed_run(together, arch, hparams, seeds)
  alone = CohortRunner(data.task, cohort_width=1, data=data)
  timed_run(alone, arch, hparams[:1], seeds[:1])  # compiles the width-1 program (once per process)
  seq_s, seq_results = 0.0, []
  for h, s in zip(hparams, seeds, strict=True):
    results, seconds = timed_run(alone, arch, [h], [s])
    seq_s += seconds
    seq_results += results
  auc = np.array([r.metrics["auc"] for r in cohort_results])
  seq_auc = np.array([r.metrics["auc"] for r in seq_results])
  return {
      "trials": count, "cohort_seconds": cohort_s, "cohort_compile_and_run_s": compile_s,
      "sequential_seconds": seq_s, "cohort_trials_per_hour": count * 3600.0 / cohort_s,
      "sequential_trials_per_hour": count * 3600.0 / seq_s, "speedup": seq_s / cohort_s,
      "failed": int(sum(r.status != TrialStatus.DONE for r in cohort_results)),
      "mean_auc": float(np.nanmean(auc)),
      "max_auc_diff_vs_sequential": float(np.nanmax(np.abs(auc - seq_auc))),
  }


def joint_draws(space, count: int, batch: int, fill: bool, rng) -> list:
  """`count` (arch, hparams) draws of `space` in rounds of `batch`, as a search asks them.

  With `fill` a round is architecture-aware (`search_round.ask_round`): its first draw
  is free, the others are drawn from `space.fixing` its shape-bucket keys
  (`buckets.fixed_config_keys`).
  """
  keys = [k for k in space.keys if k in STATIC_KEYS] if fill else []
  draws = []
  while len(draws) < count:
    first = space.sample(rng)
    fixed = space.fixing({k: first[k] for k in fixed_config_keys(first, keys)
                          if k in first}) if keys else space
    size = min(batch, count - len(draws))
    draws += [first] + [fixed.sample(rng) for _ in range(size - 1)]
  return [split_config(ctr_space.runner_config(c)) for c in draws]


def measure_joint(data: TrialData, count: int, batch: int, fill: bool = True,
                  seed: int = 0) -> dict:
  """`count` random trials of the default joint space: cohorts per round vs one at a time.

  A round's trials of one shape bucket run as one (padded) cohort; `fill` asks each
  round inside one bucket. Both paths are timed end to end, compiles included, and
  their held-out AUCs are compared trial by trial (the padded program must equal the
  trial alone).
  """
  space_cfg = search_ctr.get_config().space
  # The named families' joint space (the search's default before it generated models).
  space_cfg.families = "lr,fm,deepfm,wide_deep,dcnv2,dlrm"
  space = ctr_space.space_from_config(space_cfg)
  trials = joint_draws(space, count, batch, fill, np.random.default_rng(seed))
  rounds = [list(range(i, min(i + batch, count))) for i in range(0, count, batch)]
  jax.clear_caches()  # each path pays its own compiles, as a search does
  together = CohortRunner(data.task, cohort_width=batch, data=data)
  widths, auc = [], np.full(count, np.nan)
  t = time.perf_counter()
  for members in rounds:
    groups: dict = {}
    for j in members:
      groups.setdefault(bucket_key(trials[j][0]), []).append(j)
    for group in groups.values():
      widths.append(len(group))
      results, _ = timed_run(together, [trials[j][0] for j in group],
                             [trials[j][1] for j in group], group)
      auc[group] = [r.metrics["auc"] for r in results]
  cohort_s = time.perf_counter() - t
  jax.clear_caches()
  alone = CohortRunner(data.task, cohort_width=1, data=data)
  seq_auc = np.full(count, np.nan)
  t = time.perf_counter()
  for j, (arch, hparams) in enumerate(trials):
    seq_auc[j] = timed_run(alone, arch, [hparams], [j])[0][0].metrics["auc"]
  seq_s = time.perf_counter() - t
  both = np.isfinite(auc) & np.isfinite(seq_auc)
  return {"trials": count, "batch": batch, "fill": bool(fill), "families": space_cfg.families,
          "architectures": len({arch for arch, _ in trials}),
          "buckets": len({bucket_key(arch) for arch, _ in trials}), "cohorts": len(widths),
          "mean_cohort_width": float(np.mean(widths)), "max_cohort_width": int(max(widths)),
          "cohort_seconds": cohort_s, "sequential_seconds": seq_s,
          "cohort_trials_per_hour": count * 3600.0 / cohort_s,
          "sequential_trials_per_hour": count * 3600.0 / seq_s, "speedup": seq_s / cohort_s,
          "failed": int(np.sum(~np.isfinite(auc))),
          "max_auc_diff_vs_sequential": float(np.max(np.abs(auc - seq_auc)[both]))
          if both.any() else None}


def dispatch_search_config(config: ml_collections.ConfigDict, schedule: str
                           ) -> ml_collections.ConfigDict:
  """The search config of `measure_dispatch` for one schedule ('rounds' or 'async')."""
  c = search_ctr.get_config("smoke")
  c.task.data.synthetic.cardinality_scale = config.cardinality_scale
  c.task.batch_size, c.task.steps_per_budget_unit = config.batch_size, config.steps
  c.task.eval_rows = config.eval_rows
  c.task.eval_batch_size = min(config.eval_rows, 2048)
  c.space.families = config.dispatch_families
  st = c.study
  st.algorithm, st.num_trials = config.dispatch_algorithm, config.dispatch_trials
  st.cohort_width, st.ask_batch = str(config.dispatch_width), config.dispatch_ask_batch
  st.executor, st.dask_workers, st.dispatch = config.executor, config.workers, schedule
  st.leaderboard_size = 0
  return c


def measure_dispatch(config: ml_collections.ConfigDict) -> dict:
  """One search per schedule (`dispatch_search_config`) on a fresh executor: each one's
  `dispatch.DispatchRecord` (`dispatch.json`) and summary figures, and the comparison."""
  rows = {}
  for schedule in SCHEDULES:
    with tempfile.TemporaryDirectory(prefix=f"bench_dispatch_{schedule}_") as workdir:
      summary = run_search(dispatch_search_config(config, schedule), workdir,
                           ctr_space.SEARCH_SPACE)
      with open(os.path.join(workdir, DISPATCH_FILE), encoding="utf-8") as f:
        rows[schedule] = {**json.load(f), "num_trials_done": summary["num_trials_done"],
                          "num_failed": summary["num_failed"],
                          "mean_cohort_width": summary["mean_cohort_width"],
                          "best_auc": (summary["best_metrics"] or {}).get("auc")}
    print(json.dumps({schedule: rows[schedule]}, sort_keys=True), file=sys.stderr)
  rate = {s: rows[s]["trials_per_hour"] for s in SCHEDULES}
  return {"executor": config.executor, "workers": config.workers,
          "algorithm": config.dispatch_algorithm, "families": config.dispatch_families,
          "trials": config.dispatch_trials, "schedules": rows,
          "worker_busy_fraction": {s: rows[s]["worker_busy_fraction"] for s in SCHEDULES},
          "trials_per_hour": rate,
          "async_speedup": rate["async"] / rate["rounds"] if rate["rounds"] else None}


def run(config: ml_collections.ConfigDict) -> dict:
  """The benchmark (see the module docstring); its figures.

  Raises:
    ConfigError: when `widths` is empty or holds a width below 1.
  """
  widths = [int(w) for w in config.widths]
  if (not widths and not config.executor) or (widths and min(widths) < 1):
    raise ConfigError(f"config field widths: must list positive integers, got {config.widths}")
  arch = split_config({
      "model.name": config.model, "model.embed_dim": config.embed_dim,
      "model.mlp.depth": config.mlp_depth, "model.mlp.width": config.mlp_width,
      "embedding.optimizer": config.embedding_optimizer})[0]
  t = time.perf_counter()
  data = TrialData(make_task(config))
  data_s = time.perf_counter() - t
  mesh = trial_mesh() if config.shard_trials else None
  rows = []
  for count in widths:
    rows.append(measure(data, arch, count, mesh))
    print(json.dumps(rows[-1], sort_keys=True), file=sys.stderr)
  result = {
      "benchmark": "bench_trials", "arch": arch.describe(), "steps_per_trial": config.steps,
      "batch_size": config.batch_size, "table_rows": data.num_rows,
      "eval_examples": data.num_eval_examples,
      "params_per_trial": count_params(arch, data.spec), "data_prep_s": data_s,
      "platform": jax.devices()[0].platform, "device_kind": jax.devices()[0].device_kind,
      "devices": jax.device_count(), "shard_trials": config.shard_trials,
      "xla_cpu_dots": resolve_xla_cpu_dots(data.task.xla_cpu_dots), "results": rows,
  }
  if config.joint:
    result["joint_space"] = measure_joint(data, config.joint, config.joint_batch,
                                          config.joint_fill)
    print(json.dumps(result["joint_space"], sort_keys=True), file=sys.stderr)
  if config.executor:
    result["dispatch"] = measure_dispatch(config)
    result["worker_busy_fraction"] = result["dispatch"]["worker_busy_fraction"]
    result["trials_per_hour"] = result["dispatch"]["trials_per_hour"]
  return result


if __name__ == "__main__":
  cli.run_benchmark("bench_trials", run)
