"""experiments/bench_train.py in-process at smoke size on both embedding backends, and the floor."""

import math

import jax
import pytest

from experiments import bench_train
from experiments.configs import bench_train as bench_config
from sfjax.core.errors import ConfigError


def _config(**overrides):
  # Smoke: 4 fields x 16 examples, at most 64 unique ids per batch (unique capacity 64);
  # a cache of 130 rows passes the lookahead 2 x 64 = 128 start-up check.
  config = bench_config.get_config("smoke")
  config.update(overrides)
  return config


def _check_run(run):
  for key in ("examples_per_sec", "device_step_ms", "device_examples_per_sec", "compile_s"):
    assert math.isfinite(run[key]) and run[key] > 0, (key, run[key])
  # The device-bound rate is derived from the median waited step time.
  assert math.isclose(run["device_examples_per_sec"], 16 / (run["device_step_ms"] * 1e-3),
                      rel_tol=1e-9)
  assert 4 <= run["mean_unique_per_batch"] <= 64  # >= one id per field, <= B x F
  # Waited and pipelined chunks alternate: the ratio pairs each pipelined chunk with the
  # waited one before it (step_timing_test checks the arithmetic).
  ratio = run["end_to_end_to_device_ratio"]
  assert math.isfinite(ratio) and ratio > 0
  assert math.isfinite(run["device_mean_step_ms"]) and run["device_mean_step_ms"] > 0
  assert math.isfinite(run["final_loss"]) and run["final_loss"] > 0


def _check_common(final, backend):
  assert final["benchmark"] == "bench_train" and final["backend"] == backend
  assert (final["batch_size"], final["num_fields"], final["rows_per_field"], final["embed_dim"]) == (
      16, 4, 100, 4)
  assert final["timed_steps"] == 4 and final["model"] == "deepfm"
  assert final["devices"] == jax.device_count() and final["platform"] == "cpu"
  _check_run(final)
  assert final["median_step_ms"] == final["device_step_ms"]


def _check_cache(cache, cache_rows):
  assert cache["cache_rows"] == cache_rows  # cache_rows > 1 is a row count, not a fraction
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
  cpu = cache["stage_cpu_ms_per_step"]
  assert set(cpu) == {"loader", "manager", "writeback"}
  assert cpu["loader"] > 0 and cpu["manager"] > 0 and cpu["writeback"] > 0  # every step
  assert all(math.isfinite(v) for v in cpu.values())


def test_device_backend_with_profile():
  final = bench_train.run(_config(backend="device", profile=True, distinct_batches=12))
  _check_common(final, "device")
  assert "cache" not in final and "cache_rows" not in final and "floor" not in final
  assert final["distinct_batches"] == 12 and final["fresh_batches"]  # 12 >= 1 + 2 + 2 x 4 steps
  assert final["embedding_optimizer"] == "rowwise_adagrad"  # the default, as TorchRec's
  assert final["state_bytes_per_row"] == 4 * (5 + 1)  # E = 4 + 1 values, one accumulator per row
  assert set(final["profile"]) == {"gather_ms", "forward_ms", "forward_backward_ms",
                                   "dense_optimizer_ms", "row_update_ms"}
  for key, ms in final["profile"].items():
    assert math.isfinite(ms) and ms > 0, (key, ms)


def test_the_concatenated_deepfm_layout_runs_and_is_reported():
  final = bench_train.run(_config(backend="device", split_input=False, chunk_steps=3,
                                  distinct_batches=12))
  _check_common(final, "device")
  assert final["split_input"] is False and final["chunk_steps"] == 3


def test_both_backends_on_fresh_batches():
  final = bench_train.run(_config(repeats=2))
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


def test_cache_backend():
  final = bench_train.run(_config(backend="cache", distinct_batches=12))
  _check_common(final, "cache")
  assert final["cache_rows"] == 130
  assert "profile" not in final
  _check_cache(final["cache"], 130)


