"""Smoke run of experiments/bench_trial_tables.py: both modes run, touched rows are fewer."""


def test_bench_trial_tables_smoke(run_bench):
  final = run_bench("experiments.bench_trial_tables", "--trials=2", "--scales=0.001",
                    "--steps=2", "--eval_rows=256", "--batch_size=32")
  assert final["benchmark"] == "bench_trial_tables" and final["trials"] == 2
  points = final["points"]
  assert len(points) == 2 and all(p["ran"] and p["failed"] == 0 for p in points)
  for p in points:
    if p["compact_rows"]:
      assert p["trial_rows"] < p["full_rows"]  # only the rows the batches touch
    else:
      assert p["trial_rows"] == p["full_rows"] and p["estimate_gb"] > 0
    assert p["peak_rss_gb"] > 0 and 0 < p["mean_auc"] < 1
  biggest = max(p["full_rows"] for p in points)
  assert final["largest_table_rows"] == {"full_tables": biggest, "touched_rows": biggest}
