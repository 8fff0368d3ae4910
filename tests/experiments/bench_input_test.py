"""Smoke run of experiments/bench_input.py: text vs binary input rates on a tiny file."""

import math


def test_bench_input_smoke(run_bench):
  final = run_bench("experiments.bench_input", "--rows=3000", "--eval_rows=200",
                    "--batch_size=256", "--rows_per_shard=1000", "--shuffle_buffer=512",
                    "--binary_examples=20000", "--repeats=2", "--hash_rows=1000")
  assert final["benchmark"] == "bench_input" and final["num_shards"] == 3
  assert final["binary_examples"] == 20000 // 256 * 256
  for key in ("text_lines_per_s", "preprocess_lines_per_s", "binary_examples_per_s",
              "binary_shuffled_examples_per_s", "reader_examples_per_s"):
    assert math.isfinite(final[key]) and final[key] > 0, key
  assert all(len(v) == 2 for v in final["runs"].values())
  # 26 int32 ids + 13 float32 dense + a float32 label, plus .npy headers.
  assert 160 <= final["shard_bytes_per_example"] < 161
  assert math.isclose(final["speedup_vs_text"],
                      final["binary_examples_per_s"] / final["text_lines_per_s"])
