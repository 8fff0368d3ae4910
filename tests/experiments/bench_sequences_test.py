"""experiments/bench_sequences.py: summaries, the smoke run's figures, the seeds check."""

import math

import pytest

from experiments import bench_sequences
from experiments.configs import bench_sequences as bench_config
from sfjax.core.errors import ConfigError


def test_summary_mean_spread_std():
  s = bench_sequences.summary([0.7, 0.8, 0.75])
  assert math.isclose(s["mean"], 0.75) and math.isclose(s["spread"], 0.1)
  assert math.isclose(s["std"], 0.05) and s["values"] == [0.7, 0.8, 0.75]
  assert bench_sequences.summary([0.5])["std"] == 0.0


def test_no_seeds_is_named():
  config = bench_config.get_config("smoke")
  config.seeds = ()
  with pytest.raises(ConfigError, match="config field seeds"):
    bench_sequences.run(config)


@pytest.mark.slow  # ~1 minute: three trainings on the smoke data
def test_smoke_compares_one_hot_only_full_deepfm_and_din_to_the_oracle():
  result = bench_sequences.run(bench_config.get_config("smoke"))
  mh = result["multihot"]
  assert mh["one_hot_features"] == "user,item,ctx0,ctx1"
  oracle = mh["oracle_test_auc"]["mean"]
  assert 0.5 < oracle <= 1
  for name in ("onehot_only", "deepfm", "din"):
    assert 0.5 < mh[name]["mean"] < oracle, (name, mh[name])
  for name in ("deepfm", "din"):  # one seed: the per-seed gap is the gap of the means
    base = mh["onehot_only"]["mean"]
    assert math.isclose(mh[name]["gap_recovered"], (mh[name]["mean"] - base) / (oracle - base))
    assert mh[name]["gap_recovered_by_seed"] == [mh[name]["gap_recovered"]]
  assert "movielens" not in result
