"""experiments/bench_autofis.py in-process at smoke size: kept pairs, truth, retrain AUCs."""

from experiments import bench_autofis
from experiments.configs import bench_autofis as bench_config


def test_bench_autofis_smoke():
  final = bench_autofis.run(bench_config.get_config("smoke"))
  assert final["benchmark"] == "bench_autofis" and final["settings"]["search_steps"] == 12
  assert final["settings"]["mlp_dims"] == [] and final["eval_rows"] == 512
  (row,) = final["results"]
  assert row["seed"] == 2 and row["pairs"] == 325 and row["kept"] == len(row["kept_pairs"])
  truth = row["truth_0.5"]
  assert truth["pairs"] >= 1 and 0.0 <= truth["precision"] <= 1.0 and 0.0 <= truth["recall"] <= 1.0
  for name in ("kept", "random", "all", "none"):
    assert 0.4 < row[f"{name}_test_auc"] < 1.0
  assert final["mean"]["truth_0.5"]["recall"] == truth["recall"]
  assert final["mean"]["kept_minus_random_test_auc"] == row["kept_test_auc"] - row["random_test_auc"]
