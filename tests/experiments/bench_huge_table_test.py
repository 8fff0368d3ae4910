"""experiments/bench_huge_table.py in-process at smoke size: a small mmap table trained through
the cache."""

import math

from experiments import bench_huge_table
from experiments.configs import bench_huge_table as bench_config


def test_bench_huge_table_smoke(tmp_path):
  host_path = tmp_path / "table"
  host_path.mkdir()
  (host_path / "stale.txt").write_text("deleted by config.overwrite")
  config = bench_config.get_config("smoke")
  config.host_path = str(host_path)
  final = bench_huge_table.run(config)
  assert final["benchmark"] == "bench_huge_table"
  assert (final["steps"], final["batch_size"], final["cache_rows"]) == (4, 32, 20000)
  rows, row_bytes = final["table_rows"], (final["row_width"] + final["slot_width"]) * 4
  assert rows > final["cache_rows"] and final["table_bytes_if_dense"] == rows * row_bytes
  # The mmap table lives under host_path, lazily: only touched rows are materialised.
  assert not (host_path / "stale.txt").exists()
  assert (host_path / "meta.json").exists() and (host_path / "values.npy").exists()
  assert 0 < final["rows_materialised"] <= min(rows, 4 * 32 * 26)
  assert final["host_table_apparent_bytes"] >= rows * row_bytes and final["host_table_disk_bytes"] > 0
  assert final["device_state_bytes"] >= final["cache_rows"] * row_bytes  # the cache is on device
  assert final["peak_rss_bytes"] > 0
  assert 0.0 <= final["cache_hit_rate"] <= 1.0 and final["evictions"] >= 0
  assert final["h2d_bytes_per_example"] > 0 and final["d2h_bytes_per_example"] >= 0
  for key in ("examples_per_sec", "wall_seconds"):
    assert math.isfinite(final[key]) and final[key] > 0, (key, final[key])
  assert 0.0 <= final["auc"] <= 1.0 and 0.0 <= final["oracle_auc"] <= 1.0
  assert set(final["stage_seconds"]) == {"loader_seconds", "manager_seconds", "manager_wait_seconds",
                                         "writeback_seconds", "device_wait_seconds"}
  assert all(math.isfinite(v) and v >= 0 for v in final["stage_seconds"].values())
