"""Smoke run of experiments/bench_checkpoint.py: full then incremental save of a small table."""

import math


def test_bench_checkpoint_smoke(tmp_path, run_bench):
  scratch = tmp_path / "scratch"
  final = run_bench("experiments.bench_checkpoint", f"--dir={scratch}", "--rows=300000",
                    "--width=4", "--steps=5", "--more_steps=1", "--batch_rows=256", "--zipf=1.5")
  assert final["benchmark"] == "bench_checkpoint"
  assert (final["table_rows"], final["table_chunks"]) == (300000, 5)
  assert final["restored_step"] == 6 and final["restored_rows_equal"]
  assert 0 < final["full_save_chunks"] <= 5 and final["full_save_bytes"] > 0
  # Only chunks written since the first save are new files; the others are hard links.
  assert final["incremental_save_chunks"] + final["incremental_chunks_linked"] >= \
      final["full_save_chunks"]
  assert final["incremental_save_bytes"] > 0
  for key in ("full_save_seconds", "incremental_save_seconds", "verify_seconds",
              "restore_seconds", "write_back_seconds"):
    assert math.isfinite(final[key]) and final[key] > 0, (key, final[key])
  assert not scratch.exists()  # removed unless --keep_files
