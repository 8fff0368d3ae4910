"""experiments/bench_host_cohort.py at smoke size: every width trains, rows move the same bytes
per trial, the shared table puts fewer bytes per trial than separate runs."""

import pytest

from experiments import bench_host_cohort
from experiments.configs import bench_host_cohort as bench_config
from sfjax.core.errors import ConfigError


@pytest.mark.slow  # ~6 s on 2 cores (two widths compile)
def test_bench_host_cohort_smoke():
  final = bench_host_cohort.run(bench_config.get_config("smoke"))
  assert final["benchmark"] == "bench_host_cohort"
  assert final["table_rows"] >= 10 * final["cache_rows"]
  separate, shared = final["points"]
  assert (separate["width"], shared["width"]) == (1, 2)
  assert all(p["failed"] == 0 and 0 < p["mean_auc"] < 1 for p in final["points"])
  assert shared["h2d_bytes_vs_separate"] == 1.0 and separate["h2d_bytes_per_trial"] > 0
  assert shared["put_bytes_vs_separate"] < 1.0


@pytest.mark.parametrize("field,value", [("widths", ()), ("widths", (0, 2)), ("steps", 0)])
def test_bad_widths_or_steps_are_named(field, value):
  config = bench_config.get_config("smoke")
  config[field] = value
  with pytest.raises(ConfigError, match=f"config field {field}:"):
    bench_host_cohort.run(config)
