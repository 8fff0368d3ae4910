"""Cohorts formed from the algorithm's proposals (issue #26, Deliver 0(a)).

`study.fill_cohorts` only merges a round's proposals into fewer programs: the trials
it trains are the ones the algorithm proposed, so the search's categorical
frequencies with fill on and off are statistically indistinguishable. The tests
here run the formation on the algorithm's suggestions without training (a random
search's asks do not depend on its results), and check that the old way, asking a
round inside its first trial's bucket, is caught by the same statistic.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats

from experiments.configs import search_ctr
from search_spaces.ctr import SEARCH_SPACE as SPACE
from search_spaces.ctr import ctr_space
from sfjax.automl.algorithms import Objective, RandomSearch
from sfjax.automl.study import Study
from sfjax.cohorts.arch import split_config
from sfjax.cohorts.shape_buckets import buckets
from sfjax.ctr_search import search_loop, search_round

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NUM_TRIALS, ROUND = 240, 8
# Categorical keys of the space, each always active (embed_dim is inactive for lr).
KEYS = ("model.name", "embedding.optimizer", "embedding.use_l2", "optimizer.use_weight_decay")
FAMILIES = "lr,fm,deepfm,wide_deep,dcnv2,dlrm"  # the default search's
# The static keys the old architecture-aware rounds fixed (less the masked sizes).
STATIC_KEYS = ("model.name", "model.embed_dim", "embedding.optimizer", "model.mlp.depth",
               "model.mlp.width", "model.cross_layers", "model.cross_rank")


def _study(path, seed):
  return Study.open(str(path), ctr_space(FAMILIES, (32, 64)), RandomSearch(seed=seed),
                    Objective("auc", "maximize"))


def _archs(batch):
  return [split_config(SPACE.runner_config(s.config))[0] for s in batch]


def _formed_rounds(path, seed, fill):
  """Every trial of `NUM_TRIALS` as trained: round by round, its cohorts flattened."""
  trials, widths = [], []
  with _study(path, seed) as study:
    while len(trials) < NUM_TRIALS:
      batch = search_round.ask_round(study, ROUND)
      groups = search_round.form_cohorts(_archs(batch), merge_optimizers=fill)
      assert sorted(i for g in groups for i in g) == list(range(len(batch)))  # none lost
      trials += [batch[i].config for g in groups for i in g]
      widths += [len(g) for g in groups]
  return trials, float(np.mean(widths))


def _old_bucket_rounds(path, seed):
  """The removed behaviour: a round's first trial free, the rest inside its bucket."""
  trials = []
  with _study(path, seed) as study:
    while len(trials) < NUM_TRIALS:
      first = study.ask(1)[0].config
      fixed = {k: first[k] for k in buckets.fixed_config_keys(first, STATIC_KEYS) if k in first}
      trials += [first] + [s.config for s in study.ask(ROUND - 1, fixed=fixed)]
  return trials


def _p_value(a, b, key):
  """Chi-square test of homogeneity of `key`'s values in trial lists `a` and `b`."""
  values = sorted({str(t.get(key)) for t in a + b})
  table = np.asarray([[sum(str(t.get(key)) == v for t in trials) for v in values]
                      for trials in (a, b)])
  return stats.chi2_contingency(table)[1]


def test_fill_on_and_off_train_indistinguishable_categorical_frequencies(tmp_path):
  on, width_on = _formed_rounds(tmp_path / "on", seed=0, fill=True)
  off, width_off = _formed_rounds(tmp_path / "off", seed=1, fill=False)
  for key in KEYS:
    assert _p_value(on, off, key) > 0.01, key
  # Same seed: formation never alters the proposals, only how many programs train them.
  same, _ = _formed_rounds(tmp_path / "same", seed=1, fill=True)
  assert sorted(map(repr, same)) == sorted(map(repr, off))
  assert width_on > width_off  # merged row optimizers: fuller programs
  assert len({(t["model.name"], t["embedding.optimizer"]) for t in on}) == 30  # every pair


