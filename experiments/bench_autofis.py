"""AutoFIS on planted synthetic data: does it find the planted pairs, and does keeping them pay?

  python -m experiments.bench_autofis [--config=experiments/configs/bench_autofis.py[:smoke]]
      [--config.seeds=0,1,2 --config.search_steps=1500 --config.out=bench.json]

For each data seed, the synthetic Criteo-like generator (26 fields; its hidden FM
makes a few field pairs dominate, `sfjax.data.generated.planted`) gives a CTR task; AutoFIS
(`sfjax.structure.autofis.run_autofis`) searches the gates with gRDA and retrains on
the kept (nonzero-gate) pairs. Reported per seed:
  * precision / recall of the kept pairs against `planted_pairs` at each `shares`
    value (the fewest pairs holding that share of the planted pairwise logit variance);
  * test AUC (second half of the eval rows, never used to select) of the retrain on the
    kept pairs, on as many random pairs (not kept), on all pairs and on none.
`run(config)` returns the figures; the command ends stdout with them as one JSON line
(also written to `config.out`).

Old flag -> config field: each `--X` is `--config.X` (seeds, search_steps, warmup_steps,
retrain_steps, batch_size, embed_dim, mlp_dims, grda_c, grda_mu, grda_lr,
cardinality_scale, eval_rows, shares, baselines, out); lists are tuples
(`--config.seeds=0,1,2`, `--config.mlp_dims='(64,64)'`).
"""

from __future__ import annotations

import json
import sys
import time

import jax
import ml_collections
import numpy as np

from experiments import cli
from experiments.configs import ctr as ctr_config
from sfjax.cohorts import CTRTask
from sfjax.structure import (
  AutoFISSettings,
  pair_precision_recall,
  planted_pairs,
  prepare_trial_data,
  retrain_with_pairs,
  run_autofis,
)


def make_task(config: ml_collections.ConfigDict, seed: int) -> CTRTask:
  """The benchmark's task for one data seed (ctr.py's synthetic data block, rescaled)."""
  data = ctr_config.get_config().data
  data.synthetic.cardinality_scale = config.cardinality_scale
  data.synthetic.num_train = 1_000_000
  data.synthetic.num_eval = max(config.eval_rows, 1)
  return CTRTask(data, seed=seed, batch_size=config.batch_size, eval_rows=config.eval_rows,
                 eval_batch_size=min(config.eval_rows, 4096))


def settings_of(config: ml_collections.ConfigDict) -> AutoFISSettings:
  """AutoFIS's settings from the benchmark config."""
  return AutoFISSettings(
      embed_dim=config.embed_dim, mlp_dims=tuple(int(w) for w in config.mlp_dims),
      search_steps=config.search_steps, warmup_steps=config.warmup_steps,
      retrain_steps=config.retrain_steps, grda_c=config.grda_c, grda_mu=config.grda_mu,
      grda_lr=config.grda_lr)


def measure(task: CTRTask, seed: int, settings: AutoFISSettings,
            shares: list[float], baselines: bool = True) -> dict:
  """One seed's figures (see the module docstring)."""
  t = time.perf_counter()
  data = prepare_trial_data(task, settings)
  data_s = time.perf_counter() - t
  result = run_autofis(task, settings, data=data)
  row = {"seed": seed, "kept": len(result.kept_pairs), "pairs": len(result.all_pairs),
         "kept_pairs": [list(p) for p in result.kept_pairs], "search_valid_auc": result.search_auc,
         "kept_test_auc": result.test_auc, "kept_valid_auc": result.valid_auc, "autofis_s": result.wall_s,
         "data_prep_s": data_s}
  for share in shares:
    truth = planted_pairs(task.data, seed, share=share)
    precision, recall = pair_precision_recall(result.kept_pairs, truth)
    row[f"truth_{share:g}"] = {"pairs": len(truth), "precision": precision, "recall": recall}
  if baselines:
    rng = np.random.default_rng(seed)
    others = [p for p in result.all_pairs if p not in set(result.kept_pairs)]
    pool = others if len(others) >= len(result.kept_pairs) else list(result.all_pairs)  # most pairs kept
    random_pairs = [pool[i] for i in rng.choice(len(pool), len(result.kept_pairs), replace=False)]
    for name, pairs in (("random", random_pairs), ("all", result.all_pairs), ("none", ())):
      row[f"{name}_test_auc"] = retrain_with_pairs(data, settings, pairs)["test_auc"]
  return row


def run(config: ml_collections.ConfigDict) -> dict:
  """The benchmark (see the module docstring); its figures."""
  shares = [float(s) for s in config.shares]
  settings = settings_of(config)
  rows = []
  for seed in (int(s) for s in config.seeds):
    rows.append(measure(make_task(config, seed), seed, settings, shares, config.baselines))
    print(json.dumps(rows[-1], sort_keys=True), file=sys.stderr)
  summary = {}
  for share in shares:
    key = f"truth_{share:g}"
    summary[key] = {m: float(np.mean([r[key][m] for r in rows])) for m in ("precision", "recall")}
  if config.baselines:
    summary["kept_minus_random_test_auc"] = float(np.mean([r["kept_test_auc"] - r["random_test_auc"]
                                                           for r in rows]))
  return {
      "benchmark": "bench_autofis", "settings": {k: (list(v) if isinstance(v, tuple) else v)
                                                  for k, v in vars(settings).items()},
      "cardinality_scale": config.cardinality_scale, "eval_rows": config.eval_rows,
      "platform": jax.devices()[0].platform, "results": rows, "mean": summary,
  }


if __name__ == "__main__":
  cli.run_benchmark("bench_autofis", run)
