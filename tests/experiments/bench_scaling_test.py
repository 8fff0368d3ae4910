"""experiments/bench_scaling.py in-process at smoke size on 2 of the fake CPU devices, both cache
shardings, VSI on/off; its per-process jobs (1 and 2 local `jax.distributed` processes,
slow) and the cost model's check and projection on hand-made figures (fast)."""

import math
import time

import jax
import pytest

from experiments import bench_scaling, scaling_processes, scaling_projection
from experiments.configs import bench_scaling as bench_config
from sfjax.core.errors import ConfigError


def _in_process_smoke():
  config = bench_config.get_config("smoke")
  config.processes = ()  # the per-process jobs: the slow test below
  return config


def test_bench_scaling_smoke():
  final = bench_scaling.run(_in_process_smoke())
  assert "processes" not in final
  assert final["benchmark"] == "bench_scaling" and final["platform"] == "cpu"
  assert final["devices_visible"] == jax.local_device_count() and not final["skipped"]
  runs = {(r["cache_sharding"], r["vsi"]): r for r in final["results"]}
  assert set(runs) == {(s, v) for s in ("replicated", "row") for v in ("on", "off")}
  b_f = 32 * final["num_fields"]
  per_device = 2 * b_f  # default cache_rows: lookahead x B x F
  for (sharding, vsi), r in runs.items():
    assert r["devices"] == 2 and r["cache_rows_per_device"] == per_device
    assert r["cache_capacity_rows"] == per_device * (2 if sharding == "row" else 1)
    # Same data, same math: every layout trains to the first run's losses and table.
    assert r["max_loss_diff"] < 1e-5 and r["max_table_diff"] < 1e-5, r
    assert math.isfinite(r["examples_per_sec"]) and r["examples_per_sec"] > 0
    assert r["h2d_bytes_per_step"] > 0 and 0 <= r["cache_hit_rate"] <= 1
    assert r["collective_ring_bytes_per_step"] > 0
    if vsi == "off":  # one row per id occurrence (row-sharded: per-owner blocks >= B*F / 2)
      assert r["mean_exchanged_rows_per_step"] == b_f if sharding == "replicated" else (
          b_f <= r["mean_exchanged_rows_per_step"] <= 2 * b_f)
    else:
      assert r["mean_unique_per_step"] <= r["mean_exchanged_rows_per_step"] <= b_f
  for sharding in ("replicated", "row"):  # VSI cuts the exchanged rows and their bytes
    on, off = runs[(sharding, "on")], runs[(sharding, "off")]
    assert on["collective_ring_bytes_per_step"] < off["collective_ring_bytes_per_step"]
  # Row-sharded: owner blocks (all_gather + reduce-scatter) move fewer bytes than an
  # owner-masked psum lookup + all-reduced gradient would on the same steps, and each
  # device receives only its own fills (less host->device traffic than replicated swaps).
  row, rep = runs[("row", "on")], runs[("replicated", "on")]
  exchange = row["exchange"]
  assert 0 < exchange["owner_blocks_allgather_reducescatter_ring_bytes_per_step"] < (
      exchange["psum_lookup_allreduce_grad_ring_bytes_per_step"])
  assert row["h2d_bytes_per_step"] < rep["h2d_bytes_per_step"]


def test_device_counts_beyond_the_visible_ones_are_skipped():
  config = _in_process_smoke()
  config.devices, config.shardings, config.vsi = (1, 64), "replicated", "on"
  final = bench_scaling.run(config)
  assert [(r["devices"], r["max_loss_diff"], r["max_table_diff"]) for r in final["results"]] == [
      (1, 0.0, 0.0)]
  (skip,) = final["skipped"]
  assert skip["devices"] == 64 and "devices visible" in skip["reason"]


@pytest.mark.parametrize("field,value", [("shardings", "replicated,column"), ("vsi", "maybe"),
                                         ("devices", ()), ("processes", (1, 3)),
                                         ("processes", (2,)), ("project_devices", (0,))])
def test_bad_layout_fields_are_named(field, value):
  config = _in_process_smoke()
  config[field] = value
  with pytest.raises(ConfigError, match=f"config field {field}:"):
    bench_scaling.run(config)


def _row(processes, batch=64, devices=4, step=0.01, rate=1e6):
  """A measured row as `scaling_projection.measure_processes` makes it (hand-made)."""
  proc = {"flops_per_device": 2e6, "bytes_accessed_per_device": 1e6, "example_bytes": 100.0,
          "allreduce_sizes": [1e5, 1e6], "exchange_sizes": [1e4, 1e6],
          # one process: 4 devices at 1e9 B/s, no latency: 2 * 3/4 * S / 1e9
          "allreduce_seconds": [1.5e-4, 1.5e-3] if processes == 1 else [5e-4, 5e-3],
          "exchange_seconds": [1e-3, 4e-2], "collective_counts": {}}
  return {"processes": processes, "devices": devices, "local_devices": devices // processes,
          "batch_size": batch, "examples_per_sec": batch / step, "device_step_seconds": step,
          "read_examples_per_sec_per_process": rate, "input_examples_per_sec_per_process": rate,
          "collective_all_reduce_bytes_per_step": 4e5,
          "collective_all_gather_bytes_per_step": 6.4e4,
          "collective_reduce_scatter_bytes_per_step": 6.4e4, "per_process": [proc]}