@pytest.mark.parametrize("key", ["model.name", "embedding.optimizer"])
def test_the_statistic_catches_rounds_resampled_inside_one_bucket(tmp_path, key):
  # Resampling inside the first trial's bucket leaves the marginals uniform in expectation
  # but trains rounds of one family and optimizer: far more clustered than free draws.
  old = _old_bucket_rounds(tmp_path / "old", seed=0)
  free, _ = _formed_rounds(tmp_path / "free", seed=1, fill=True)
  rounds = [old[i:i + ROUND] for i in range(0, NUM_TRIALS, ROUND)]
  free_rounds = [free[i:i + ROUND] for i in range(0, NUM_TRIALS, ROUND)]

  def distinct(rs):
    return np.mean([len({t[key] for t in r}) for r in rs])

  assert distinct(rounds) == 1.0 and distinct(free_rounds) > 2.5
  # Per-round counts against free rounds' (a chi-square over round x value) separate them.
  assert _round_p_value(rounds, key) < 0.01 < _round_p_value(free_rounds, key)


def _round_p_value(rounds, key):
  """Chi-square test that `key`'s values are independent of the round (free draws are)."""
  values = sorted({str(t[key]) for r in rounds for t in r})
  table = np.asarray([[sum(str(t[key]) == v for t in r) for v in values] for r in rounds])
  return stats.chi2_contingency(table)[1]


def _tiny_search(algorithm, seed, fill, num_trials=6):
  """A small search config (lr / fm, every row optimizer) with `fill_cohorts=fill`."""
  c = search_ctr.get_config("smoke")
  s = c.task.data.synthetic
  s.num_train, s.num_eval, s.cardinality_scale = 8192, 2048, 0.0001
  c.task.batch_size, c.task.eval_rows, c.task.eval_batch_size = 64, 1024, 1024
  c.task.steps_per_budget_unit = 4
  c.space.families = "lr,fm"
  c.seed = seed
  st = c.study
  st.algorithm, st.num_trials, st.cohort_width, st.fill_cohorts = algorithm, num_trials, "4", fill
  st.tpe.n_startup_trials = 2
  st.leaderboard_size = 0
  return c


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("algorithm", ["tpe", "asha"])
def test_fill_on_reaches_the_best_quality_of_fill_off(tmp_path, algorithm):
  # Mean over seeds of the best valid AUC found: fill only changes how the proposals are
  # grouped into programs (each trial as trained alone), so the search finds as well.
  best = {True: [], False: []}
  for seed in (0, 1):
    for fill in (True, False):
      summary = search_loop.run_search(_tiny_search(algorithm, seed, fill),
                                       str(tmp_path / f"{seed}_{fill}"), SPACE)
      assert summary["num_trials_done"] == 6
      best[fill].append(summary["best_metrics"]["auc"])
  assert np.mean(best[True]) >= np.mean(best[False]) - 0.005, best


def _family_or_blocks(config):
  """A trial's named model, or the block combination of a generated one (the default space)."""
  if "model.name" in config:
    return config["model.name"]
  used = sorted(k for k, v in config.items() if k.endswith(".use") and v is True)
  return (config["model.combine"], *used)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_smoke_search_tries_several_families_and_row_optimizers(tmp_path):
  """`experiments.search --config=experiments/configs/search_ctr.py:smoke` (16 trials):
  >= 3 model families or block combinations (the smoke searches generated models since
  issue #26 item 3) and >= 3 embedding optimizers (before issue #26: 1 and 1)."""
  workdir = tmp_path / "smoke"
  subprocess.run([sys.executable, "-m", "experiments.search",
                  "--config=experiments/configs/search_ctr.py:smoke", f"--workdir={workdir}"],
                 cwd=ROOT, env=dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=""),
                 check=True, capture_output=True, timeout=800)
  with open(workdir / "trials.jsonl", encoding="utf-8") as f:
    trials = [json.loads(line) for line in f if line.strip()]
  fresh = [t for t in trials if t["status"] in ("done", "failed")]
  assert len({_family_or_blocks(t["config"]) for t in fresh}) >= 3
  assert len({t["config"]["embedding.optimizer"] for t in fresh}) >= 3
