"""Trials/hour of vmapped cohorts versus the same trials run one after another.

  python -m experiments.bench_trials [--widths=1,8,32,128 --steps=20 --out=bench.json]

For each cohort size N in --widths, N small CTR trials (one architecture,
log-spaced learning rates, seeds 0..N-1) are run
  * as one cohort: one compiled program of width N (`CohortRunner.run`), and
  * sequentially: N calls of the width-1 program, one trial after another.
Both paths include eval, exact host AUC/logloss and the transfer of each trial's
final state to the host, i.e. what a study pays per trial. Each program is
compiled (and run) once before the timed run; compile time is reported apart.

With `--joint=N`, also N trials drawn at random from the default joint architecture +
hyperparameter space of `experiments.search` (search_spaces/ctr.py, the families of
search_ctr.py), asked in rounds of `--joint_batch` like a search (architecture-aware
unless `--nojoint_fill`: a round's first draw is free, the rest share its shape bucket):
each round's trials of one bucket run as one padded cohort, against every trial
alone. Both paths are timed end to end, compiles included (every new program
compiles, as in a search), `mean_cohort_width` is the mean number of trials per
cohort and `max_auc_diff_vs_sequential` checks that both paths train the same trials.
Ends stdout with one JSON line (also written to --out). Nothing here is
platform-specific: the same command measures a GPU.
"""

from __future__ import annotations

import json
import sys
import time

import jax
import numpy as np
from absl import app, flags

from experiments import report
from experiments.configs import ctr as ctr_config
from experiments.configs import search_ctr
from search_spaces import ctr as ctr_space
from sfjax.automl.algorithms import TrialStatus
from sfjax.cohorts import arch as arch_lib
from sfjax.cohorts import buckets as padded
from sfjax.cohorts import cohort_runner as cohort
from sfjax.cohorts import task as trial_data

_WIDTHS = flags.DEFINE_list("widths", ["1", "8", "32", "128"], "Cohort sizes N to measure.")
_STEPS = flags.DEFINE_integer("steps", 20, "Train steps per trial.")
_BATCH = flags.DEFINE_integer("batch_size", 128, "Examples per train step.")
_MODEL = flags.DEFINE_string("model", "deepfm", "Model name.")
_DIM = flags.DEFINE_integer("embed_dim", 4, "Embedding dimension D.")
_MLP_DEPTH = flags.DEFINE_integer("mlp_depth", 1, "MLP hidden layers.")
_MLP_WIDTH = flags.DEFINE_integer("mlp_width", 16, "MLP hidden width.")
_ROW_OPT = flags.DEFINE_string("embedding_optimizer", "adagrad", "Row optimizer.")
_SCALE = flags.DEFINE_float("cardinality_scale", 1e-3, "Synthetic Criteo cardinality scale (table size).")
_EVAL_ROWS = flags.DEFINE_integer("eval_rows", 2048, "Eval examples per trial.")
_SHARD = flags.DEFINE_boolean("shard_trials", False, "Shard the trial axis over all local devices.")
_JOINT = flags.DEFINE_integer("joint", 0, "Also this many trials of the default joint space.")
_JOINT_BATCH = flags.DEFINE_integer("joint_batch", 8, "Trials asked per round in --joint.")
_JOINT_FILL = flags.DEFINE_boolean("joint_fill", True, "--joint rounds are architecture-aware "
                                   "(one shape bucket per round, as study.fill_cohorts).")
_OUT = flags.DEFINE_string("out", "", "Write the JSON result here too.")


def make_task() -> trial_data.CTRTask:
  """The benchmark's CTR task (synthetic Criteo-like data, ctr.py defaults otherwise)."""
  data = ctr_config.get_config().data
  data.synthetic.cardinality_scale = _SCALE.value
  data.synthetic.num_eval = max(_EVAL_ROWS.value, 1)
  return trial_data.CTRTask(data, batch_size=_BATCH.value, eval_rows=_EVAL_ROWS.value,
                            steps_per_budget_unit=_STEPS.value, eval_batch_size=min(_EVAL_ROWS.value, 2048),
                            max_steps=_STEPS.value)


def trial_hparams(count: int) -> list[dict[str, float]]:
  """`count` trials with log-spaced embedding and dense learning rates."""
  frac = np.linspace(0.0, 1.0, count) if count > 1 else np.zeros(1)
  return [{"optim.embedding_lr": float(0.003 * (100 / 3) ** f), "optim.dense_lr": float(1e-3 * 10 ** f)}
          for f in frac]


def timed_run(runner: cohort.CohortRunner, arch, hparams, seeds):
  """(results, seconds) of one `runner.run` of fresh trials over the task's steps."""
  t = time.perf_counter()
  results = runner.run(arch, hparams, seeds, [0] * len(seeds), _STEPS.value, [None] * len(seeds))
  return results, time.perf_counter() - t


