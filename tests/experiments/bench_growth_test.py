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
    # Timed in the steady state: the cache full and evicting, rows written to the host table.
    assert p["steady"] and p["evictions_per_step"] > 0 and p["rows_materialised"] > 0, p
  rows = [p for p in final["points"] if p["sweep"] == "rows"]
  assert rows[1]["table_rows"] > 5 * rows[0]["table_rows"]  # the table really grew
  spread = [p for p in final["points"] if p["sweep"] == "spread"]
  assert spread[1]["table_rows"] == 10 * spread[0]["table_rows"]  # the same ids, spread
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


def test_spread_dataset_maps_each_fields_ids_one_to_one_into_a_larger_table():
  config = bench_growth.point_config(bench_config.get_config("smoke"), 2e4, 64, 26, "/unused")
  base = make_dataset(config.data, 0)
  spread = bench_growth.SpreadDataset(base, 7)
  assert spread.spec.field_rows == tuple(7 * n for n in base.spec.field_rows)
  plain, wide = next(base.train_batches(64, 0)), next(spread.train_batches(64, 0))
  np.testing.assert_array_equal(wide.labels, plain.labels)
  assert np.all(wide.ids >= 0) and np.all(wide.ids < np.array(spread.spec.field_rows))
  assert np.array_equal(wide.ids // 7, plain.ids)  # one to one: the row block is the id
  for f in range(plain.ids.shape[1]):  # equal ids stay equal, distinct stay distinct
    same = plain.ids[:, f, None] == plain.ids[None, :, f]
    np.testing.assert_array_equal(same, wide.ids[:, f, None] == wide.ids[None, :, f])
  assert len(np.unique(wide.ids % 7)) > 1  # rows inside a block differ: not a plain stride
  eval_plain = next(base.eval_batches("eval", 64))
  eval_wide = next(spread.eval_batches("eval", 64))
  np.testing.assert_array_equal(eval_wide.ids // 7, eval_plain.ids)


def test_log_log_slope():
  assert bench_growth.log_log_slope([1, 10, 100], [5, 50, 500]) == pytest.approx(1.0)
  assert bench_growth.log_log_slope([1e6, 1e9], [3.0, 3.0]) == pytest.approx(0.0)
  assert math.isnan(bench_growth.log_log_slope([1], [1]))


def test_bench_growth_rejects_unknown_sweeps():
  config = bench_config.get_config("smoke")
  config.sweeps = "rows,depth"
  with pytest.raises(ConfigError, match="sweeps"):
    bench_growth.run(config)


def test_window_counters_are_the_differences_over_the_window():
  before = {"unique_ids": 100, "hits": 40, "evictions": 5, "h2d_rows": 60, "d2h_rows": 5,
            "loader_cpu_seconds": 1.0, "manager_cpu_seconds": 2.0, "writeback_cpu_seconds": 0.5,
            "page_faults": 1000, "row_bytes": 72, "steps_per_shape": {"U1/F1": 3}}
  after = {"unique_ids": 300, "hits": 190, "evictions": 45, "h2d_rows": 110, "d2h_rows": 45,
           "loader_cpu_seconds": 1.5, "manager_cpu_seconds": 2.2, "writeback_cpu_seconds": 0.9,
           "page_faults": 1400, "row_bytes": 72, "steps_per_shape": {"U1/F1": 6, "U2/F1": 1}}
  got = bench_growth._window_counters(before, after, steps=4, examples=64)
  assert got["hit_rate"] == pytest.approx(150 / 200)
  assert got["evictions_per_step"] == pytest.approx(10.0)
  assert got["h2d_bytes_per_example"] == pytest.approx(50 * 72 / 64)
  assert got["d2h_bytes_per_example"] == pytest.approx(40 * 72 / 64)
  assert got["host_cpu_ms_per_step"] == pytest.approx(
      {"loader": 125.0, "manager": 50.0, "writeback": 100.0})
  assert got["page_faults_per_step"] == pytest.approx(100.0)
  assert got["window_compiled_shapes"] == 1


def test_a_point_is_timed_with_its_cache_full_and_evicting(tmp_path):
  """The warm-up runs until the cache evicts and nothing new compiles: the timed window
  reads rows from the host table and writes rows back (a filling cache would do neither)."""
  config = bench_config.get_config("smoke")
  config.host_dir = str(tmp_path)
  point = bench_growth.sweep_points(config, "rows")[0]
  got = bench_growth.measure_point(config, point)
  assert got["steady"] and got["window_compiled_shapes"] == 0
  assert got["warmup_steps"] >= config.warmup_steps
  assert got["warmup_steps"] % config.warmup_chunk == 0
  assert got["evictions_per_step"] > 0 and got["d2h_bytes_per_example"] > 0
  assert got["rows_materialised"] > 0  # evicted rows were written to the mmap host table
  assert 0 < got["hit_rate"] < 1
  assert set(got["host_cpu_ms_per_step"]) == {"loader", "manager", "writeback"}
  # With too few warm-up steps allowed, the point says it was not steady.
  config.max_warmup_steps = config.warmup_steps = config.warmup_chunk = 1
  short = bench_growth.measure_point(config, point)
  assert not short["steady"] and short["warmup_steps"] == 1
