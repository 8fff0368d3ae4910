"""Smoke runs of experiments/bench_train.py on both embedding backends (tiny sizes)."""

import math
import os

import pytest

# 4 fields x 16 examples: at most 64 unique ids per batch, so unique capacity 64 is
# enough and a cache of 130 rows passes the lookahead 2 x 64 = 128 start-up check.
_TINY = ["--batch_size=16", "--rows_per_field=100", "--num_fields=4", "--embed_dim=4",
         "--steps=4", "--warmup=2", "--unique_capacity=64", "--distinct_batches=12"]


def _check_run(run):
  for key in ("examples_per_sec", "device_step_ms", "device_examples_per_sec", "compile_s"):
    assert math.isfinite(run[key]) and run[key] > 0, (key, run[key])
  # The device-bound rate is derived from the median waited step time.
  assert math.isclose(run["device_examples_per_sec"], 16 / (run["device_step_ms"] * 1e-3),
                      rel_tol=1e-9)
  assert 4 <= run["mean_unique_per_batch"] <= 64  # >= one id per field, <= B x F
  assert math.isfinite(run["final_loss"]) and run["final_loss"] > 0


def _check_common(final, backend):
  assert final["benchmark"] == "bench_train" and final["backend"] == backend
  assert (final["batch_size"], final["num_fields"], final["rows_per_field"], final["embed_dim"]) == (
      16, 4, 100, 4)
  assert final["timed_steps"] == 4 and final["model"] == "deepfm"
  assert final["devices"] == 1 and final["platform"] == "cpu"
  _check_run(final)
  assert final["median_step_ms"] == final["device_step_ms"]


def _check_cache(cache, cache_rows):
  assert cache["cache_rows"] == cache_rows  # --cache_rows > 1 is a row count, not a fraction
  assert cache["table_to_cache_ratio"] == 400 / cache_rows
  assert 0.0 <= cache["cache_hit_rate"] <= 1.0
  # 4 pipelined steps of ~47 unique ids out of 400 rows overflow 130 slots: rows travel
  # both ways, and the swap buffers hold at least the misses.
  assert cache["h2d_bytes_per_example"] > 0 and cache["d2h_bytes_per_example"] > 0
  assert cache["swap_rows_per_step"] >= cache["misses_per_step"] > 0
  assert set(cache["stage_seconds"]) == {"loader_seconds", "manager_seconds",
                                         "manager_wait_seconds", "writeback_seconds",
                                         "device_wait_seconds"}
  assert all(math.isfinite(v) and v >= 0 for v in cache["stage_seconds"].values())


def test_device_backend_with_profile(run_bench):
  final = run_bench("experiments.bench_train", *_TINY, "--backend=device", "--profile")
  _check_common(final, "device")
  assert "cache" not in final and "cache_rows" not in final
  assert final["distinct_batches"] == 12 and final["fresh_batches"]  # 12 >= 1 + 2 + 2 x 4 steps
  assert final["embedding_optimizer"] == "rowwise_adagrad"  # the default, as TorchRec's
  assert final["state_bytes_per_row"] == 4 * (5 + 1)  # E = 4 + 1 values, one accumulator per row
  assert set(final["profile"]) == {"gather_ms", "forward_ms", "forward_backward_ms",
                                   "dense_optimizer_ms", "row_update_ms"}
  for key, ms in final["profile"].items():
    assert math.isfinite(ms) and ms > 0, (key, ms)


def test_both_backends_on_fresh_batches(run_bench):
  tiny = [f for f in _TINY if not f.startswith("--distinct_batches")]
  final = run_bench("experiments.bench_train", *tiny, "--backend=both", "--cache_rows=130",
                    "--repeats=2")
  _check_common(final, "both")
  assert final["fresh_batches"] and final["distinct_batches"] == 1 + 2 + 2 * 4
  runs = final["runs"]
  assert set(runs) == {"device", "cache"}
  for run in runs.values():
    _check_run(run)
  # Two interleaved rounds: the figures are medians over rounds, `runs` is the last one.
  rounds = final["rounds"]
  assert final["repeats"] == len(rounds) == 2 and runs == {k: rounds[-1][k] for k in runs}
  assert math.isclose(final["examples_per_sec"],
                      (rounds[0]["device"]["examples_per_sec"] + rounds[1]["device"]["examples_per_sec"]) / 2)
  for r in rounds:
    assert math.isclose(r["cache_to_device_ratio"],
                        r["cache"]["examples_per_sec"] / r["device"]["examples_per_sec"])
  assert math.isclose(final["cache_to_device_ratio"],
                      (rounds[0]["cache_to_device_ratio"] + rounds[1]["cache_to_device_ratio"]) / 2)
  assert "cache" not in runs["device"]
  _check_cache(runs["cache"]["cache"], 130)


def test_cache_backend(run_bench):
  final = run_bench("experiments.bench_train", *_TINY, "--backend=cache", "--cache_rows=130")
  _check_common(final, "cache")
  assert final["cache_rows"] == 130
  assert "profile" not in final
  _check_cache(final["cache"], 130)


_FLOOR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                      os.pardir, "shared", "bench", "bare_jax_deepfm.py")


@pytest.mark.skipif(not os.path.exists(_FLOOR), reason="../shared/bench/bare_jax_deepfm.py absent")
def test_floor_is_interleaved_with_the_device_step(run_bench):
  final = run_bench("experiments.bench_train", *_TINY, "--backend=device", f"--floor={_FLOOR}")
  _check_common(final, "device")
  assert final["floor"]["probe"] == "bare_jax_deepfm" and final["floor"]["examples_per_sec"] > 0
  inter = final["floor_interleaved"]
  assert inter["step_ms"] > 0 and inter["floor_step_ms"] > 0
  assert math.isclose(final["step_to_floor_ratio"], inter["floor_step_ms"] / inter["step_ms"])