def measure(data: trial_data.TrialData, arch, count: int, mesh) -> dict[str, float]:
  """Cohort vs sequential figures for `count` trials."""
  hparams, seeds = trial_hparams(count), list(range(count))
  together = cohort.CohortRunner(data.task, cohort_width=count, mesh=mesh, data=data)
  _, compile_s = timed_run(together, arch, hparams, seeds)  # compiles (and runs) once
  cohort_results, cohort_s = timed_run(together, arch, hparams, seeds)
  alone = cohort.CohortRunner(data.task, cohort_width=1, data=data)
  timed_run(alone, arch, hparams[:1], seeds[:1])  # compiles the width-1 program (once per process)
  seq_s, seq_results = 0.0, []
  for h, s in zip(hparams, seeds):
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

  With `fill` a round is architecture-aware (`search_loop.ask_round`): its first draw
  is free, the others are drawn from `space.fixing` its shape-bucket keys
  (`padded.fixed_config_keys`).
  """
  keys = [k for k in space.keys if k in arch_lib.STATIC_KEYS] if fill else []
  draws = []
  while len(draws) < count:
    first = space.sample(rng)
    fixed = space.fixing({k: first[k] for k in padded.fixed_config_keys(first, keys)
                          if k in first}) if keys else space
    size = min(batch, count - len(draws))
    draws += [first] + [fixed.sample(rng) for _ in range(size - 1)]
  return [arch_lib.split_config(ctr_space.runner_config(c)) for c in draws]


def measure_joint(data: trial_data.TrialData, count: int, batch: int, fill: bool = True,
                  seed: int = 0) -> dict:
  """`count` random trials of the default joint space: cohorts per round vs one at a time.

  A round's trials of one shape bucket run as one (padded) cohort; `fill` asks each
  round inside one bucket. Both paths are timed end to end, compiles included, and
  their held-out AUCs are compared trial by trial (the padded program must equal the
  trial alone).
  """
  space_cfg = search_ctr.get_config().space
  space = ctr_space.space_from_config(space_cfg)
  trials = joint_draws(space, count, batch, fill, np.random.default_rng(seed))
  rounds = [list(range(i, min(i + batch, count))) for i in range(0, count, batch)]
  jax.clear_caches()  # each path pays its own compiles, as a search does
  together = cohort.CohortRunner(data.task, cohort_width=batch, data=data)
  widths, auc = [], np.full(count, np.nan)
  t = time.perf_counter()
  for members in rounds:
    groups: dict = {}
    for j in members:
      groups.setdefault(padded.bucket_key(trials[j][0]), []).append(j)
    for group in groups.values():
      widths.append(len(group))
      results, _ = timed_run(together, [trials[j][0] for j in group],
                             [trials[j][1] for j in group], group)
      auc[group] = [r.metrics["auc"] for r in results]
  cohort_s = time.perf_counter() - t
  jax.clear_caches()
  alone = cohort.CohortRunner(data.task, cohort_width=1, data=data)
  seq_auc = np.full(count, np.nan)
  t = time.perf_counter()
  for j, (arch, hparams) in enumerate(trials):
    seq_auc[j] = timed_run(alone, arch, [hparams], [j])[0][0].metrics["auc"]
  seq_s = time.perf_counter() - t
  both = np.isfinite(auc) & np.isfinite(seq_auc)
  return {"trials": count, "batch": batch, "fill": bool(fill), "families": space_cfg.families,
          "architectures": len({arch for arch, _ in trials}),
          "buckets": len({padded.bucket_key(arch) for arch, _ in trials}), "cohorts": len(widths),
          "mean_cohort_width": float(np.mean(widths)), "max_cohort_width": int(max(widths)),
          "cohort_seconds": cohort_s, "sequential_seconds": seq_s,
          "cohort_trials_per_hour": count * 3600.0 / cohort_s,
          "sequential_trials_per_hour": count * 3600.0 / seq_s, "speedup": seq_s / cohort_s,
          "failed": int(np.sum(~np.isfinite(auc))),
          "max_auc_diff_vs_sequential": float(np.max(np.abs(auc - seq_auc)[both]))
          if both.any() else None}


def main(argv):
  del argv
  widths = [int(w) for w in _WIDTHS.value]
  if not widths or min(widths) < 1:
    raise app.UsageError(f"--widths must list positive integers, got {_WIDTHS.value}")
  arch = arch_lib.split_config({
      "model.name": _MODEL.value, "model.embed_dim": _DIM.value, "model.mlp.depth": _MLP_DEPTH.value,
      "model.mlp.width": _MLP_WIDTH.value, "optim.embedding_optimizer": _ROW_OPT.value})[0]
  t = time.perf_counter()
  data = trial_data.TrialData(make_task())
  data_s = time.perf_counter() - t
  mesh = cohort.trial_mesh() if _SHARD.value else None
  rows = []
  for count in widths:
    rows.append(measure(data, arch, count, mesh))
    print(json.dumps(rows[-1], sort_keys=True), file=sys.stderr)
  result = {
      "benchmark": "bench_trials", "arch": arch.describe(), "steps_per_trial": _STEPS.value,
      "batch_size": _BATCH.value, "table_rows": data.num_rows, "eval_examples": data.num_eval_examples,
      "params_per_trial": arch_lib.count_params(arch, data.spec), "data_prep_s": data_s,
      "platform": jax.devices()[0].platform, "device_kind": jax.devices()[0].device_kind,
      "devices": jax.device_count(), "shard_trials": _SHARD.value, "results": rows,
  }
  if _JOINT.value:
    result["joint_space"] = measure_joint(data, _JOINT.value, _JOINT_BATCH.value, _JOINT_FILL.value)
    print(json.dumps(result["joint_space"], sort_keys=True), file=sys.stderr)
  report.emit_json_line(result, _OUT.value)


if __name__ == "__main__":
  app.run(main)
