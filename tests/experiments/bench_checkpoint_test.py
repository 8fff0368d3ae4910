"""Smoke run of experiments/bench_checkpoint.py: a base then a row-delta save of a small table."""

import math


def test_bench_checkpoint_smoke(tmp_path, run_bench):
  scratch = tmp_path / "scratch"
  final = run_bench("experiments.bench_checkpoint", f"--dir={scratch}", "--rows=300000",
                    "--width=4", "--steps=20", "--more_steps=1", "--batch_rows=256", "--zipf=1.1",
                    "--concurrent_steps=3")
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
  assert final["incremental_save_stall_seconds"] <= final["incremental_save_seconds"]
  assert not scratch.exists()  # removed unless --keep_files