@pytest.mark.slow  # both backends (~10 s)
def test_half_width_rows_run_on_both_backends():
  config = _config(embedding_optimizer="sgd")  # no slots: a row is its values
  config.embedding.dtype = "bfloat16"
  final = bench_train.run(config)
  assert final["embedding_dtype"] == "bfloat16"
  for run in final["runs"].values():
    _check_run(run)
    assert run["embedding_dtype"] == "bfloat16" and run["state_bytes_per_row"] == 2 * 5  # E = 5
  _check_cache(final["runs"]["cache"]["cache"], 130)  # (the exact halving: tests/train/half_rows_test.py)


def test_every_round_reruns_the_floor_beside_the_device_step():
  final = bench_train.run(_config(backend="device", floor=True, repeats=2, distinct_batches=12))
  _check_common(final, "device")
  rounds = final["rounds"]
  assert len(rounds) == 2
  for r in rounds:  # each round measures the floor alone and alternated with our step
    assert r["floor"]["probe"] == "floor_deepfm" and r["floor"]["examples_per_sec"] > 0
    assert r["floor"]["unique_capacity"] == final["unique_capacity"] == 64
    inter = r["floor_interleaved"]
    assert inter["step_ms"] > 0 and inter["floor_step_ms"] > 0
    assert math.isclose(inter["step_to_floor_ratio"], inter["floor_step_ms"] / inter["step_ms"])

  def mean(key):
    return (rounds[0]["floor_interleaved"][key] + rounds[1]["floor_interleaved"][key]) / 2

  assert math.isclose(final["step_to_floor_ratio"], mean("step_to_floor_ratio"))
  assert math.isclose(final["floor_interleaved"]["floor_step_ms"], mean("floor_step_ms"))
  assert math.isclose(final["floor"]["median_step_ms"],
                      (rounds[0]["floor"]["median_step_ms"] + rounds[1]["floor"]["median_step_ms"]) / 2)
  assert math.isfinite(final["floor"]["loss"]) and final["floor"]["loss"] > 0


@pytest.mark.parametrize("field,value", [("backend", "disk"), ("embedding_optimizer", "lion"),
                                         ("repeats", 0), ("chunk_steps", 0)])
def test_bad_fields_are_named(field, value):
  with pytest.raises(ConfigError, match=f"config field {field}:"):
    bench_train.run(_config(**{field: value}))


@pytest.mark.slow  # ~12 s: the planted model's calibration and two backends
def test_multihot_workload_reports_ids_unique_rows_bytes_and_both_backends():
  config = bench_config.get_config("multihot_smoke")
  final = bench_train.run(config)
  assert final["workload"] == "multihot" and final["fresh_batches"]
  assert final["id_columns"] == 292  # ctr.py:multihot's layout: 2 + 2 + 4x3 + 2x128 + 20
  # Long bags: ~100 real ids per example of 292 columns; padding is most columns.
  assert 20 < final["ids_per_example"] < 292 and 0 < final["padding_share"] < 1
  assert 0 < final["unique_rows_per_batch"] <= 16 * final["ids_per_example"] + 1
  assert final["unique_capacity"] >= final["unique_rows_per_batch"]
  # Padded unique rows [Ucap] int32 + vids and weights [B, S] + dense / labels / mask.
  expected = (4 * final["unique_capacity"] + 16 * 292 * 8 + 16 * (4 + 2) * 4) / 16
  assert final["input_bytes_per_example"] == expected
  assert set(final["runs"]) == {"device", "cache"}
  assert abs(final["runs"]["cache"]["final_loss"] - final["runs"]["device"]["final_loss"]) < 1e-4
  cache = final["runs"]["cache"]["cache"]
  assert 0 < cache["cache_hit_rate"] < 1 and cache["h2d_bytes_per_example"] > 0
  assert final["cache_to_device_ratio"] > 0


def test_multihot_refuses_the_one_hot_floor_and_unknown_workloads():
  with pytest.raises(ConfigError, match="config field floor: the plain-JAX floor is one-hot"):
    bench_train.run(_with(bench_config.get_config("multihot_smoke"), floor=True))
  with pytest.raises(ConfigError, match="config field workload: unknown 'bags'"):
    bench_train.run(_config(workload="bags"))


def _with(config, **overrides):
  config.update(overrides)
  return config