def test_model_check_calibrates_on_one_process():
  rows = [_row(1), _row(2, step=0.02)]
  check, profile, calibrated = scaling_projection.model_check(rows)
  assert profile.per_device_batch == 16 and profile.per_example_collectives == {
      "all-gather": 1000.0, "reduce-scatter": 1000.0}
  # The 1-process device step is the measured one; the input (64 / 1e6 s) adds to it (the
  # local model: input and fake devices share the cores).
  assert check[0]["predicted_device_step_s"] == pytest.approx(0.01)
  assert check[0]["ratio"] == pytest.approx(0.01 / (0.01 + 64e-6))
  # intra link fitted: 1e9 B/s; collectives 2*.75*4e5 + 2*.75*6.4e4 (AG + RS) / 1e9
  coll = (1.5 * 4e5 + 2 * 0.75 * 6.4e4) / 1e9
  assert check[0]["predicted_collectives_s"] == pytest.approx(coll)
  assert calibrated.device_flops == pytest.approx(2e6 / (0.01 - coll))
  # Two processes of 2 devices: the inter-process link and the key-value store come from
  # the row's own timings: 2^2 x 1e6 bytes in 4e-2 s.
  assert check[1]["coordinator_bytes_per_s"] == pytest.approx(1e8)
  assert check[1]["predicted_collectives_s"] > check[0]["predicted_collectives_s"]
  assert check[1]["predicted_input_s"] == pytest.approx(32 / 1e6 + 2 * 64 * 100 / 1e8)


def test_a_link_latency_longer_than_the_step_is_dropped_and_its_bandwidth_kept():
  fine = _row(1)
  assert scaling_projection.model_check([fine])[0][0]["intra_link_latency_dropped"] is False
  slow_calls = _row(1)  # 4 devices: the fit gives 1e9 B/s and 2e-3 s a hop (12 ms a call)
  slow_calls["per_process"][0]["allreduce_seconds"] = [1.215e-2, 1.35e-2]
  (check,), _, calibrated = scaling_projection.model_check([slow_calls])
  assert check["intra_link_latency_dropped"] is True and check["intra_link_latency_s"] == 0.0
  assert check["intra_link_bytes_per_s"] == pytest.approx(1e9)
  coll = (1.5 * 4e5 + 2 * 0.75 * 6.4e4) / 1e9  # bandwidth only
  assert check["predicted_collectives_s"] == pytest.approx(coll)
  assert check["predicted_device_step_s"] == pytest.approx(0.01)
  assert calibrated.device_flops == pytest.approx(2e6 / (0.01 - coll))


def test_projection_is_input_or_device_bound():
  _, profile, _ = scaling_projection.model_check([_row(1)])
  fast, slow = (scaling_projection.project(profile, (8, 64), rate, 1e12) for rate in (1e12, 1e3))
  for r in fast + slow:
    assert r["examples_per_sec"] <= r["device_only_examples_per_sec"] * (1 + 1e-9)
  assert [r["bound"] for r in fast] == ["device", "device"]
  assert [r["bound"] for r in slow] == ["input", "input"]
  assert [(r["devices"], r["nodes"], r["global_batch"]) for r in fast] == [(8, 1, 128),
                                                                           (64, 8, 1024)]
  # 64 GPUs add InfiniBand to the collectives: a longer device step than 8.
  assert fast[1]["collectives_s"] > fast[0]["collectives_s"]


@pytest.mark.slow  # starts two processes (killed after 1 s)
@pytest.mark.timeout(60)
def test_a_job_past_its_timeout_is_killed_and_named():
  payload = {"config": {}, "timeout_s": 1.0, "bench": {}}
  t = time.time()
  with pytest.raises(RuntimeError, match=r"processes \[0, 1\] of 2 still ran after 1 s"):
    scaling_processes.launch(payload, 2, 1, timeout_s=1.0)
  assert time.time() - t < 30


@pytest.mark.slow  # two process start-ups per job; ~100 s on a busy 2-core machine
@pytest.mark.timeout(600)
def test_per_process_jobs_smoke(tmp_path):
  config = bench_config.get_config("smoke")
  config.devices, config.shardings, config.vsi = (1,), "replicated", "on"
  config.plot = str(tmp_path / "scaling.png")
  final = bench_scaling.run(config)
  assert (tmp_path / "scaling.png").stat().st_size > 0
  one, two = final["processes"]
  assert (one["processes"], two["processes"]) == (1, 2)
  assert (one["local_devices"], two["local_devices"]) == (2, 1)
  for row in (one, two):
    # row-sharded table: 2 devices hold (at least) the whole table, half each
    assert row["table_capacity_rows"] == 2 * row["table_rows_per_device"] >= row["table_rows"]
    assert row["examples_per_sec"] > 0 and row["input_examples_per_sec_per_process"] > 0
    assert row["collective_all_gather_bytes_per_step"] > 0
    assert row["collective_reduce_scatter_bytes_per_step"] > 0
    assert row["collective_all_reduce_bytes_per_step"] > 0
    assert row["max_loss_diff"] < 1e-5  # each process read half: the same global batches
  assert one["host_exchange_bytes_per_step"] == 0 < two["host_exchange_bytes_per_step"]
  assert [c["processes"] for c in final["model_check"]] == [1, 2]
  assert all(math.isfinite(c["ratio"]) and c["ratio"] > 0 for c in final["model_check"])
  assert [p["devices"] for p in final["projection"]] == [8, 64]


@pytest.mark.slow  # starts a process
@pytest.mark.timeout(120)
def test_a_failing_process_is_named_with_its_log():
  payload = {"config": {}, "timeout_s": 30.0, "bench": {}}  # no link sizes: a KeyError
  with pytest.raises(RuntimeError,
                     match=r"process 0 of 1 exited with 1:\n(.|\n)*KeyError: 'allreduce_sizes'"):
    scaling_processes.launch(payload, 1, 1, timeout_s=100)
