"""Smoke runs of experiments/bench_train.py on both embedding backends (tiny sizes)."""

import math

# 4 fields x 16 examples: at most 64 unique ids per batch, so unique capacity 64 is
# enough and a cache of 130 rows passes the lookahead 2 x 64 = 128 start-up check.
_TINY = ["--batch_size=16", "--rows_per_field=100", "--num_fields=4", "--embed_dim=4",
         "--steps=4", "--warmup=2", "--unique_capacity=64", "--distinct_batches=12"]


def _check_common(final, backend):
  assert final["benchmark"] == "bench_train" and final["backend"] == backend
  assert (final["batch_size"], final["num_fields"], final["rows_per_field"], final["embed_dim"]) == (
      16, 4, 100, 4)
  assert final["timed_steps"] == 4 and final["model"] == "deepfm"
  assert final["devices"] == 1 and final["platform"] == "cpu"
  for key in ("median_step_ms", "examples_per_sec", "pipelined_examples_per_sec", "compile_s"):
    assert math.isfinite(final[key]) and final[key] > 0, (key, final[key])
  # examples/s is derived from the median step time.
  assert math.isclose(final["examples_per_sec"], 16 / (final["median_step_ms"] * 1e-3), rel_tol=1e-9)
  assert 4 <= final["mean_unique_per_batch"] <= 64  # >= one id per field, <= B x F
  assert math.isfinite(final["final_loss"]) and final["final_loss"] > 0


def test_device_backend_with_profile(run_bench):
  final = run_bench("experiments.bench_train", *_TINY, "--backend=device", "--profile")
  _check_common(final, "device")
  assert "cache" not in final and "cache_rows" not in final
  assert set(final["profile"]) == {"gather_ms", "forward_ms", "forward_backward_ms",
                                   "dense_optimizer_ms", "row_update_ms"}
  for key, ms in final["profile"].items():
    assert math.isfinite(ms) and ms > 0, (key, ms)


def test_cache_backend(run_bench):
  final = run_bench("experiments.bench_train", *_TINY, "--backend=cache", "--cache_rows=130")
  _check_common(final, "cache")
  assert final["cache_rows"] == 130  # --cache_rows > 1 is a row count, not a fraction
  assert "profile" not in final
  cache = final["cache"]
  assert 0.0 <= cache["cache_hit_rate"] <= 1.0
  assert all(math.isfinite(v) and v >= 0 for v in cache.values()), cache
  # Every id is admitted once (cold misses), and 11 steps of ~47 unique ids out of
  # 400 rows overflow 130 slots, so rows travel both ways.
  assert cache["h2d_bytes_per_example"] > 0 and cache["d2h_bytes_per_example"] > 0
