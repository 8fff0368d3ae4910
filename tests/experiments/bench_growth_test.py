"""experiments/bench_growth.py at smoke size: each point in its own subprocess."""

import math

import numpy as np
import pytest

from experiments import bench_growth
from experiments.configs import bench_growth as bench_config
from sfjax.core.errors import ConfigError
from sfjax.data import make_dataset


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_bench_growth_smoke(tmp_path):
  config = bench_config.get_config("smoke")
  config.host_dir, config.plot = str(tmp_path / "tables"), str(tmp_path / "growth.png")
  final = bench_growth.run(config)
  assert {p["sweep"] for p in final["points"]} == set(bench_growth.SWEEPS)
  for sweep in bench_growth.SWEEPS:
    pts = [p for p in final["points"] if p["sweep"] == sweep]
    assert len(pts) == 2
    for key in ("examples_per_sec", "peak_rss", "device_bytes"):
      assert math.isfinite(final[f"slope_{key}_vs_{sweep}"]), (key, sweep)
  for p in final["points"]:
    assert p["examples_per_sec"] > 0 and p["peak_rss_bytes"] > 0 and p["device_bytes"] > 0
    assert 0 <= p["hit_rate"] <= 1 and math.isfinite(p["loss"])
  rows = [p for p in final["points"] if p["sweep"] == "rows"]
  assert rows[1]["table_rows"] > 5 * rows[0]["table_rows"]  # the table really grew
  # The cache is fixed over the rows sweep: device bytes do not grow with the table.
  assert rows[0]["device_bytes"] == rows[1]["device_bytes"]
  assert (tmp_path / "growth.png").stat().st_size > 0
  assert not list((tmp_path / "tables").iterdir())  # every point's mmap table was deleted


def test_wide_dataset_repeats_fields_with_their_own_rows():
  config = bench_growth.point_config(bench_config.get_config("smoke"), 2e4, 16, 40, "/unused")
  base = make_dataset(config.data, 0)
  wide = bench_growth.WideDataset(base, 40)
  assert wide.spec.num_fields == 40 and len({f.name for f in wide.spec.fields}) == 40
  batch = next(wide.train_batches(16, 0))
  plain = next(base.train_batches(16, 0))
  assert batch.ids.shape == (16, 40)
  np.testing.assert_array_equal(batch.ids[:, :26], plain.ids)
  assert np.all(batch.ids < np.array(wide.spec.field_rows)) and np.all(batch.ids >= 0)
  assert not np.array_equal(batch.ids[:, 26:], plain.ids[:, :14])  # copies are shifted


def test_log_log_slope():
  assert bench_growth.log_log_slope([1, 10, 100], [5, 50, 500]) == pytest.approx(1.0)
  assert bench_growth.log_log_slope([1e6, 1e9], [3.0, 3.0]) == pytest.approx(0.0)
  assert math.isnan(bench_growth.log_log_slope([1], [1]))


def test_bench_growth_rejects_unknown_sweeps():
  config = bench_config.get_config("smoke")
  config.sweeps = "rows,depth"
  with pytest.raises(ConfigError, match="sweeps"):
    bench_growth.run(config)
