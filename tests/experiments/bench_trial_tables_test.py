"""experiments/bench_trial_tables.py at smoke size: both modes run (each point in its own
subprocess, for its own peak RSS), touched rows are fewer."""

import pytest

from experiments import bench_trial_tables
from experiments.configs import bench_trial_tables as bench_config
from sfjax.core.errors import ConfigError


def test_bench_trial_tables_smoke():
  final = bench_trial_tables.run(bench_config.get_config("smoke"))
  assert final["benchmark"] == "bench_trial_tables" and final["trials"] == 2
  points = final["points"]
  assert len(points) == 2 and all(p["ran"] and p["failed"] == 0 for p in points), points
  for p in points:
    if p["compact_rows"]:
      assert p["trial_rows"] < p["full_rows"]  # only the rows the batches touch
    else:
      assert p["trial_rows"] == p["full_rows"] and p["estimate_gb"] > 0
    assert p["peak_rss_gb"] > 0 and 0 < p["mean_auc"] < 1 and p["trials"] == 2
  biggest = max(p["full_rows"] for p in points)
  assert final["largest_table_rows"] == {"full_tables": biggest, "touched_rows": biggest}


def test_a_point_that_would_not_fit_is_reported_not_run():
  config = bench_config.get_config("smoke")
  config.memory_fraction = 0.0  # no full-table estimate fits
  point = bench_trial_tables.measure(config, 0.001, compact=False)
  assert not point["ran"] and point["reason"].startswith("needs ~")


@pytest.mark.parametrize("field,value", [("scales", ()), ("scales", (0.0, 1.0)), ("trials", 0)])
def test_bad_scales_or_trials_are_named(field, value):
  config = bench_config.get_config("smoke")
  config[field] = value
  with pytest.raises(ConfigError, match=f"config field {field}:"):
    bench_trial_tables.run(config)
