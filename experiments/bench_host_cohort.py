"""Bytes and time of W trials through one host table vs W separate cache runs.

  python -m experiments.bench_host_cohort [--config=experiments/configs/bench_host_cohort.py[:smoke]]
      [--config.widths=1,4,8 --config.steps=40 --config.out=h.json]

A cohort of W fresh trials over a synthetic Criteo table much larger than the device
cache trains `steps` steps through one shared host table (`sfjax.cohorts.host_cohort`:
rows W x E wide, one VSI, plan, gather and transfer per step for every lane). Width 1
is one trial's own cache run; W separate runs move W times its bytes. Per width the
benchmark reports, per trial, the bytes of rows filled host->device (`h2d_bytes`) and
written back (`d2h_bytes`), everything `device_put` (`put_bytes`: batches, swap
buffers padded to their bucket, slot indices) and the wall time (compilation
included: run each width twice to see it without), each with its ratio to width 1.

`run(config)` returns the figures; the command ends stdout with them as one JSON line
(also written to `config.out`).
"""

from __future__ import annotations

import time

import ml_collections
import numpy as np

from experiments import cli
from experiments.configs import ctr as ctr_config
from sfjax.cohorts import CTRTask, TrialData, run_host_cohort, split_config
from sfjax.core import ConfigError

ARCH = {"model.name": "wide_deep", "model.embed_dim": 8, "model.mlp.depth": 1,
        "model.mlp.width": 16, "embedding.optimizer": "adagrad"}
_PER_TRIAL = ("h2d_bytes", "d2h_bytes", "put_bytes", "seconds")


def make_data(config: ml_collections.ConfigDict) -> TrialData:
  """The synthetic task behind `config.cache_rows` cache rows."""
  d = ctr_config.get_config().data
  d.synthetic.cardinality_scale = config.cardinality_scale
  d.synthetic.num_train = max(4096, 2 * config.steps * config.batch_size)
  d.synthetic.num_eval = max(512, config.eval_rows)
  return TrialData(CTRTask(d, batch_size=config.batch_size, eval_rows=config.eval_rows,
                           eval_batch_size=min(1024, config.eval_rows),
                           embedding_backend="cache", cache_rows=config.cache_rows,
                           cache_lookahead=config.cache_lookahead))


def measure(data: TrialData, width: int, steps: int) -> dict:
  """One cohort of `width` fresh trials (embedding learning rates spread 0.01 .. 0.1)."""
  arch = split_config(ARCH)[0]
  lrs = np.geomspace(0.01, 0.1, width).astype(np.float32)
  t = time.perf_counter()
  run = run_host_cohort(data, arch, {"embedding.learning_rate": lrs},
                        list(range(1, width + 1)), steps)
  seconds = time.perf_counter() - t
  stats = run.stats
  totals = {"h2d_bytes": stats["h2d_bytes"], "d2h_bytes": stats["d2h_bytes"],
            "put_bytes": stats["put_bytes"], "seconds": seconds}
  return {"width": width, **{f"{k}_per_trial": v / width for k, v in totals.items()},
          "hit_rate": stats["cache_hit_rate"], "evictions": stats["evictions"],
          "failed": int((~run.output.alive).sum()), "mean_auc": float(np.nanmean(run.output.auc))}


def run(config: ml_collections.ConfigDict) -> dict:
  """The benchmark (see the module docstring).

  Raises:
    ConfigError: for no width, a width < 1, or fewer than one step.
  """
  widths = sorted({int(w) for w in config.widths})
  if not widths or widths[0] < 1:
    raise ConfigError(f"config field widths: must list integers >= 1, got {config.widths}")
  if config.steps < 1:
    raise ConfigError(f"config field steps: must be >= 1, got {config.steps}")
  data = make_data(config)
  points = [measure(data, w, config.steps) for w in sorted(set(widths) | {1})]
  separate = points[0]
  for p in points:
    for k in _PER_TRIAL:
      p[f"{k}_vs_separate"] = p[f"{k}_per_trial"] / max(separate[f"{k}_per_trial"], 1e-12)
  return {"benchmark": "bench_host_cohort", "steps": config.steps,
          "table_rows": data.full_rows, "cache_rows": config.cache_rows,
          "arch": split_config(ARCH)[0].describe(), "points": points}


if __name__ == "__main__":
  cli.run_benchmark("bench_host_cohort", run)
