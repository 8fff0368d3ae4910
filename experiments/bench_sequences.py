"""What multi-hot bags and behaviour sequences are worth: test AUC over seeds (issue #22).

  python -m experiments.bench_sequences [--config=experiments/configs/bench_sequences.py[:smoke]]

MovieLens-100k (the seeded 80/10/10 split; model selection on 'valid', test AUC read at
the best-valid eval, as `ctr.py:movielens*`): the one-genre one-hot DeepFM (the baseline
before #22), DeepFM with all genres as a bag and the 20 previous ratings as a
mean-pooled history, and DIN's target attention over that history; '*_labels' add the
user's earlier TRAIN-split liked / disliked items as two more mean-pooled sequences
(`data.movielens.label_history`: these features read train-split labels).

The planted multi-hot data (`ctr.py:multihot`: labels depend on bag contents and on a
target-vs-history interaction; 'test' split of the same size as 'eval'): DeepFM on
the one-hot fields only (`data.use_features`), DeepFM on every feature (bags pooled,
history mean-pooled) and DIN, beside the oracle. `gap_recovered` of a model is
`(auc - auc_onehot_only) / (oracle - auc_onehot_only)` per seed, averaged: the share
of the gap the one-hot model leaves that the model closes.

Each figure is a mean over `seeds` with its spread (max - min) and sample std: on
MovieLens a seed changes the model's init and batch order (the split is fixed); on the
planted data it also draws the data set and its oracle, so the gap recovered is taken
per seed. Ends stdout with one JSON line.
"""

from __future__ import annotations

import statistics
import time

import ml_collections

from experiments import cli
from experiments.configs import ctr as ctr_config
from sfjax.core import ConfigError
from sfjax.train import train_and_evaluate


def summary(values: list[float]) -> dict:
  """Mean, spread (max - min), sample std and the values."""
  return {"mean": statistics.fmean(values), "spread": max(values) - min(values),
          "std": statistics.stdev(values) if len(values) > 1 else 0.0, "values": values}


def _train(config: ml_collections.ConfigDict, seed: int) -> dict:
  config.seed, config.train.num_devices = seed, 1
  t = time.perf_counter()
  final, _ = train_and_evaluate(config)
  return {"test_auc": float(final["test_auc"]), "seconds": time.perf_counter() - t,
          "oracle": final.get("oracle")}


def movielens(config: ml_collections.ConfigDict) -> dict:
  """Test AUC per MovieLens variant over the seeds; each variant minus the baseline."""
  variants = [v.strip() for v in config.movielens.split(",") if v.strip()]
  out = {}
  for name in variants:
    runs = [_train(ctr_config.get_config(name), seed) for seed in config.seeds]
    out[name] = dict(summary([r["test_auc"] for r in runs]),
                     seconds=sum(r["seconds"] for r in runs))
  base = out[variants[0]]["mean"]
  for name in variants[1:]:
    out[name]["minus_baseline"] = out[name]["mean"] - base
  return out


def _multihot_config(config: ml_collections.ConfigDict, model: str,
                     features: str = "") -> ml_collections.ConfigDict:
  c = ctr_config.get_config(config.multihot)
  c.data.multihot.test_rows = c.data.multihot.num_eval
  c.model.name, c.data.use_features = model, features
  if config.multihot_steps:
    c.train.steps = config.multihot_steps
    c.train.eval_every = max(1, config.multihot_steps // 4)
  return c


def multihot(config: ml_collections.ConfigDict) -> dict:
  """Test AUC of one-hot-only DeepFM, full DeepFM and DIN on the planted data; the oracle.

  The data seed is the run's seed, so each seed draws its own planted data set (and
  oracle): `gap_recovered` is computed per seed, then summarised.
  """
  from sfjax.data import make_dataset  # pylint: disable=import-outside-toplevel
  runs = {"onehot_only": "deepfm", "deepfm": "deepfm", "din": "din"}
  aucs: dict[str, list[float]] = {name: [] for name in runs}
  seconds = dict.fromkeys(runs, 0.0)
  gaps: dict[str, list[float]] = {"deepfm": [], "din": []}
  oracles, one_hot = [], ""
  for seed in config.seeds:
    probe = make_dataset(_multihot_config(config, "deepfm").data, seed)
    one_hot = ",".join(f.name for f in probe.spec.layout.features if f.kind == "one_hot")
    oracle = probe.oracle["test"]["auc"]
    oracles.append(oracle)
    for name, model in runs.items():
      r = _train(_multihot_config(config, model, one_hot if name == "onehot_only" else ""), seed)
      aucs[name].append(r["test_auc"])
      seconds[name] += r["seconds"]
    for name in gaps:
      base = aucs["onehot_only"][-1]
      gaps[name].append((aucs[name][-1] - base) / max(oracle - base, 1e-12))
  out: dict = {"oracle_test_auc": summary(oracles), "one_hot_features": one_hot}
  for name in runs:
    out[name] = dict(summary(aucs[name]), seconds=seconds[name])
  for name, values in gaps.items():
    out[name]["gap_recovered"] = statistics.fmean(values)
    out[name]["gap_recovered_by_seed"] = values
  return out


def run(config: ml_collections.ConfigDict) -> dict:
  """The benchmark's figures (see the module docstring)."""
  if not config.seeds:
    raise ConfigError("config field seeds: needs at least one seed")
  result: dict = {"benchmark": "bench_sequences", "seeds": list(config.seeds)}
  if config.movielens:
    result["movielens"] = movielens(config)
  if config.multihot:
    result["multihot"] = multihot(config)
  return result


if __name__ == "__main__":
  cli.run_benchmark("bench_sequences", run)
