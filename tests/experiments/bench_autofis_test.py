"""Smoke run of experiments/bench_autofis.py: the final JSON line and --out file."""


def test_bench_autofis_smoke(run_bench):
  final = run_bench("experiments.bench_autofis", "--seeds=2", "--search_steps=12", "--warmup_steps=4",
                    "--retrain_steps=4", "--batch_size=64", "--embed_dim=2", "--eval_rows=512",
                    "--cardinality_scale=1e-4", "--grda_c=0.0001", "--shares=0.5")
  assert final["benchmark"] == "bench_autofis" and final["settings"]["search_steps"] == 12
  (row,) = final["results"]
  assert row["seed"] == 2 and row["pairs"] == 325 and row["kept"] == len(row["kept_pairs"])
  truth = row["truth_0.5"]
  assert truth["pairs"] >= 1 and 0.0 <= truth["precision"] <= 1.0 and 0.0 <= truth["recall"] <= 1.0
  for name in ("kept", "random", "all", "none"):
    assert 0.4 < row[f"{name}_test_auc"] < 1.0
  assert final["mean"]["truth_0.5"]["recall"] == truth["recall"]
