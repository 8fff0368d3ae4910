"""experiments/bench_checkpoint.py in-process at smoke size: a base then a row-delta save of a
small table."""

import math

from experiments import bench_checkpoint
from experiments.configs import bench_checkpoint as bench_config


def test_bench_checkpoint_smoke(tmp_path):
  scratch = tmp_path / "scratch"
  config = bench_config.get_config("smoke")
  config.dir = str(scratch)
  final = bench_checkpoint.run(config)
  assert final["benchmark"] == "bench_checkpoint"
  assert (final["table_rows"], final["table_chunks"]) == (300000, 5)
  assert final["restored_step"] == 21 and final["restored_rows_equal"]
  assert final["full_save_kind"] == "base" and final["full_save_bytes"] > 0
  # The increment holds the rows written since the base, far less than their chunks.
  assert final["incremental_save_kind"] == "delta"
  assert 0 < final["incremental_save_rows"] <= 256
  assert 0 < final["incremental_table_bytes"] < final["chunk_increment_bytes_equivalent"]
  assert final["incremental_table_bytes"] <= final["incremental_save_bytes"]
  for key in ("full_save_seconds", "incremental_save_seconds", "verify_seconds",
              "restore_seconds", "write_back_seconds", "incremental_save_stall_seconds"):
    assert math.isfinite(final[key]) and final[key] > 0, (key, final[key])
  assert final["concurrent_write_backs"] == 3
  assert not scratch.exists()  # removed unless keep_files


def test_keep_files_keeps_the_table_and_checkpoints(tmp_path):
  config = bench_config.get_config("smoke")
  config.dir, config.keep_files, config.steps = str(tmp_path / "kept"), True, 2
  final = bench_checkpoint.run(config)
  assert final["restored_step"] == 3 and final["restored_rows_equal"]
  assert (tmp_path / "kept" / "table").is_dir() and (tmp_path / "kept" / "checkpoints").is_dir()
